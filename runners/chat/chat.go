// Package chat renders a model's own Jinja chat template (HF
// tokenizer_config.json "chat_template", chat_template.jinja, or GGUF
// tokenizer.chat_template) into the prompt text, the way HF transformers'
// apply_chat_template does: trim_blocks and lstrip_blocks on, bos_token /
// eos_token / add_generation_prompt in scope, raise_exception() failing the
// render, tojson as Python's json.dumps(ensure_ascii=False).
//
// It uses github.com/nikolalohinski/gonja/v2 as the Jinja engine, with a
// private environment per template (no global state) and the fixes in
// compat.go where gonja departs from Jinja; a panic inside gonja becomes an
// error. It also owns the chat formats (format.go: how a model writes
// tool calls and reasoning, one file per format), which it detects from
// the template. It owns no tokenization (runners/tokenizer) and no HTTP
// types (runners/openai).
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine/weights"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// ErrNoTemplate is returned (wrapped) when a model has no chat template.
var ErrNoTemplate = errors.New("chat: model has no chat template")

// Message is one conversation turn. An assistant turn may carry ToolCalls
// (its content is then often ""); a "tool" turn answers one by ToolCallID.
// They are rendered as HF transformers passes OpenAI-style messages:
// message.tool_calls[i] = {"id", "type": "function", "function": {"name",
// "arguments"}} with arguments parsed into an object when it is JSON (as
// vLLM does, since templates apply tojson to it), message.tool_call_id and
// message.name when set. Reasoning (OpenAI's reasoning_content of an
// earlier answer) is passed, when set, both as message.reasoning_content
// (Qwen3's templates read it) and as message.thinking (gpt-oss's); the
// template decides which turns keep it (see HistoryReasoning).
type Message struct {
	Role, Content string
	Reasoning     string
	ToolCalls     []ToolCall
	ToolCallID    string
	Name          string
}

// ToolCall is one function call of an assistant turn; Arguments is JSON
// text.
type ToolCall struct{ ID, Name, Arguments string }

func (m Message) templateValue() map[string]any {
	v := map[string]any{"role": m.Role, "content": m.Content}
	if len(m.ToolCalls) > 0 {
		calls := make(pyList, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			var args any = c.Arguments
			var obj map[string]any
			if json.Unmarshal([]byte(c.Arguments), &obj) == nil && obj != nil {
				args = obj
			}
			calls[i] = map[string]any{"id": c.ID, "type": "function",
				"function": map[string]any{"name": c.Name, "arguments": args}}
		}
		v["tool_calls"] = calls
	}
	if m.Reasoning != "" {
		v["reasoning_content"] = m.Reasoning
		v["thinking"] = m.Reasoning
	}
	if m.ToolCallID != "" {
		v["tool_call_id"] = m.ToolCallID
	}
	if m.Name != "" {
		v["name"] = m.Name
	}
	return v
}

// Template is a parsed chat template. It is safe for concurrent use.
type Template struct {
	src      string
	bos, eos string
	mu       sync.Mutex // gonja's evaluator is not documented as reentrant
	tpl      *exec.Template
	now      func() time.Time
}

// Load reads the chat template of a model directory (tokenizer_config.json's
// chat_template, a string or a list of named templates of which "default"
// is used; else chat_template.jinja), a tokenizer_config.json file, or a
// .gguf file (tokenizer.chat_template).
func Load(path string) (*Template, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	if !st.IsDir() && (strings.HasSuffix(strings.ToLower(path), ".gguf") || weights.IsGGUF(path)) {
		t, err := loadGGUF(path)
		if err != nil {
			return nil, fmt.Errorf("chat: %s: %w", path, err)
		}
		return t, nil
	}
	dir := path
	if !st.IsDir() {
		dir = filepath.Dir(path)
	}
	t, err := loadHF(dir)
	if err != nil {
		return nil, fmt.Errorf("chat: %s: %w", dir, err)
	}
	return t, nil
}

func loadHF(dir string) (*Template, error) {
	var cfg struct {
		ChatTemplate json.RawMessage       `json:"chat_template"`
		BOS          tokenizer.TokenString `json:"bos_token"`
		EOS          tokenizer.TokenString `json:"eos_token"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err == nil {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("parse tokenizer_config.json: %w", err)
		}
	}
	src, err := pickTemplate(cfg.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("tokenizer_config.json chat_template: %w", err)
	}
	if src == "" {
		j, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, ErrNoTemplate
		}
		if err != nil {
			return nil, err
		}
		src = string(j)
	}
	return Parse(src, string(cfg.BOS), string(cfg.EOS))
}

// pickTemplate returns the template from chat_template's string form or
// the "default" entry (else the first) of its list form.
func pickTemplate(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []struct{ Name, Template string }
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", errors.New("neither a string nor a list of {name, template}")
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
	}
	if len(list) > 0 {
		return list[0].Template, nil
	}
	return "", nil
}

func loadGGUF(path string) (*Template, error) {
	g, err := weights.OpenGGUF(path)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	src, ok := g.String("tokenizer.chat_template")
	if !ok || src == "" {
		return nil, ErrNoTemplate
	}
	tokens, _ := g.Strings("tokenizer.ggml.tokens")
	tok := func(key string) string {
		if id, ok := g.Uint(key); ok && id < uint64(len(tokens)) {
			return tokens[id]
		}
		return ""
	}
	return Parse(src, tok("tokenizer.ggml.bos_token_id"), tok("tokenizer.ggml.eos_token_id"))
}

// Parse compiles a Jinja chat template; bos and eos are the texts bound to
// bos_token and eos_token.
func Parse(src, bos, eos string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("chat: parse template: panic in the Jinja engine: %v", r)
		}
	}()
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = false // done by lstripBlocks, the way Jinja does it
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", filterToJSON); err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	env := &exec.Environment{
		Context:           exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables),
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           methods(),
	}
	loader, err := loaders.NewMemoryLoader(map[string]string{"/chat_template": hoistConditionals(lstripBlocks(src))})
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	tpl, err := exec.NewTemplate("/chat_template", cfg, loader, env)
	if err != nil {
		return nil, fmt.Errorf("chat: parse template: %w", err)
	}
	return &Template{src: src, bos: bos, eos: eos, tpl: tpl, now: time.Now}, nil
}

// HistoryReasoning reports whether the template reads an assistant
// message's reasoning (message.reasoning_content as Qwen3's do, or
// message.thinking as gpt-oss's does); for any other, a message's
// Reasoning would silently vanish, so callers refuse it.
func (t *Template) HistoryReasoning() bool {
	return strings.Contains(t.src, "reasoning_content") || strings.Contains(t.src, ".thinking") ||
		strings.Contains(t.src, "['thinking']") || strings.Contains(t.src, `["thinking"]`)
}

// Source returns the template text.
func (t *Template) Source() string { return t.src }

// Render renders msgs; addGenerationPrompt appends the opening of the
// assistant's turn.
func (t *Template) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderVars(msgs, addGenerationPrompt, nil)
}

// RenderVars is Render with extra template variables (HF's
// apply_chat_template keyword arguments, e.g. {"enable_thinking": false}
// for Qwen3); they cannot replace messages, add_generation_prompt or the
// special-token names.
func (t *Template) RenderVars(msgs []Message, addGenerationPrompt bool, vars map[string]any) (out string, err error) {
	list := make(pyList, len(msgs))
	for i, m := range msgs {
		list[i] = m.templateValue()
	}
	data := map[string]any{"tools": nil, "documents": nil} // HF passes tools=None, documents=None
	for k, v := range vars {
		data[k] = v
	}
	for k, v := range map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
		"raise_exception": func(msg string) (string, error) {
			return "", fmt.Errorf("template raised: %s", msg)
		},
		"strftime_now": func(format string) string { return strftime(t.now(), format) },
	} {
		data[k] = v
	}
	ctx := exec.NewContext(data)
	t.mu.Lock()
	defer t.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat: render: panic in the Jinja engine: %v", r)
		}
	}()
	out, err = t.tpl.ExecuteToString(ctx)
	if err != nil {
		return "", fmt.Errorf("chat: render: %w", err)
	}
	return out, nil
}

// strftime implements the directives chat templates use.
func strftime(tm time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", tm.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(tm.Month()))
		case 'Y':
			fmt.Fprintf(&b, "%04d", tm.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", tm.Year()%100)
		case 'b':
			b.WriteString(tm.Month().String()[:3])
		case 'B':
			b.WriteString(tm.Month().String())
		case 'a':
			b.WriteString(tm.Weekday().String()[:3])
		case 'A':
			b.WriteString(tm.Weekday().String())
		case 'H':
			fmt.Fprintf(&b, "%02d", tm.Hour())
		case 'M':
			fmt.Fprintf(&b, "%02d", tm.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", tm.Second())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

package decode

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// qwen3Server serves a scripted model with a byte-level tokenizer and
// Qwen3's real chat template: it writes gen whatever it is asked. Before
// each request, plen points the script at the end of that request's
// prompt.
type qwen3Server struct {
	url  string
	srv  *Server
	m    *scriptModel
	tok  *tokenizer.Tokenizer
	tmpl *chat.Template
}

func newQwen3Server(t *testing.T, gen string) *qwen3Server {
	t.Helper()
	return newTemplateServer(t, "qwen3_real_chat_template.jinja", gen)
}

// newTemplateServer is newQwen3Server with another template of
// runners/chat/testdata.
func newTemplateServer(t *testing.T, template, gen string) *qwen3Server {
	t.Helper()
	src, err := os.ReadFile("../chat/testdata/" + template)
	if err != nil {
		t.Fatal(err)
	}
	return serveTemplate(t, string(src), gen)
}

// serveTemplate is newTemplateServer with the template's source.
func serveTemplate(t *testing.T, src, gen string) *qwen3Server {
	t.Helper()
	tok, err := tokenizer.Load("../tokenizer/testdata/tiny_qwen2")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Parse(src, "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	script := tok.Encode(gen)
	if got := tok.Decode(script); got != gen {
		t.Fatalf("the tokenizer does not round-trip the script: %q", got)
	}
	m := &scriptModel{script: script, eos: tok.EOS()[0], vocab: tok.VocabSize()}
	url, srv := serveScript(t, m, NewText(tok, tmpl))
	return &qwen3Server{url: url, srv: srv, m: m, tok: tok, tmpl: tmpl}
}

// aim sets the script's prompt length to that of a chat request's.
func (q *qwen3Server) aim(t *testing.T, msgs []gen.Message, tools []gen.Tool) string {
	t.Helper()
	req := &gen.Request{Chat: true, Messages: msgs, Tools: tools, AddGenerationPrompt: true}
	ids, _, err := q.srv.Tokenize(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	q.m.plen = len(ids)
	return q.tok.Decode(ids)
}

const qwen3Think = "<think>\nThe user greets me.\nReply briefly.\n</think>\n\nHello! How can I help?"

// TestQwen3ThinkSplit: a Qwen3-template model's <think>…</think> comes
// back as reasoning_content and the rest as content, in a whole response
// and (joined) in a stream; with tools, a call after the reasoning is a
// tool call, and a call-shaped text inside the reasoning is not. The
// Responses and Anthropic APIs (no thinking asked for) get
// the answer alone.
func TestQwen3ThinkSplit(t *testing.T) {
	call := "<think>\nNeed the weather. <tool_call> is how I call.\n</think>\n\n<tool_call>\n" +
		`{"name": "get_weather", "arguments": {"city": "Paris"}}` + "\n</tool_call>"
	user := []gen.Message{{Role: "user", Content: "hi"}}
	tools := apiTools(t, harmonyTools)
	for _, c := range []struct {
		name, gen          string
		tools              bool
		content, reasoning string
		calls              []harmonyCallOut
		finish             string
	}{
		{"answer", qwen3Think, false, "Hello! How can I help?", "The user greets me.\nReply briefly.", nil, "stop"},
		{"no think", "Hello!", false, "Hello!", "<nil>", nil, "stop"},
		{"call", call, true, "<nil>", "Need the weather. <tool_call> is how I call.",
			[]harmonyCallOut{{"", "function", "get_weather", `{"city": "Paris"}`}}, "tool_calls"},
		{"cut off while reasoning", "<think>\nStill thinking", false, "", "Still thinking", nil, "stop"},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newQwen3Server(t, c.gen)
			var tl []gen.Tool
			body := map[string]any{"max_tokens": 500, "temperature": 0}
			if c.tools {
				tl = tools
				body["tools"] = harmonyTools
			}
			q.aim(t, user, tl)
			want := chatParts{c.content, c.reasoning, c.calls, c.finish}
			if got, _ := chatWhole(t, q.url, body); !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
			want.content, want.reasoning = strings.TrimPrefix(want.content, "<nil>"), strings.TrimPrefix(want.reasoning, "<nil>")
			if got, raw := chatStream(t, q.url, body); !reflect.DeepEqual(got, want) {
				t.Errorf("stream: %+v\nwant %+v\n%s", got, want, raw)
			}
		})
	}
	t.Run("adapters", func(t *testing.T) {
		q := newQwen3Server(t, qwen3Think)
		q.aim(t, user, nil)
		for path, body := range map[string]map[string]any{
			"/v1/responses": {"model": "m", "input": "hi", "temperature": 0},
			"/v1/messages":  {"model": "m", "max_tokens": 500, "temperature": 0, "messages": []map[string]any{{"role": "user", "content": "hi"}}},
		} {
			code, raw := postJSON(t, q.url+path, body)
			if code != http.StatusOK || !bytes.Contains(raw, []byte(`"text":"Hello! How can I help?"`)) ||
				bytes.Contains(raw, []byte("greets")) || bytes.Contains(raw, []byte("think>")) {
				t.Errorf("%s: %d %s", path, code, raw)
			}
		}
	})
}

// TestThinkOpenedByThePrompt: a template whose generation prompt opens
// <think> itself (as Qwen3's 2507 thinking models' do) has output that
// starts as reasoning; a call after </think> is still a call (and the
// lazy call constraint, which only watches the answer, lets it through).
func TestThinkOpenedByThePrompt(t *testing.T) {
	src, err := os.ReadFile("../chat/testdata/qwen3_real_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	opened := strings.Replace(string(src), `{{- '<|im_start|>assistant\n' }}`, `{{- '<|im_start|>assistant\n<think>\n' }}`, 1)
	if opened == string(src) {
		t.Fatal("the template's generation prompt moved")
	}
	user := []gen.Message{{Role: "user", Content: "hi"}}
	tools := apiTools(t, harmonyTools)
	for _, c := range []struct {
		name, gen string
		tools     bool
		want      chatParts
	}{
		{"answer", "The user greets me. <tool_call> here is not a call.\n</think>\n\nHello!", false,
			chatParts{"Hello!", "The user greets me. <tool_call> here is not a call.", nil, "stop"}},
		{"call", "Need f. <tool_call>\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", true,
			chatParts{"<nil>", "Need f. <tool_call>", []harmonyCallOut{{"", "function", "get_weather", `{"city": "Oslo"}`}}, "tool_calls"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := serveTemplate(t, opened, c.gen)
			body := map[string]any{"max_tokens": 200, "temperature": 0}
			var tl []gen.Tool
			if c.tools {
				tl, body["tools"] = tools, harmonyTools
			}
			if p := q.aim(t, user, tl); !strings.HasSuffix(p, "<think>\n") {
				t.Fatalf("prompt %q", p)
			}
			if got, raw := chatWhole(t, q.url, body); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %+v\nwant %+v\n%s", got, c.want, raw)
			}
		})
	}
}

// apiTools are tools given in OpenAI's JSON shape as the handler's
// validation hands them to the generator.
func apiTools(t *testing.T, tools any) []gen.Tool {
	t.Helper()
	var r openai.ChatRequest
	if err := json.Unmarshal(mustJSON(t, map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "x"}}, "tools": tools}), &r); err != nil {
		t.Fatal(err)
	}
	g, e := openai.Validator{Served: func(string) bool { return true }, AcceptTools: true}.ValidateChat(&r)
	if e != nil {
		t.Fatal(e)
	}
	return g.Tools
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReasoningContentInHistory: an assistant message's reasoning_content
// is rendered where the template reads it (Qwen3's: kept after the last
// user turn, as <think>) and refused by name where it does not (the tiny
// model's ChatML template), instead of vanishing.
func TestReasoningContentInHistory(t *testing.T) {
	msgs := []map[string]any{{"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": nil, "reasoning_content": "Need the weather.", "tool_calls": []map[string]any{
			{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
		{"role": "tool", "tool_call_id": "call_1", "content": "18 C"}}

	q := newQwen3Server(t, qwen3Think)
	prompt := q.aim(t, []gen.Message{{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", Reasoning: "Need the weather.", ToolCalls: []gen.ToolCall{{ID: "call_1",
			Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: "18 C"}}, nil)
	if !strings.Contains(prompt, "<|im_start|>assistant\n<think>\nNeed the weather.\n</think>\n\n<tool_call>") {
		t.Errorf("reasoning not rendered: %q", prompt)
	}
	code, raw := postJSON(t, q.url+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "temperature": 0})
	if code != http.StatusOK {
		t.Errorf("qwen3 template: %d %s", code, raw)
	}

	// gpt-oss's template: the call turn's reasoning is its analysis
	// message; the answer is parsed as harmony (the tiny tokenizer's <|end|>
	// is an end token, so the script is a final message alone).
	q = newTemplateServer(t, "gptoss_chat_template.jinja", "<|channel|>final<|message|>Hello! How can I help?<|return|>")
	prompt = q.aim(t, []gen.Message{{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", Reasoning: "Need the weather.", ToolCalls: []gen.ToolCall{{ID: "call_1",
			Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: "18 C"}}, nil)
	if !strings.Contains(prompt, "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather") {
		t.Errorf("gpt-oss: reasoning not rendered: %q", prompt)
	}
	code, raw = postJSON(t, q.url+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "temperature": 0})
	if code != http.StatusOK || !bytes.Contains(raw, []byte(`"content":"Hello! How can I help?"`)) {
		t.Errorf("gpt-oss template: %d %s", code, raw)
	}

	s := newTinyServer(t, gen.Defaults{})
	code, raw = postJSON(t, s.url+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 2})
	var eb openai.ErrorBody
	if err := json.Unmarshal(raw, &eb); err != nil || code != http.StatusBadRequest ||
		eb.Error.Param == nil || *eb.Error.Param != "messages[1].reasoning_content" {
		t.Errorf("ChatML template: %d %s", code, raw)
	}
}

// TestToolChoiceNoneRendersNoTools: with gpt-oss's real template, tools
// reach the prompt (its "# Tools" developer section) under tool_choice
// "auto" and not under "none".
func TestToolChoiceNoneRendersNoTools(t *testing.T) {
	q := newTemplateServer(t, "gptoss_chat_template.jinja", "<|channel|>final<|message|>Hi<|return|>")
	tools := apiTools(t, harmonyTools)
	for mode, want := range map[string]bool{"auto": true, "none": false} {
		req := &gen.Request{Chat: true, Messages: []gen.Message{{Role: "user", Content: "hi"}}, Tools: tools,
			ToolChoice: &gen.ToolChoice{Mode: mode}, AddGenerationPrompt: true}
		ids, _, err := q.srv.Tokenize(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(q.tok.Decode(ids), "get_weather"); got != want {
			t.Errorf("tool_choice %s: tools in the prompt %v, want %v", mode, got, want)
		}
	}
}

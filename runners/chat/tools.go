package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// ToolDef is a function offered to the model (OpenAI's tools[].function):
// Parameters is its JSON Schema (nil: none).
type ToolDef struct {
	Name, Description string
	Parameters        json.RawMessage
}

// Family is how a model family writes tool calls.
type Family int

const (
	// Hermes: <tool_call>{"name": …, "arguments": {…}}</tool_call>, one
	// block per call (Qwen2.5, Qwen3, Hermes; and the generic prompt).
	Hermes Family = iota
	// Llama: a bare {"name": …, "parameters": {…}} object, optionally after
	// <|python_tag|> (Llama 3.1, 3.2).
	Llama
	// Mistral: [TOOL_CALLS] then a JSON array of {"name", "arguments"}.
	Mistral
	// Harmony: gpt-oss's channels; a call is a commentary message
	// addressed to=functions.NAME whose body is the arguments, ended by
	// <|call|> (see HarmonyParser, which parses this family instead of
	// ToolStream, since its analysis channel is reasoning, not content).
	Harmony
)

func (f Family) String() string {
	switch f {
	case Llama:
		return "llama"
	case Mistral:
		return "mistral"
	case Harmony:
		return "harmony"
	}
	return "hermes"
}

// ArgsKey is the member that holds a call's arguments in this family.
func (f Family) ArgsKey() string {
	if f == Llama {
		return "parameters"
	}
	return "arguments"
}

// NativeTools reports whether the template renders a "tools" variable
// itself (HF templates that support tool use do).
func (t *Template) NativeTools() bool { return strings.Contains(t.src, "tools") }

// ToolFamily picks the tool-call family from the template: its own
// markers, else Hermes (which the generic prompt asks for).
func (t *Template) ToolFamily() Family {
	switch {
	case strings.Contains(t.src, "<|channel|>"):
		return Harmony
	case strings.Contains(t.src, "[TOOL_CALLS]"):
		return Mistral
	case strings.Contains(t.src, "<tool_call>"):
		return Hermes
	case strings.Contains(t.src, "<|python_tag|>"), strings.Contains(t.src, "<|start_header_id|>") && t.NativeTools():
		return Llama
	}
	return Hermes
}

// RenderTools renders msgs with tools offered. A template that takes
// tools gets them as HF passes them ({"type": "function", "function":
// {"name", "description", "parameters"}}, parameters as an object); any
// other gets the generic prompt (GenericToolPrompt) at the head of its
// system message, and its tool-call history spelled the way that prompt
// asks (see GenericToolMessages).
func (t *Template) RenderTools(msgs []Message, tools []ToolDef, addGenerationPrompt bool) (string, error) {
	if len(tools) == 0 {
		return t.Render(msgs, addGenerationPrompt)
	}
	if !t.NativeTools() {
		gm, err := GenericToolMessages(msgs, tools)
		if err != nil {
			return "", err
		}
		return t.Render(gm, addGenerationPrompt)
	}
	tv, err := toolValues(tools)
	if err != nil {
		return "", err
	}
	return t.RenderVars(msgs, addGenerationPrompt, map[string]any{"tools": tv})
}

func toolValues(tools []ToolDef) (pyList, error) {
	out := make(pyList, len(tools))
	for i, td := range tools {
		fn := map[string]any{"name": td.Name}
		if td.Description != "" {
			fn["description"] = td.Description
		}
		if len(td.Parameters) > 0 {
			var p any
			d := json.NewDecoder(bytes.NewReader(td.Parameters))
			d.UseNumber()
			if err := d.Decode(&p); err != nil {
				return nil, fmt.Errorf("chat: tool %q parameters: %w", td.Name, err)
			}
			fn["parameters"] = toTemplateValue(p)
		}
		out[i] = map[string]any{"type": "function", "function": fn}
	}
	return out, nil
}

// toTemplateValue turns decoded JSON into what templates index: lists as
// pyList, numbers as int64 or float64.
func toTemplateValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = toTemplateValue(e)
		}
		return x
	case []any:
		l := make(pyList, len(x))
		for i, e := range x {
			l[i] = toTemplateValue(e)
		}
		return l
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	}
	return v
}

// GenericToolPrompt is the system prompt offering tools to a model whose
// template does not take them: the Hermes convention (the one Qwen2.5 and
// Hermes models are trained on), short enough for a small model to
// follow. %s is the tools, one JSON object per line.
const GenericToolPrompt = "You are a function calling AI model. You may call one or more functions to assist with the user query. " +
	"Don't make assumptions about what values to plug into functions. Here are the available tools:\n<tools>\n%s\n</tools>\n\n" +
	"For each function call, return a JSON object with the function name and arguments within <tool_call></tool_call> tags:\n" +
	"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"

// GenericToolMessages rewrites a conversation for a template without tool
// support: GenericToolPrompt (before any system text) as the system
// message; an assistant turn's calls appended to its content as
// <tool_call> blocks; a tool result as a user turn holding
// <tool_response>…</tool_response> (as Qwen2.5's template renders it).
func GenericToolMessages(msgs []Message, tools []ToolDef) ([]Message, error) {
	var lines []string
	for _, td := range tools {
		type function struct {
			Name        string          `json:"name"`
			Description string          `json:"description,omitempty"`
			Parameters  json.RawMessage `json:"parameters,omitempty"`
		}
		b, err := marshalNoEscape(struct {
			Type     string   `json:"type"`
			Function function `json:"function"`
		}{"function", function{td.Name, td.Description, td.Parameters}})
		if err != nil {
			return nil, fmt.Errorf("chat: tool %q: %w", td.Name, err)
		}
		lines = append(lines, string(b))
	}
	sys := fmt.Sprintf(GenericToolPrompt, strings.Join(lines, "\n"))
	out := make([]Message, 0, len(msgs)+1)
	rest := msgs
	if len(msgs) > 0 && msgs[0].Role == "system" {
		sys = msgs[0].Content + "\n\n" + sys
		rest = msgs[1:]
	}
	out = append(out, Message{Role: "system", Content: sys})
	for _, m := range rest {
		switch {
		case m.Role == "assistant" && len(m.ToolCalls) > 0:
			var b strings.Builder
			b.WriteString(m.Content)
			for _, c := range m.ToolCalls {
				if b.Len() > 0 {
					b.WriteByte('\n')
				}
				args := json.RawMessage(c.Arguments)
				if !json.Valid(args) {
					q, _ := marshalNoEscape(c.Arguments)
					args = q
				}
				call, err := marshalNoEscape(struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				}{c.Name, args})
				if err != nil {
					return nil, err
				}
				b.WriteString("<tool_call>\n" + string(call) + "\n</tool_call>")
			}
			out = append(out, Message{Role: "assistant", Content: b.String()})
		case m.Role == "tool":
			out = append(out, Message{Role: "user", Content: "<tool_response>\n" + m.Content + "\n</tool_response>"})
		default:
			out = append(out, Message{Role: m.Role, Content: m.Content})
		}
	}
	return out, nil
}

func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

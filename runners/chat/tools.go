package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ToolDef is a function offered to the model (OpenAI's tools[].function):
// Parameters is its JSON Schema (nil: none); Strict: its calls must be
// schema-valid (a schema the grammar cannot enforce is then an error).
type ToolDef struct {
	Name, Description string
	Parameters        json.RawMessage
	Strict            bool
}

// nativeTools reports whether the template renders a "tools" variable
// itself (HF templates that support tool use do).
func (t *Template) nativeTools() bool { return strings.Contains(t.src, "tools") }

// renderTools renders msgs with tools (nil: none) given to the template
// as HF passes them ({"type": "function", "function": {"name",
// "description", "parameters"}}, parameters as an object). A template
// that takes no tools is an error (they would be dropped unseen).
func (t *Template) renderTools(msgs []Message, tools []ToolDef, addGenerationPrompt bool) (string, error) {
	if len(tools) == 0 {
		return t.Render(msgs, addGenerationPrompt)
	}
	if !t.nativeTools() {
		return "", errors.New("chat: this chat template takes no tools")
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

func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

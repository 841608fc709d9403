package chat

import (
	"encoding/json"
	"os"
	"testing"
)

// TestToolHistoryMatchesJinja2: an assistant tool call (content null,
// arguments as JSON text from an OpenAI client) and a tool result render as
// HF transformers renders them with Python jinja2 (fixture made by
// scripts/tokenizer/make_tool_history_fixture.py).
func TestToolHistoryMatchesJinja2(t *testing.T) {
	b, err := os.ReadFile("testdata/tool_history.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Conversation []struct {
			Role      string
			Content   *string
			ToolCalls []struct {
				ID       string
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
			ToolCallID string `json:"tool_call_id"`
		}
		Cases []struct {
			Template            string
			AddGenerationPrompt bool `json:"add_generation_prompt"`
			Output              string
		}
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	var msgs []Message
	for _, m := range fx.Conversation {
		cm := Message{Role: m.Role, ToolCallID: m.ToolCallID}
		if m.Content != nil {
			cm.Content = *m.Content
		}
		for _, c := range m.ToolCalls {
			cm.ToolCalls = append(cm.ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
		msgs = append(msgs, cm)
	}
	for _, c := range fx.Cases {
		tpl := testTemplate(t, c.Template, "<s>", "</s>")
		got, err := tpl.RenderVars(msgs, c.AddGenerationPrompt, map[string]any{"date_string": "26 Jul 2024"})
		if err != nil {
			t.Fatalf("%s: %v", c.Template, err)
		}
		if got != c.Output {
			t.Errorf("%s agp=%v:\n got %q\nwant %q", c.Template, c.AddGenerationPrompt, got, c.Output)
		}
	}
}

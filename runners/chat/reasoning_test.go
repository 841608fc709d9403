package chat

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// TestReasoningHistory renders conversations whose assistant turns carry
// reasoning (OpenAI's reasoning_content) with gpt-oss's and Qwen3's real
// templates, with and without tools, as Python jinja2 does
// (testdata/reasoning_golden.json, scripts/tokenizer/reasoning_chat_fixture.py):
// gpt-oss reads it as message.thinking (kept only on a tool-call turn with
// no later final answer, or on a continued last turn), Qwen3 as
// message.reasoning_content (kept after the last user query).
func TestReasoningHistory(t *testing.T) {
	raw, err := os.ReadFile("testdata/reasoning_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Date  string
		Tools []struct {
			Function struct {
				Name, Description string
				Parameters        json.RawMessage
			}
		}
		Cases []struct {
			Template, Conversation string
			Messages               []struct {
				Role, Content    string
				ToolCallID       string `json:"tool_call_id"`
				ReasoningContent string `json:"reasoning_content"`
				ToolCalls        []struct {
					ID       string
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			AddGenerationPrompt bool `json:"add_generation_prompt"`
			Tools               bool
			Output, Error       *string
			Raised              bool
		}
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	date, err := time.Parse("2006-01-02", g.Date)
	if err != nil {
		t.Fatal(err)
	}
	var tools []ToolDef
	for _, tl := range g.Tools {
		tools = append(tools, ToolDef{Name: tl.Function.Name, Description: tl.Function.Description, Parameters: tl.Function.Parameters})
	}
	tpls := map[string]*Template{}
	for _, fn := range []string{"gptoss_chat_template.jinja", "qwen3_real_chat_template.jinja"} {
		tpl := testTemplate(t, fn, "<|startoftext|>", "<|return|>")
		tpl.now = func() time.Time { return date }
		if !tpl.HistoryReasoning() {
			t.Errorf("%s: HistoryReasoning false", fn)
		}
		tpls[fn] = tpl
	}
	if len(g.Cases) < 20 {
		t.Fatalf("%d cases", len(g.Cases))
	}
	for _, c := range g.Cases {
		var msgs []Message
		for _, m := range c.Messages {
			cm := Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Reasoning: m.ReasoningContent}
			for _, tc := range m.ToolCalls {
				cm.ToolCalls = append(cm.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
			}
			msgs = append(msgs, cm)
		}
		var td []ToolDef
		if c.Tools {
			td = tools
		}
		tpl := tpls[c.Template]
		got, err := Detect(tpl).RenderTools(tpl, msgs, td, c.AddGenerationPrompt)
		name := c.Template + "/" + c.Conversation
		switch {
		case c.Error != nil:
			if err == nil || (c.Raised && !strings.Contains(err.Error(), *c.Error)) {
				t.Errorf("%s agp=%v tools=%v: want error %q, got %v", name, c.AddGenerationPrompt, c.Tools, *c.Error, err)
			}
		case err != nil:
			t.Errorf("%s agp=%v tools=%v: %v", name, c.AddGenerationPrompt, c.Tools, err)
		case got != *c.Output:
			t.Errorf("%s agp=%v tools=%v:\n got %q\nwant %q", name, c.AddGenerationPrompt, c.Tools, got, *c.Output)
		}
	}
}

// TestHistoryReasoning: only templates that read a message's reasoning
// (reasoning_content, or thinking as gpt-oss's) take it.
func TestHistoryReasoning(t *testing.T) {
	for _, c := range []struct {
		src  string
		want bool
	}{
		{"{% for m in messages %}{{ m.reasoning_content }}{% endfor %}", true},
		{"{% for m in messages %}{% if 'thinking' in m %}{{ m.thinking }}{% endif %}{% endfor %}", true},
		{"{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking %}<think>{% endif %}", false},
		{"{% for m in messages %}{{ m['content'] }}{% endfor %}", false},
	} {
		tpl, err := Parse(c.src, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if got := tpl.HistoryReasoning(); got != c.want {
			t.Errorf("%s: %v, want %v", c.src, got, c.want)
		}
	}
}

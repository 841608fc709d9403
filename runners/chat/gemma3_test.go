package chat

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestGemma3Template renders Gemma 3's own chat template (system prompt
// folded into the first user turn, "model" for the assistant, trimmed
// content, raise_exception on non-alternating roles) as Python jinja2 does
// (testdata/gemma3_golden.json, scripts/tokenizer/gemma3_chat_fixture.py).
func TestGemma3Template(t *testing.T) {
	src, err := os.ReadFile("testdata/gemma3_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("testdata/gemma3_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		BOS, EOS string
		Cases    []struct {
			Conversation        string
			Messages            []Message
			AddGenerationPrompt bool `json:"add_generation_prompt"`
			Output              *string
			Error               *string
			Raised              bool
		}
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	tpl, err := Parse(string(src), g.BOS, g.EOS)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range g.Cases {
		got, err := tpl.RenderVars(c.Messages, c.AddGenerationPrompt, nil)
		switch {
		case c.Error != nil:
			if err == nil || (c.Raised && !strings.Contains(err.Error(), *c.Error)) {
				t.Errorf("%s agp=%v: want error %q, got %v (%q)", c.Conversation, c.AddGenerationPrompt, *c.Error, err, got)
			}
		case err != nil:
			t.Errorf("%s agp=%v: %v", c.Conversation, c.AddGenerationPrompt, err)
		case got != *c.Output:
			t.Errorf("%s agp=%v:\n got %q\nwant %q", c.Conversation, c.AddGenerationPrompt, got, *c.Output)
		}
	}
}

// TestParenthesizedConditional: the rewrite around gonja's parser renders
// parenthesized conditionals as Jinja does (lazy branches, dashes, nesting,
// "if" inside strings left alone).
func TestParenthesizedConditional(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "a"}, {Role: "assistant", Content: "b"}}
	for _, c := range []struct{ src, want string }{
		{`{% for m in messages %}{{ '[' + (m.content if loop.first else "-") + ']' }}{% endfor %}`, "[a][-]"},
		{"x  {{- 'y' + ('z' if true else undefined_thing.attr) }}", "xyz"},
		{`{{ ('p' if (1 if true else 0) == 1 else 'q') }}`, "p"},
		{`{{ 'if (a) else' + ('1' if false else '2') }}`, "if (a) else2"},
		{`{{ ('n' ~ (1 + 2)) }}`, "n3"},
	} {
		tpl, err := Parse(c.src, "", "")
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		got, err := tpl.Render(msgs, false)
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.src, got, err, c.want)
		}
	}
}

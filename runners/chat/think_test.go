package chat

import (
	"testing"
)

// splitThink feeds s to a parser in pieces of n bytes (0: whole).
func splitThink(s string, n int, open bool) (reasoning, content string) {
	p := thinkSplit{Open: open}
	if n <= 0 {
		n = len(s) + 1
	}
	for i := 0; i < len(s); i += n {
		r, c := p.Feed(s[i:min(i+n, len(s))])
		reasoning, content = reasoning+r, content+c
	}
	r, c := p.Flush()
	return reasoning + r, content + c
}

func TestThinkParser(t *testing.T) {
	for _, c := range []struct {
		name, in           string
		open               bool
		reasoning, content string
	}{
		{"qwen3 answer", "<think>\nThe user asks for the capital.\nParis.\n</think>\n\nThe capital is Paris.", false,
			"The user asks for the capital.\nParis.", "The capital is Paris."},
		{"empty reasoning (enable_thinking off echoed)", "<think>\n\n</think>\n\nHi!", false, "", "Hi!"},
		{"leading white space", "\n <think>x</think>y", false, "x", "y"},
		{"no think: all answer, unchanged", "  Paris.\n", false, "", "  Paris.\n"},
		{"think later is answer", "Sure. <think>no</think>", false, "", "Sure. <think>no</think>"},
		{"looks like the tag", "<thinking>x", false, "", "<thinking>x"},
		{"cut off inside reasoning", "<think>\nstep 1\nstep 2\n", false, "step 1\nstep 2", ""},
		{"cut off inside the close tag", "<think>a</thi", false, "a</thi", ""},
		{"only the tag's start", "<thi", false, "", "<thi"},
		{"prompt opened <think>", "\nreason\n</think>\n\nanswer", true, "reason", "answer"},
		{"prompt opened, no close", "reason", true, "reason", ""},
		{"close tag inside answer stays", "<think>r</think>a</think>b", false, "r", "a</think>b"},
		{"tool call after reasoning", "<think>\nNeed f.\n</think>\n\n<tool_call>\n{\"name\":\"f\"}\n</tool_call>", false,
			"Need f.", "<tool_call>\n{\"name\":\"f\"}\n</tool_call>"},
		{"empty", "", false, "", ""},
	} {
		for _, n := range []int{0, 1, 2, 3, 5, 8} {
			r, ct := splitThink(c.in, n, c.open)
			if r != c.reasoning || ct != c.content {
				t.Errorf("%s (pieces of %d): reasoning %q content %q, want %q %q", c.name, n, r, ct, c.reasoning, c.content)
			}
		}
	}
}

func FuzzThinkParser(f *testing.F) {
	f.Add("<think>\nx\n</think>\n\ny", 3, false)
	f.Add("\n\n</thi</think>", 1, true)
	f.Fuzz(func(t *testing.T, s string, n int, open bool) {
		if n <= 0 || n > 64 {
			n = 5
		}
		wr, wc := splitThink(s, 0, open)
		pr, pc := splitThink(s, n, open)
		if wr != pr || wc != pc {
			t.Fatalf("pieces of %d: %q %q; whole: %q %q", n, pr, pc, wr, wc)
		}
	})
}

// TestThinkTags: Qwen3's template is of a <think> model; gpt-oss's
// (harmony) and SmolLM2's are not.
func TestThinkTags(t *testing.T) {
	for fn, want := range map[string]bool{"qwen3_real_chat_template.jinja": true, "gptoss_chat_template.jinja": false,
		"smollm2_chat_template.jinja": false, "llama31_chat_template.jinja": false} {
		tpl := testTemplate(t, fn, "", "")
		if got := tpl.thinkTags(); got != want {
			t.Errorf("%s: thinkTags %v, want %v", fn, got, want)
		}
	}
}

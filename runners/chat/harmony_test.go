package chat

import (
	"fmt"
	"testing"
)

// collect feeds s to a parser in pieces of n bytes (0: whole) and merges
// consecutive text events of one kind.
func collect(s string, n int) []HarmonyEvent {
	var p HarmonyParser
	var evs []HarmonyEvent
	add := func(es []HarmonyEvent) {
		for _, e := range es {
			if k := len(evs); k > 0 && e.Kind != HarmonyToolCall && evs[k-1].Kind == e.Kind {
				evs[k-1].Text += e.Text
				continue
			}
			evs = append(evs, e)
		}
	}
	if n == 0 {
		n = len(s)
	}
	for i := 0; i < len(s); i += n {
		add(p.Feed(s[i:min(i+n, len(s))]))
	}
	add(p.Flush())
	return evs
}

func TestHarmonyParser(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     []HarmonyEvent
	}{
		{"reasoning then answer",
			"<|channel|>analysis<|message|>User asks capital. Paris.<|end|><|start|>assistant<|channel|>final<|message|>The capital is Paris.<|return|>",
			[]HarmonyEvent{{Kind: HarmonyReasoning, Text: "User asks capital. Paris."}, {Kind: HarmonyContent, Text: "The capital is Paris."}}},
		{"tool call",
			"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>",
			[]HarmonyEvent{{Kind: HarmonyReasoning, Text: "Need weather."}, {Kind: HarmonyToolCall, Name: "get_weather", Text: "{\"location\":\"San Francisco\"}"}}},
		{"recipient in the role part",
			"<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>",
			[]HarmonyEvent{{Kind: HarmonyToolCall, Name: "lookup", Text: "{}"}}},
		{"text that looks like a token", "<|channel|>final<|message|>a <|b|> and x<|y<|return|>",
			[]HarmonyEvent{{Kind: HarmonyContent, Text: "a <|b|> and x<|y"}}},
		{"cut off mid-answer", "<|channel|>final<|message|>Par", []HarmonyEvent{{Kind: HarmonyContent, Text: "Par"}}},
		{"cut off inside a tool call", "<|channel|>commentary to=functions.f<|message|>{\"a\":", []HarmonyEvent{{Kind: HarmonyToolCall, Name: "f", Text: "{\"a\":"}}},
	} {
		for _, n := range []int{0, 1, 2, 3, 7} {
			got := collect(c.in, n)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("%s (pieces of %d): %+v, want %+v", c.name, n, got, c.want)
			}
		}
	}
}

func FuzzHarmonyParser(f *testing.F) {
	f.Add("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y<|return|>", 3)
	f.Add("<|<|<|message|><|call|>", 1)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n <= 0 || n > 64 {
			n = 5
		}
		whole, pieces := collect(s, 0), collect(s, n)
		if fmt.Sprint(whole) != fmt.Sprint(pieces) {
			t.Fatalf("feeding in pieces of %d changed the result: %+v vs %+v", n, pieces, whole)
		}
	})
}

// TestHarmonyFamily: a template that writes harmony's <|channel|> headers
// (gpt-oss's) is the Harmony tool-call family, whatever else it holds.
func TestHarmonyFamily(t *testing.T) {
	src := `{%- if tools %}<|start|>developer<|message|># Tools<|end|>{%- endif %}` +
		`{%- for m in messages %}{%- if m.role == "assistant" %}<|start|>assistant<|channel|>final<|message|>` +
		`{%- else %}<|start|>{{ m.role }}<|message|>{%- endif %}{{ m.content }}<|end|>{%- endfor %}` +
		`{%- if add_generation_prompt %}<|start|>assistant{%- endif %}`
	tpl, err := Parse(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := tpl.ToolFamily(); got != Harmony || got.String() != "harmony" {
		t.Errorf("family %v, want harmony", got)
	}
}

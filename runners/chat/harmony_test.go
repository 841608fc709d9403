package chat

import (
	"fmt"
	"testing"
)

// collect feeds s to a parser in pieces of n bytes (0: whole) and merges
// consecutive text events of one kind.
func collect(s string, n int) []Event {
	p := Harmony.NewParser(true, Start{})
	var evs []Event
	add := func(es []Event) {
		for _, e := range es {
			if k := len(evs); k > 0 && e.Kind != Call && evs[k-1].Kind == e.Kind {
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
		add(p.Add(s[i:min(i+n, len(s))], false))
	}
	add(p.Add("", true))
	return evs
}

func TestHarmonyParser(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     []Event
	}{
		{"reasoning then answer",
			"<|channel|>analysis<|message|>User asks capital. Paris.<|end|><|start|>assistant<|channel|>final<|message|>The capital is Paris.<|return|>",
			[]Event{{Kind: Reasoning, Text: "User asks capital. Paris."}, {Kind: Content, Text: "The capital is Paris."}}},
		{"tool call",
			"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>",
			[]Event{{Kind: Reasoning, Text: "Need weather."}, {Kind: Call, Name: "get_weather"}, {Kind: Call, Args: "{\"location\":\"San Francisco\"}"}}},
		{"recipient in the role part",
			"<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>",
			[]Event{{Kind: Call, Name: "lookup"}, {Kind: Call, Args: "{}"}}},
		{"text that looks like a token", "<|channel|>final<|message|>a <|b|> and x<|y<|return|>",
			[]Event{{Kind: Content, Text: "a <|b|> and x<|y"}}},
		{"cut off mid-answer", "<|channel|>final<|message|>Par", []Event{{Kind: Content, Text: "Par"}}},
		{"cut off inside a tool call", "<|channel|>commentary to=functions.f<|message|>{\"a\":", []Event{{Kind: Call, Name: "f"}, {Kind: Call, Args: "{\"a\":"}}},
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

// TestHarmonyDetect: a template that writes harmony's <|channel|> headers
// (gpt-oss's) is the Harmony format, whatever else it holds.
func TestHarmonyDetect(t *testing.T) {
	src := `{%- if tools %}<|start|>developer<|message|># Tools<|end|>{%- endif %}` +
		`{%- for m in messages %}{%- if m.role == "assistant" %}<|start|>assistant<|channel|>final<|message|>` +
		`{%- else %}<|start|>{{ m.role }}<|message|>{%- endif %}{{ m.content }}<|end|>{%- endfor %}` +
		`{%- if add_generation_prompt %}<|start|>assistant{%- endif %}`
	tpl, err := Parse(src, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := Detect(tpl); got != Harmony || got.String() != "harmony" {
		t.Errorf("format %v, want harmony", got)
	}
}

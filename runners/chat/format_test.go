package chat

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestDetect: each shipped template gets its format, once, from its
// source; a template that takes no tools is Hermes (the generic prompt's
// convention), and one that reasons in <think> wraps its call format.
func TestDetect(t *testing.T) {
	mistralSrc := `{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}` +
		`{%- for m in messages %}{%- if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls|tojson }}{%- else %}{{ m.content }}{%- endif %}{%- endfor %}`
	for _, c := range []struct {
		name, src string
		want      string
	}{
		{"qwen3_real_chat_template.jinja", "", "think+hermes"},
		{"llama31_chat_template.jinja", "", "llama3"},
		{"smollm2_chat_template.jinja", "", "hermes"},
		{"gptoss_chat_template.jinja", "", "harmony"},
		{"mistral", mistralSrc, "mistral"},
		{"python_tag without tools", `{{ "<|python_tag|>" }}{% for m in messages %}{{ m.content }}{% endfor %}`, "hermes"},
	} {
		src := c.src
		if src == "" {
			b, err := os.ReadFile("testdata/" + c.name)
			if err != nil {
				t.Fatal(err)
			}
			src = string(b)
		}
		tpl, err := Parse(src, "", "")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := Detect(tpl).String(); got != c.want {
			t.Errorf("%s: format %s, want %s", c.name, got, c.want)
		}
	}
	if Detect(nil) != Hermes {
		t.Errorf("no template: %v, want hermes", Detect(nil))
	}
}

// TestCallsStreamAsWritten: a Llama 3 or Mistral call goes out name first
// and then its arguments piece by piece while it is generated, not
// whole at the end.
func TestCallsStreamAsWritten(t *testing.T) {
	for _, c := range []struct {
		f      Format
		pieces []string
		want   [][]Event // the events of each piece
	}{
		{Llama3, []string{"<|python_", "tag|>{\"name\": \"get_weather\", \"param", "eters\": {\"city\"", ": \"Paris\"}}", "; {\"name\": \"b\", \"parameters\": {", "}}"},
			[][]Event{nil, nil, {{Kind: Call, Name: "get_weather"}, {Kind: Call, Args: `{"city"`}}, {{Kind: Call, Args: `: "Paris"}`}},
				{{Kind: Call, Index: 1, Name: "b"}, {Kind: Call, Index: 1, Args: "{"}}, {{Kind: Call, Index: 1, Args: "}"}}}},
		{Mistral, []string{"Sure. [TOOL", "_CALLS][{\"name\": \"a\", \"arguments\": {\"x\":", " 1}}, {\"name\": \"b\", \"arguments\": {}}", "]"},
			[][]Event{{{Kind: Content, Text: "Sure."}}, {{Kind: Call, Name: "a"}, {Kind: Call, Args: `{"x":`}}, {{Kind: Call, Args: " 1}"},
				{Kind: Call, Index: 1, Name: "b"}, {Kind: Call, Index: 1, Args: "{}"}}, nil}},
	} {
		p := c.f.NewParser(true, Start{})
		for i, s := range c.pieces {
			if got := p.Add(s, false); fmt.Sprint(got) != fmt.Sprint(c.want[i]) {
				t.Errorf("%v piece %d %q: %+v, want %+v", c.f, i, s, got, c.want[i])
			}
		}
		if ev := p.Add("", true); len(ev) != 0 {
			t.Errorf("%v at the end: %+v, want nothing more", c.f, ev)
		}
	}
}

// TestCallListsSplitAnywhere: Llama 3 and Mistral outputs, well formed or
// not, parse the same split at every byte boundary as whole, and as the
// whole-text reading where it finds calls.
func TestCallListsSplitAnywhere(t *testing.T) {
	for _, c := range []struct {
		f       Format
		text    string
		content string
		calls   []parsedCall
	}{
		{Llama3, ` {"name": "a", "parameters": "{\"k\": 1}"} `, "", []parsedCall{{"a", `{"k": 1}`}}},
		{Llama3, `{"parameters": {"x": [1, "}"]}, "name": "a"};`, "", []parsedCall{{"a", `{"x": [1, "}"]}`}}},
		{Llama3, `{"name": "a", "arguments": {"x": 1}}`, "", []parsedCall{{"a", `{"x": 1}`}}},
		{Llama3, "\u2003{\"name\": \"a\", \"parameters\": {}}\u2003;\u2003{\"name\": \"b\", \"parameters\": {}}", "", []parsedCall{{"a", `{}`}, {"b", `{}`}}},
		{Llama3, `{"name": "a"}`, "", []parsedCall{{"a", `{}`}}},
		{Llama3, `{"name": 1, "parameters": {}}`, `{"name": 1, "parameters": {}}`, nil},
		{Llama3, "<|python_tag|>print(1)", "<|python_tag|>print(1)", nil},
		{Llama3, "  ", "", nil},
		{Mistral, `[TOOL_CALLS] [ {"arguments": {}, "name": "b"}, {"name": "c", "arguments": "{}"} ] `, "", []parsedCall{{"b", `{}`}, {"c", `{}`}}},
		{Mistral, `Hi [TOOL_CALLS][]`, "Hi", nil},
		{Mistral, `Hi [TOOL_CALLS] [5]`, `Hi [TOOL_CALLS] [5]`, nil},
		{Mistral, `[TOOL_CALLS][{"name": "a", "arguments": {}}`, "", []parsedCall{{"a", `{}`}}}, // cut off before ']': as far as it got
		{Mistral, `[TOOL_CALLS]{"name": "a", "arguments": {}}`, `[TOOL_CALLS]{"name": "a", "arguments": {}}`, nil},
		{Mistral, "no calls [TOOL", "no calls [TOOL", nil},
	} {
		if sc, scalls := streamSplits(c.f, c.text); sc != c.content || !reflect.DeepEqual(scalls, c.calls) {
			t.Errorf("%v %q streamed:\n got %q %v\nwant %q %v", c.f, c.text, sc, scalls, c.content, c.calls)
		}
		if wc, wcalls := wholeCalls(c.f, c.text); len(wcalls) > 0 && (wc != c.content || !reflect.DeepEqual(wcalls, c.calls)) {
			t.Errorf("%v %q whole: %q %v, want %q %v", c.f, c.text, wc, wcalls, c.content, c.calls)
		}
	}
}

// TestThinkFormat: a Think format splits the reasoning off, then parses
// its call format's calls from the answer only, the same at every split.
func TestThinkFormat(t *testing.T) {
	text := "<think>\nMaybe <tool_call>{\"name\": \"no\", \"arguments\": {}}</tool_call>?\n</think>\n\nOK.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"
	f := Think(Hermes)
	whole := collectAll(f, []string{text}, true, Start{})
	want := "reasoning \"Maybe <tool_call>{\\\"name\\\": \\\"no\\\", \\\"arguments\\\": {}}</tool_call>?\" content \"OK.\" calls [{f {\"a\": 1}}]"
	if whole != want {
		t.Fatalf("whole: %s\nwant %s", whole, want)
	}
	for i := 1; i < len(text); i++ {
		if got := collectAll(f, []string{text[:i], text[i:]}, true, Start{}); got != whole {
			t.Fatalf("split at %d: %s", i, got)
		}
	}
	if got := collectAll(f, []string{"\nreason\n</think>\n\nanswer"}, false, f.Start("<|im_start|>assistant\n<think>\n")); got != `reasoning "reason" content "answer" calls []` {
		t.Errorf("prompt opened <think>: %s", got)
	}
	if got := collectAll(f, []string{`<tool_call>{"name": "f", "arguments": {}}</tool_call>`}, false, Start{}); !strings.Contains(got, `content "<tool_call>`) {
		t.Errorf("no tools offered: a call is answer text: %s", got)
	}
}

// TestHarmonyCallsWithoutTools: when no tools were offered, a call the
// model writes anyway is answer text.
func TestHarmonyCallsWithoutTools(t *testing.T) {
	got := collectAll(Harmony, []string{harmonyToolCallText}, false, Start{})
	if got != `reasoning "Need weather." content "{\"location\":\"Paris\"}" calls []` {
		t.Errorf("got %s", got)
	}
	if got := collectAll(Harmony, []string{harmonyToolCallText}, true, Start{}); got != `reasoning "Need weather." content "" calls [{get_weather {"location":"Paris"}}]` {
		t.Errorf("tools offered: %s", got)
	}
}

const harmonyToolCallText = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Paris\"}<|call|>"

// collectAll runs f's parser over pieces and describes the result.
func collectAll(f Format, pieces []string, calls bool, st Start) string {
	p := f.NewParser(calls, st)
	var r, c strings.Builder
	var cs []parsedCall
	apply := func(ev []Event) {
		for _, e := range ev {
			switch e.Kind {
			case Reasoning:
				r.WriteString(e.Text)
			case Content:
				c.WriteString(e.Text)
			case Call:
				for len(cs) <= e.Index {
					cs = append(cs, parsedCall{})
				}
				cs[e.Index].Name += e.Name
				cs[e.Index].Arguments += e.Args
			}
		}
	}
	for _, s := range pieces {
		apply(p.Add(s, false))
	}
	apply(p.Add("", true))
	return fmt.Sprintf("reasoning %q content %q calls %v", r.String(), c.String(), cs)
}

// TestTriggerScan: a lazy call's grammar starts where the format's
// trigger opens a call in the answer, never inside the reasoning.
func TestTriggerScan(t *testing.T) {
	for _, c := range []struct {
		name   string
		f      Format
		st     Start
		tokens []string
		fireAt int    // index of the token that opens the call (-1: none)
		rest   string // what of the call that token holds
	}{
		{"hermes", Hermes, Start{}, []string{"Let me", " check.<tool", "_call>\n{\"na"}, 2, "\n{\"na"},
		{"llama first byte", Llama3, Start{}, []string{" ", " {\"name\""}, 1, "{\"name\""},
		{"llama text", Llama3, Start{}, []string{"Sure", " {"}, -1, ""},
		{"mistral", Mistral, Start{}, []string{"[TOOL_CALLS][{"}, 0, "[{"},
		{"think: not in the reasoning", Think(Hermes), Start{}, []string{"<think>", "<tool_call>", "</think>", "\n\n<tool_call>{"}, 3, "{"},
		{"think: the prompt opened it", Think(Hermes), Start{Reasoning: true}, []string{"<tool_call>", "</think>", "<tool_call>"}, 2, ""},
		{"think: none", Think(Hermes), Start{}, []string{"Hi", " <tool_call>"}, 1, ""},
		{"think: split tags", Think(Hermes), Start{}, []string{"\n <th", "ink>a <tool_", "call> b</th", "ink>\n<tool", "_call>\n"}, 4, "\n"},
		{"think: a prefix of the opener is answer", Think(Hermes), Start{}, []string{"<th", "is<tool_call>"}, 1, ""},
		{"think llama3: first byte after the reasoning", Think(Llama3), Start{}, []string{"<think>{</think>", "\n\n", "{\"n"}, 2, "{\"n"},
	} {
		_, trig, ok := c.f.Lazy()
		if !ok {
			t.Fatalf("%s: no lazy calls", c.name)
		}
		s := trig.NewScan(c.st)
		fired := -1
		for i, tok := range c.tokens {
			if rest, ok := s.Feed([]byte(tok)); ok {
				if fired < 0 {
					fired = i
				}
				if string(rest) != c.rest {
					t.Errorf("%s: rest %q, want %q", c.name, rest, c.rest)
				}
				break
			}
		}
		if fired != c.fireAt {
			t.Errorf("%s: fired at token %d, want %d", c.name, fired, c.fireAt)
		}
	}
	if _, _, ok := Harmony.Lazy(); ok {
		t.Error("harmony: lazy calls, want its calls parsed")
	}
}

// TestRenderToolsWhereTheTemplateTakesNone: Hermes offers tools through
// its generic prompt; a format whose convention needs the template's own
// tools section refuses rather than drop them unseen.
func TestRenderToolsWhereTheTemplateTakesNone(t *testing.T) {
	tpl, err := Parse(`{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{{Role: "user", Content: "hi"}}
	tools := []ToolDef{{Name: "f"}}
	for _, f := range []Format{Llama3, Mistral, Harmony, Think(Llama3)} {
		if _, err := f.RenderTools(tpl, msgs, tools, true); err == nil {
			t.Errorf("%v: tools rendered through a template that takes none", f)
		}
		if out, err := f.RenderTools(tpl, msgs, nil, true); err != nil || out != "user: hi\n" {
			t.Errorf("%v without tools: %q %v", f, out, err)
		}
	}
	out, err := Hermes.RenderTools(tpl, msgs, tools, true)
	if err != nil || !strings.Contains(out, "<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n</tools>") {
		t.Errorf("hermes: %q %v", out, err)
	}
}

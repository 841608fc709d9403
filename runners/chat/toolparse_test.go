package chat

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseToolCalls(t *testing.T) {
	cases := []struct {
		f       Family
		text    string
		content string
		calls   []ParsedCall
	}{
		{Hermes, "Hello there.", "Hello there.", nil},
		{Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
			[]ParsedCall{{"get_weather", `{"city": "Paris"}`}}},
		{Hermes, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>", "Let me check.",
			[]ParsedCall{{"a", `{}`}, {"b", `{"x": [1, "}"]}`}}},
		{Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 1}\"}\n</tool_call>", "", []ParsedCall{{"a", `{"k": 1}`}}},
		{Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": 1}}", "", []ParsedCall{{"a", `{"k": 1}`}}}, // EOS before the close tag
		{Hermes, "<tool_call>\nnot json\n</tool_call> after", "<tool_call>\nnot json\n</tool_call> after", nil},
		{Hermes, "<tool_call>{\"arguments\": {\"k\": 1}, \"name\": \"a\"}</tool_call>", "", []ParsedCall{{"a", `{"k": 1}`}}},
		{Llama, `{"name": "get_weather", "parameters": {"city": "Paris"}}`, "", []ParsedCall{{"get_weather", `{"city": "Paris"}`}}},
		{Llama, `<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"q": ";"}}`, "", []ParsedCall{{"a", `{}`}, {"b", `{"q": ";"}`}}},
		{Llama, `{"not": "a call"}`, `{"not": "a call"}`, nil},
		{Llama, "The answer is 4.", "The answer is 4.", nil},
		{Mistral, `[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]`, "", []ParsedCall{{"a", `{"x": 1}`}, {"b", `{}`}}},
		{Mistral, `Sure. [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}]`, "Sure.", []ParsedCall{{"a", `{"x": 1}`}}},
		{Mistral, `[TOOL_CALLS] oops`, `[TOOL_CALLS] oops`, nil},
	}
	for _, c := range cases {
		content, calls := ParseToolCalls(c.f, c.text)
		if content != c.content || !reflect.DeepEqual(calls, c.calls) {
			t.Errorf("%v %q:\n got %q %v\nwant %q %v", c.f, c.text, content, calls, c.content, c.calls)
		}
		for seed := range 20 {
			sc, scalls := streamAll(c.f, c.text, rand.New(rand.NewPCG(uint64(seed), 1)))
			if sc != c.content || !reflect.DeepEqual(scalls, c.calls) {
				t.Errorf("%v %q streamed (seed %d):\n got %q %v\nwant %q %v", c.f, c.text, seed, sc, scalls, c.content, c.calls)
				break
			}
		}
	}
}

// streamAll feeds text to a ToolStream in random pieces and reassembles
// the events as an OpenAI client does.
func streamAll(f Family, text string, r *rand.Rand) (string, []ParsedCall) {
	s := NewToolStream(f)
	var content strings.Builder
	var calls []ParsedCall
	apply := func(ev []ToolEvent) {
		for _, e := range ev {
			if e.Index < 0 {
				content.WriteString(e.Text)
				continue
			}
			for len(calls) <= e.Index {
				calls = append(calls, ParsedCall{})
			}
			calls[e.Index].Name += e.Name
			calls[e.Index].Arguments += e.Args
		}
	}
	for len(text) > 0 {
		n := 1 + r.IntN(min(len(text), 6))
		apply(s.Push(text[:n]))
		text = text[n:]
	}
	apply(s.Finish())
	return content.String(), calls
}

func TestToolStreamHoldsBackMarkers(t *testing.T) {
	s := NewToolStream(Hermes)
	if ev := s.Push("Hi <tool"); len(ev) != 1 || ev[0].Text != "Hi" {
		t.Fatalf("Push(\"Hi <tool\") = %+v, want the text before a possible marker", ev)
	}
	ev := s.Push("_call>\n{\"name\": \"f\", \"arguments\": {\"a\"")
	if len(ev) != 2 || ev[0].Name != "f" || ev[1].Args != `{"a"` {
		t.Fatalf("got %+v, want the name then the arguments so far", ev)
	}
	if ev := s.Push(": 1}}\n</tool_call>"); len(ev) != 1 || ev[0].Args != ": 1}" {
		t.Fatalf("got %+v, want the rest of the arguments", ev)
	}
	s = NewToolStream(Hermes)
	if ev := append(s.Push("a <b> c <"), s.Finish()...); len(ev) != 2 || ev[0].Text+ev[1].Text != "a <b> c <" {
		t.Fatalf("text with '<' that is no marker: %+v", ev)
	}
}

func TestGenericToolPromptRendersWithSmolLM2Template(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "smollm2_chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := Parse(string(src), "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.NativeTools() || tpl.ToolFamily() != Hermes {
		t.Fatalf("SmolLM2: NativeTools %v family %v, want false hermes", tpl.NativeTools(), tpl.ToolFamily())
	}
	tools := []ToolDef{{Name: "get_weather", Description: "Weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}}
	msgs := []Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
		{Role: "tool", ToolCallID: "c1", Content: "18 C"},
	}
	out, err := tpl.RenderTools(msgs, tools, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<|im_start|>system\nBe brief.\n\nYou are a function calling AI model.",
		`{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`,
		"<|im_start|>assistant\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call><|im_end|>",
		"<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered prompt lacks %q:\n%s", want, out)
		}
	}
}

// TestToolsRenderMatchesJinja2: tools rendered through the real Qwen3 and
// Llama 3.1 templates equal Python jinja2's rendering (fixture by
// scripts/tokenizer/make_tools_fixture.py).
func TestToolsRenderMatchesJinja2(t *testing.T) {
	b, err := os.ReadFile("testdata/tools_render.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx struct {
		Conversation []Message
		Tools        []struct {
			Function struct {
				Name, Description string
				Parameters        json.RawMessage
			}
		}
		Cases []struct{ Template, Output string }
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	var tools []ToolDef
	for _, td := range fx.Tools {
		tools = append(tools, ToolDef{Name: td.Function.Name, Description: td.Function.Description, Parameters: td.Function.Parameters})
	}
	for _, c := range fx.Cases {
		src, err := os.ReadFile(filepath.Join("testdata", c.Template))
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := Parse(string(src), "<s>", "</s>")
		if err != nil {
			t.Fatal(err)
		}
		if !tpl.NativeTools() {
			t.Fatalf("%s: NativeTools false", c.Template)
		}
		tv, err := toolValues(tools)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tpl.RenderVars(fx.Conversation, true, map[string]any{"tools": tv, "date_string": "26 Jul 2024"})
		if err != nil {
			t.Fatal(err)
		}
		if got != c.Output {
			t.Errorf("%s:\n got %q\nwant %q", c.Template, got, c.Output)
		}
	}
	for name, want := range map[string]Family{"qwen3_real_chat_template.jinja": Hermes, "llama31_chat_template.jinja": Llama} {
		src, _ := os.ReadFile(filepath.Join("testdata", name))
		tpl, err := Parse(string(src), "<s>", "</s>")
		if err != nil {
			t.Fatal(err)
		}
		if got := tpl.ToolFamily(); got != want {
			t.Errorf("%s: family %v, want %v", name, got, want)
		}
	}
}

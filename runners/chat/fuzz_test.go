package chat

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
)

// FuzzTemplate: any template source parses and renders to a result or an
// error, never a crash (templates come from downloaded model files).
func FuzzTemplate(f *testing.F) {
	for _, p := range []string{"testdata/features.jinja", "testdata/smollm2_chat_template.jinja"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add(`{{ messages[-1]['content'].split()|join(',') }}{{ raise_exception('x') if messages|length > 3 }}`)
	f.Add(`{% for m in messages[::-1] %}{{ m.content.replace('a', 'b') }}{% endfor %}{{ messages | tojson(indent=2) }}`)
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "Hi there"}, {Role: "assistant", Content: "<think>x</think>y"}}
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := Parse(src, "<s>", "</s>")
		if err != nil {
			return
		}
		_, _ = tpl.Render(msgs, true)
		_, _ = tpl.Render(nil, false)
	})
}

// fuzzCalls: f's parser never panics, every call the whole-text reading
// returns has a name and object arguments, streaming the same text in
// any pieces gives what streaming it at once gives, and that is what the
// whole-text reading gives when it found calls (a call cut mid-way, or
// a block that turns out no call, may differ: its streamed fragments
// already went out).
func fuzzCalls(t *testing.T, f Format, text string, seed uint64) {
	content, calls := wholeCalls(f, text)
	for _, c := range calls {
		var o map[string]any
		if c.Name == "" || json.Unmarshal([]byte(c.Arguments), &o) != nil || o == nil {
			t.Fatalf("%q: bad call %+v", text, c)
		}
	}
	oc, ocalls := streamPieces(f, []string{text})
	sc, scalls := streamAll(f, text, rand.New(rand.NewPCG(seed, 0)))
	if sc != oc || !reflect.DeepEqual(scalls, ocalls) {
		t.Fatalf("%v %q: streamed in pieces %q %v, at once %q %v", f, text, sc, scalls, oc, ocalls)
	}
	if f == Hermes && strings.Count(text, hermesOpen) != len(calls) {
		return // a block that is not a call: the stream may have named it already
	}
	if f != Hermes && (len(calls) == 0 && len(scalls) > 0 || repeatsKey(text, len(calls))) {
		return // a list that breaks after a call went out, or a key given twice (the stream sent the first)
	}
	if sc != content || !reflect.DeepEqual(scalls, calls) {
		t.Fatalf("%v %q: streamed %q %v, whole %q %v", f, text, sc, scalls, content, calls)
	}
}

// repeatsKey reports whether text may give a call's name or arguments
// twice: more of those keys than calls, or keys spelled with escapes.
func repeatsKey(text string, calls int) bool {
	return strings.Contains(text, `\u`) || strings.Count(text, `"name"`) > calls ||
		strings.Count(text, `"arguments"`)+strings.Count(text, `"parameters"`) > calls
}

func FuzzHermes(f *testing.F) {
	f.Add("Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>", uint64(1))
	f.Add("<tool_call>{\"name\":\"a\",\"arguments\":\"{}\"}</tool_call><tool_call>bad</tool_call>", uint64(2))
	f.Fuzz(func(t *testing.T, text string, seed uint64) { fuzzCalls(t, Hermes, text, seed) })
}

func FuzzLlama3(f *testing.F) {
	f.Add(`<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"q": ";"}}`, uint64(3))
	f.Add(` {"name": "a", "parameters": "{\"k\": 1}"}`, uint64(5))
	f.Add(`{"parameters": {"x": [1, "}"]}, "name": "a"} ; `, uint64(6))
	f.Add(`{"name": "a", "parameters": {}} then text`, uint64(7))
	f.Fuzz(func(t *testing.T, text string, seed uint64) { fuzzCalls(t, Llama3, text, seed) })
}

func FuzzMistral(f *testing.F) {
	f.Add(`x [TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}]`, uint64(4))
	f.Add(`[TOOL_CALLS] [ {"arguments": {}, "name": "b"}, {"name": "c", "arguments": "{}"} ] `, uint64(8))
	f.Add(`[TOOL_CALLS][]`, uint64(9))
	f.Add(`[TOOL_CALLS][{"name": "a", "arguments": {}}, oops`, uint64(10))
	f.Fuzz(func(t *testing.T, text string, seed uint64) { fuzzCalls(t, Mistral, text, seed) })
}

// FuzzThinkFormat: Think(Hermes)'s parser (reasoning split, then calls
// from the answer) never panics and gives the same however the output is
// split, with or without tools offered and the reasoning opened by the
// prompt.
func FuzzThinkFormat(f *testing.F) {
	f.Add("<think>\nx <tool_call>\n</think>\n\nOK <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", 3, true, false)
	f.Add("r</think><tool_call>{\"name\": \"a\"", 1, true, true)
	f.Fuzz(func(t *testing.T, s string, n int, calls, open bool) {
		if n <= 0 || n > 64 {
			n = 5
		}
		var pieces []string
		for i := 0; i < len(s); i += n {
			pieces = append(pieces, s[i:min(i+n, len(s))])
		}
		st := Start{Reasoning: open}
		if whole, split := collectAll(Think(Hermes), []string{s}, calls, st), collectAll(Think(Hermes), pieces, calls, st); whole != split {
			t.Fatalf("pieces of %d: %s; whole: %s", n, split, whole)
		}
	})
}

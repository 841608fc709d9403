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

// FuzzToolCalls: the parsers never panic, every call they return has a
// name and object arguments, and streaming the same text in any pieces
// gives what the whole-text parser gives when that parse found calls
// that are all well-formed (a call cut mid-way may differ: its streamed
// fragments already went out).
func FuzzToolCalls(f *testing.F) {
	f.Add(uint8(0), "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>", uint64(1))
	f.Add(uint8(0), "<tool_call>{\"name\":\"a\",\"arguments\":\"{}\"}</tool_call><tool_call>bad</tool_call>", uint64(2))
	f.Add(uint8(1), `<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"q": ";"}}`, uint64(3))
	f.Add(uint8(2), `x [TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}]`, uint64(4))
	f.Fuzz(func(t *testing.T, fam uint8, text string, seed uint64) {
		fm := Family(fam % 3)
		content, calls := ParseToolCalls(fm, text)
		for _, c := range calls {
			var o map[string]any
			if c.Name == "" || json.Unmarshal([]byte(c.Arguments), &o) != nil || o == nil {
				t.Fatalf("%q: bad call %+v", text, c)
			}
		}
		sc, scalls := streamAll(fm, text, rand.New(rand.NewPCG(seed, 0)))
		if fm == Hermes && strings.Count(text, hermesOpen) != len(calls) {
			return // a block that is not a call: the stream may have named it already
		}
		if sc != content || !reflect.DeepEqual(scalls, calls) {
			t.Fatalf("%v %q: streamed %q %v, whole %q %v", fm, text, sc, scalls, content, calls)
		}
	})
}

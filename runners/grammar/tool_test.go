package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

var testTools = []Tool{
	{Name: "get_weather", Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false}`)},
	{Name: "add", Parameters: []byte(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`)},
	{Name: "noargs"},
}

var hermes = CallFormat{Prefix: "<tool_call>\n", Suffix: "\n</tool_call>", Separator: "\n", ArgsKey: "arguments"}

func TestToolCallsGrammar(t *testing.T) {
	par := hermes
	par.Parallel = true
	llama := CallFormat{ArgsKey: "parameters"}
	mistral := CallFormat{List: true, ListPrefix: "[TOOL_CALLS]", ArgsKey: "arguments", Parallel: true}
	cases := []struct {
		f   CallFormat
		ok  []string
		bad []string
	}{
		{hermes, []string{
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			"<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>",
			"<tool_call>\n{\"name\": \"noargs\", \"arguments\": {\"anything\": [1]}}\n</tool_call>",
		}, []string{
			"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
			"<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
			"<tool_call>\n{\"arguments\": {\"a\": 1, \"b\": 2}, \"name\": \"add\"}\n</tool_call>",
			"{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}",
			"<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>\n<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>",
			"Sure! <tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>",
		}},
		{par, []string{
			"<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"unit\":\"c\"}}\n</tool_call>",
		}, nil},
		{llama, []string{`{"name": "add", "parameters": {"a": 1, "b": 2}}`}, []string{`{"name": "add", "arguments": {"a": 1, "b": 2}}`}},
		{mistral, []string{`[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "noargs", "arguments": {}}]`}, []string{`[TOOL_CALLS][]`, `[{"name": "add", "arguments": {"a": 1, "b": 2}}]`}},
	}
	for _, c := range cases {
		g, err := ToolCalls(testTools, c.f)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range c.ok {
			if !complete(g, d) {
				t.Errorf("%+v: %q rejected", c.f, d)
			}
		}
		for _, d := range c.bad {
			if complete(g, d) {
				t.Errorf("%+v: %q accepted", c.f, d)
			}
		}
	}
	if _, err := ToolCalls([]Tool{{Name: "x", Parameters: []byte(`{"type":"object","patternProperties":{"^a":{}}}`)}}, hermes); err == nil || !strings.Contains(err.Error(), "patternProperties") || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("unsupported keyword in a tool: err %v, want one naming the tool and the keyword", err)
	}
}

// TestToolCallsGenerated generates calls under random mask-respecting
// choices and checks each is a call of an offered tool whose arguments
// validate under its schema (independent validator).
func TestToolCallsGenerated(t *testing.T) {
	f := hermes
	f.Parallel = true
	g, err := ToolCalls(testTools, f)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]interface{ Validate(any) error }{}
	for _, tl := range testTools {
		if tl.Parameters != nil {
			vals[tl.Name] = independentValidator(t, string(tl.Parameters))
		}
	}
	for _, nv := range testVocabs(t) {
		t.Run(nv.name, func(t *testing.T) {
			for run := range 8 {
				r := rand.New(rand.NewPCG(7, uint64(run)))
				out := generate(t, nv.v, NewConstraint(g, nv.v), r)
				s := strings.TrimLeft(string(out), " \t\r\n")
				calls := 0
				for s != "" {
					s = strings.TrimPrefix(s, "\n")
					if !strings.HasPrefix(s, f.Prefix) {
						t.Fatalf("%q: no %q", out, f.Prefix)
					}
					end := strings.Index(s, f.Suffix)
					if end < 0 {
						t.Fatalf("%q: no %q", out, f.Suffix)
					}
					var call struct {
						Name      string
						Arguments json.RawMessage
					}
					if err := json.Unmarshal([]byte(s[len(f.Prefix):end]), &call); err != nil {
						t.Fatalf("%q: %v", out, err)
					}
					calls++
					if v, ok := vals[call.Name]; ok {
						inst, err := unmarshalInstance(call.Arguments)
						if err != nil {
							t.Fatal(err)
						}
						if err := v.Validate(inst); err != nil {
							t.Fatalf("%q: arguments of %s: %v", out, call.Name, err)
						}
					} else if call.Name != "noargs" {
						t.Fatalf("%q: call of %q, not an offered tool", out, call.Name)
					}
					s = s[end+len(f.Suffix):]
				}
				if calls == 0 {
					t.Fatalf("%q: no call", out)
				}
			}
		})
	}
}

func TestSpecialTokenSpellsWrapper(t *testing.T) {
	toks := [][]byte{[]byte("[TOOL_CALLS]"), []byte("<eos>")}
	for b := 0; b < 256; b++ {
		toks = append(toks, []byte{byte(b)})
	}
	v, err := NewVocab(len(toks), func(id int32) []byte { return toks[id] }, func(id int32) bool { return id == 0 }, []int32{1})
	if err != nil {
		t.Fatal(err)
	}
	g, err := ToolCalls(testTools, CallFormat{List: true, ListPrefix: "[TOOL_CALLS]", ArgsKey: "arguments"})
	if err != nil {
		t.Fatal(err)
	}
	c := NewConstraint(g, v)
	mask := make([]uint64, v.MaskWords())
	c.Mask(mask)
	if mask[0]&1 == 0 {
		t.Fatal("the special [TOOL_CALLS] token is not allowed where the format starts with it")
	}
	if err := c.Accept(0); err != nil {
		t.Fatal(err)
	}
	c.Mask(mask)
	if mask[0]&1 != 0 || mask[('['+2)/64]&(1<<(('['+2)%64)) == 0 {
		t.Fatal("after [TOOL_CALLS]: want '[' allowed and the special token refused")
	}
	g2 := mustCompile(t, `{"type":"string"}`)
	c2 := NewConstraint(g2, v)
	if err := c2.Accept(0); err == nil {
		t.Fatal("a special token accepted by a schema without wrappers")
	}
}

func unmarshalInstance(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	return v, d.Decode(&v)
}

func TestToolCallsOr(t *testing.T) {
	g, err := ToolCallsOr(testTools, hermes, []byte(`{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", `{"x": 3}`} {
		if !complete(g, d) {
			t.Errorf("%q rejected", d)
		}
	}
	for _, d := range []string{`{"x": "3"}`, "hello", `{"name": "add", "arguments": {"a": 1, "b": 2}}`} {
		if complete(g, d) {
			t.Errorf("%q accepted", d)
		}
	}
	if g, err = ToolCallsOr(testTools, hermes, nil); err != nil || !complete(g, `{"any": [1]}`) {
		t.Errorf("json_object alternative: %v", err)
	}
}

// TestSharedMasksAcrossGenerations: generations of one grammar, run at
// once, share masks by state and still get each state's own mask (checked
// against a grammar of its own that shares nothing).
func TestSharedMasksAcrossGenerations(t *testing.T) {
	v := syntheticVocab(t)
	g := mustCompile(t, benchSchema)
	doc := []byte(`{"user": {"name": "Ada", "age": 36, "emails": ["a@b"]}, "orders": [], "tags": ["x"]}`)
	done := make(chan error, 4)
	for range 4 {
		go func() {
			c := NewConstraint(g, v)
			fresh := NewConstraint(mustCompile(t, benchSchema), v)
			fresh.cache = nil
			a, b := make([]uint64, v.MaskWords()), make([]uint64, v.MaskWords())
			for _, ch := range doc {
				id := int32(ch) // the synthetic vocabulary's first 256 ids are the bytes
				c.Mask(a)
				fresh.Mask(b)
				if !slices.Equal(a, b) {
					done <- fmt.Errorf("shared mask differs at %q", ch)
					return
				}
				if err := c.Accept(id); err != nil {
					done <- err
					return
				}
				if err := fresh.Accept(id); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if len(g.shared.m) == 0 {
		t.Fatal("nothing was shared")
	}
}

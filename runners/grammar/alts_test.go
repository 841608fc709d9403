package grammar

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// manyTools returns n tools whose names share a long prefix (so every
// call stays ambiguous while the name is written) and whose parameters
// differ by tool.
func manyTools(n int) []Tool {
	tools := make([]Tool, n)
	for i := range tools {
		tools[i] = Tool{
			Name:       fmt.Sprintf("lookup_record_%03d", i),
			Parameters: []byte(fmt.Sprintf(`{"type":"object","properties":{"p%d":{"type":"integer"},"note":{"type":"string"}},"required":["p%d"],"additionalProperties":false}`, i, i)),
		}
	}
	return tools
}

// TestManyAlternativesNotDropped: a grammar with more open alternatives
// than the matcher once kept (32) must still accept every valid document
// and refuse the invalid ones: a call to each of 64 tools, and each of
// 100 object shapes of a wide anyOf. Before the fix the later tools were
// silently unreachable.
func TestManyAlternativesNotDropped(t *testing.T) {
	tools := manyTools(64)
	for _, f := range []CallFormat{hermes, {ArgsKey: "parameters"}, {List: true, ListPrefix: "[TOOL_CALLS]", ArgsKey: "arguments", Parallel: true}} {
		g, err := ToolCalls(tools, f)
		if err != nil {
			t.Fatal(err)
		}
		wrap := func(call string) string {
			switch {
			case f.List:
				return f.ListPrefix + "[" + call + "]"
			case f.Prefix != "":
				return f.Prefix + call + f.Suffix
			}
			return call
		}
		for i, tool := range tools {
			ok := fmt.Sprintf(`{"name": %q, %q: {"p%d": %d, "note": "x"}}`, tool.Name, f.ArgsKey, i, i)
			if !complete(g, wrap(ok)) {
				t.Errorf("%+v: a valid call to tool %d refused: %s", f, i, ok)
			}
			// Another tool's parameter name: invalid for this tool.
			bad := fmt.Sprintf(`{"name": %q, %q: {"p%d": 1}}`, tool.Name, f.ArgsKey, (i+1)%len(tools))
			if complete(g, wrap(bad)) {
				t.Errorf("%+v: an invalid call to tool %d accepted: %s", f, i, bad)
			}
		}
	}

	var branches []string
	for i := range 100 {
		branches = append(branches, fmt.Sprintf(`{"type":"object","properties":{"kind":{"const":"k"},"v%d":{"type":"boolean"}},"required":["kind","v%d"],"additionalProperties":false}`, i, i))
	}
	g := mustCompile(t, `{"anyOf":[`+strings.Join(branches, ",")+`]}`)
	for i := range 100 {
		if d := fmt.Sprintf(`{"kind":"k","v%d":true}`, i); !complete(g, d) {
			t.Errorf("anyOf branch %d refused: %s", i, d)
		}
	}
	if complete(g, `{"kind":"k","v100":true}`) {
		t.Error("a key of no branch accepted")
	}
}

// TestManyToolsMaskReachesLastTool walks a constraint token by token
// (synthetic vocabulary, one byte a token) through a call to the last of
// 50 tools: at every step the mask must allow the next byte.
func TestManyToolsMaskReachesLastTool(t *testing.T) {
	v := syntheticVocab(t)
	tools := manyTools(50)
	g, err := ToolCalls(tools, hermes)
	if err != nil {
		t.Fatal(err)
	}
	c := NewConstraint(g, v)
	mask := make([]uint64, v.MaskWords())
	doc := "<tool_call>\n" + `{"name": "lookup_record_049", "arguments": {"p49": 7}}` + "\n</tool_call>"
	for i := 0; i < len(doc); i++ {
		c.Mask(mask)
		id := int32(doc[i]) // the synthetic vocabulary's first 256 tokens are the bytes
		if mask[id/64]&(1<<(id%64)) == 0 {
			t.Fatalf("byte %d (%q) masked out after %q", i, doc[i], doc[:i])
		}
		if err := c.Accept(id); err != nil {
			t.Fatalf("Accept %q after %q: %v", doc[i], doc[:i], err)
		}
	}
	if !c.CanEnd() {
		t.Fatal("complete call cannot end")
	}
}

// TestTooAmbiguousFailsLoudly: a recursive schema whose branches stay
// ambiguous doubles its open alternatives at every level; past
// MaxAlternatives the matcher must refuse with ErrTooAmbiguous, never
// drop alternatives and carry on.
func TestTooAmbiguousFailsLoudly(t *testing.T) {
	g := mustCompile(t, `{"anyOf":[{"$ref":"#/$defs/a"},{"$ref":"#/$defs/b"}],
		"$defs":{
		  "a":{"type":"object","properties":{"x":{"anyOf":[{"$ref":"#"},{"type":"integer"}]}},"required":["x"],"additionalProperties":false},
		  "b":{"type":"object","properties":{"x":{"anyOf":[{"$ref":"#"},{"type":"string"}]}},"required":["x"],"additionalProperties":false}}}`)
	m := g.NewMatcher()
	var err error
	for depth := 0; depth < 40 && err == nil; depth++ {
		err = m.Advance([]byte(`{"x":`))
	}
	if !errors.Is(err, ErrTooAmbiguous) {
		t.Fatalf("err = %v, want ErrTooAmbiguous", err)
	}
	// Shallow nesting of the same schema still works.
	if !complete(g, `{"x":{"x":{"x":1}}}`) || !complete(g, `{"x":{"x":"s"}}`) {
		t.Fatal("shallow documents refused")
	}
}

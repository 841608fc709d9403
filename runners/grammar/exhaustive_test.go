package grammar

import "testing"

// TestMaskMatchesMatcherExhaustive compares the trie walk with the
// matcher on every token of each vocabulary, in states that take each
// fast path (plain string bodies, escapes, additional keys, declared
// keys, numbers, the end).
func TestMaskMatchesMatcherExhaustive(t *testing.T) {
	cases := []struct{ schema, prefix string }{
		{benchSchema, `{"user": {"name": "`},
		{benchSchema, `{"user": {"name": "a\"`},
		{benchSchema, `{"user": {"name": "a\u00e9`},
		{benchSchema, "{\"user\": {\"name\": \"a\xc3"},
		{benchSchema, "{\"user\": {\"name\": \"a\xe0"},
		{benchSchema, `{"user": {"name": "Ada", "age": 3`},
		{benchSchema, `{"user": {"`},
		{benchSchema, `{"user": {"name": "Ada", "age": 36, "emails": []}, "orders": [{"id": 1, "lines": [], "status": "`},
		{`{"type":"object"}`, `{"`},
		{`{"type":"object"}`, `{"ab`},
		{`{"type":"object","properties":{"abc":{"type":"integer"}}}`, `{"ab`},
		{`{"type":"string","maxLength":3}`, `"ab`},
		{`{"type":"number"}`, `-1.5`},
		{`{"type":"integer","minimum":10,"maximum":2000}`, `1`},
		{`{"type":"integer","minimum":-50,"maximum":-3}`, `-`},
		{`{"enum":["x","xy"]}`, `"x`},
	}
	for _, nv := range testVocabs(t) {
		t.Run(nv.name, func(t *testing.T) {
			v := nv.v
			mask := make([]uint64, v.MaskWords())
			for _, c := range cases {
				g := mustCompile(t, c.schema)
				con := NewConstraint(g, v)
				if err := con.m.Advance([]byte(c.prefix)); err != nil {
					t.Fatalf("%s: prefix %q: %v", c.schema, c.prefix, err)
				}
				con.Mask(mask)
				bad := 0
				for id := int32(0); int(id) < v.Size(); id++ {
					in := mask[id/64]&(1<<(id%64)) != 0
					var want bool
					if v.IsEOS(id) {
						want = con.m.CanEnd()
					} else if b := v.TokenBytes(id); b != nil {
						want = con.m.Accepts(b)
					}
					if in != want {
						if bad++; bad <= 5 {
							t.Errorf("%s after %q: token %d %q: mask %v, matcher %v", c.schema, c.prefix, id, v.TokenBytes(id), in, want)
						}
					}
				}
			}
		})
	}
}

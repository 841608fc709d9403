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
		// Pattern strings: the body table (with the length bound left,
		// both ways), multi-byte characters, escapes, accept-all states.
		{benchPatternSchema, `{"id": "`},
		{benchPatternSchema, `{"id": "123e`},
		{benchPatternSchema, `{"id": "123e4567-e89b-12d3-a456-426614174000", "created": "2024-02-2`},
		{benchPatternSchema, `{"id": "123e4567-e89b-12d3-a456-426614174000", "created": "2024-05-01T12:30:00Z", "email": "ada.l`},
		{`{"type":"string","pattern":"^[A-Za-z ,.'-]+$","maxLength":5}`, `"abc`},
		{`{"type":"string","pattern":"^[A-Za-z ,.'-]+$","maxLength":5}`, `"a`},
		{`{"type":"string","pattern":"^[a-z]+$","minLength":12}`, `"abcdefgh`},
		{`{"type":"string","pattern":"^(ab)+$","minLength":12}`, `"abab`},
		{`{"type":"string","pattern":"^[a-zé日]+\\.?$","maxLength":4}`, `"é`},
		{`{"type":"string","pattern":"^[a-zé日]+\\.?$","maxLength":4}`, "\"a\xe6"},
		{`{"type":"string","pattern":"^[a-zé日]+\\.?$"}`, `"a\u00`},
		{`{"type":"string","pattern":"^[a-zé日]+\\.?$"}`, `"a\`},
		{`{"type":"string","pattern":"x","maxLength":6}`, `"ax`},
		{`{"type":"string","pattern":"x"}`, `"ax`},
		{`{"type":"string","pattern":"\\S"}`, `"`},
		{`{"type":"array","items":{"type":"string","format":"ipv4"}}`, `["1.2.3.4", "25`},
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
				// The same state masked again (past the mask cache): a
				// pattern string's state takes its token table from the
				// second time on; every way gives the same mask.
				for range 2 {
					again := make([]uint64, v.MaskWords())
					con.w.mask(con.m.alts, again)
					if con.m.CanEnd() { // Mask adds the end tokens
						for _, e := range v.eos {
							again[e/64] |= 1 << (e % 64)
						}
					}
					for i := range again {
						if again[i] != mask[i] {
							t.Fatalf("%s after %q: the state's mask differs when computed again (word %d)", c.schema, c.prefix, i)
						}
					}
				}
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

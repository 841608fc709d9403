package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonString encodes s as a JSON string, escaping code point i of it as
// \uXXXX where esc says (BMP only).
func jsonString(s string, esc func(i int) bool) string {
	var b strings.Builder
	b.WriteByte('"')
	i := 0
	for _, r := range s {
		switch {
		case r < 0x10000 && esc(i):
			fmt.Fprintf(&b, `\u%04x`, r)
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
		i++
	}
	b.WriteByte('"')
	return b.String()
}

// TestPatternExact: a value completes under {"pattern": p} (with length
// bounds) exactly when Go's regexp finds p in it and its length is in
// bounds, whether its characters come raw or escaped; and every prefix
// the matcher takes can still be completed (no dead end).
func TestPatternExact(t *testing.T) {
	alphabet := []rune{'a', 'b', 'c', '1', '-', '.', '@', 'é', '日', '\n', '"', '\\', '😀', 'A'}
	cases := []struct {
		pattern        string
		minLen, maxLen int
	}{
		{`^[a-c]+$`, 0, -1},
		{`ab`, 0, -1},
		{`^a|b$`, 0, -1},
		{`^(ab)*$`, 0, -1},
		{`^(ab)*$`, 2, 5},
		{`a.c`, 0, -1},
		{`^[^a]*$`, 1, 3},
		{`^\d{2,3}-?$`, 0, -1},
		{`^(?i)abc$`, 0, -1}, // samples: "aBc" etc. come from extra
		{`é|日`, 0, 4},
		{`^\w+@\w+\.\w{2,}$`, 0, -1},
		{`^[ab]*c$`, 0, -1},
		{`^\x{1F600}|A$`, 0, -1},
		{`^(a|b)*c$`, 3, -1},
		{`\A[a-z\n]*\z`, 0, 2},
		{`^$`, 0, -1},
		{`^[\x{0}-\x{10FFFF}]{2}$`, 0, -1},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range cases {
		schema := map[string]any{"type": "string", "pattern": c.pattern}
		if c.minLen > 0 {
			schema["minLength"] = c.minLen
		}
		if c.maxLen >= 0 {
			schema["maxLength"] = c.maxLen
		}
		sb, _ := json.Marshal(schema)
		g := mustCompile(t, string(sb))
		re := regexp.MustCompile(c.pattern)
		want := func(s string) bool {
			n := utf8.RuneCountInString(s)
			return re.MatchString(s) && n >= c.minLen && (c.maxLen < 0 || n <= c.maxLen)
		}
		var yes int
		extra := []string{"aBc", "ABC", "abc", "a1@b.cc", "abbc", "ab", "aabc", "1é日", "12-", "123", "1234"}
		for i := range 400 + len(extra) {
			var s string
			if i < len(extra) {
				s = extra[i]
			} else {
				var rs []rune
				for range r.IntN(7) {
					rs = append(rs, alphabet[r.IntN(len(alphabet))])
				}
				s = string(rs)
			}
			for vi, esc := range []func(int) bool{func(int) bool { return false }, func(int) bool { return true }, func(i int) bool { return i%2 == 1 }} {
				doc := jsonString(s, esc)
				got := complete(g, doc)
				if got != want(s) {
					t.Fatalf("pattern %q [%d,%d]: %s completes %v, regexp says %v", c.pattern, c.minLen, c.maxLen, doc, got, want(s))
				}
				if got {
					yes++
				}
				// No prefix the matcher takes is a dead end.
				if vi == 1 && i%4 != 0 {
					continue
				}
				m := g.NewMatcher()
				for k := 0; k < len(doc); k++ {
					if m.Advance([]byte{doc[k]}) != nil {
						break
					}
					if !completable(m) {
						t.Fatalf("pattern %q: after %q no continuation completes", c.pattern, doc[:k+1])
					}
				}
			}
		}
		if yes == 0 {
			t.Errorf("pattern %q: no sample matched; the test proves little", c.pattern)
		}
	}
}

// completable reports whether m can end or take some byte: the mask
// never comes out empty (the automata keep only states that reach an
// accepting one, so taking bytes ends somewhere).
func completable(m *Matcher) bool {
	if m.CanEnd() {
		return true
	}
	for b := range 256 {
		if m.Accepts([]byte{byte(b)}) {
			return true
		}
	}
	return false
}

// TestFormats: values of each format that the independent validator
// (format assertions on) accepts complete, values it refuses do not.
func TestFormats(t *testing.T) {
	cases := map[string]struct{ ok, bad []string }{
		"date":      {[]string{"2024-02-29", "2000-02-29", "1999-12-31", "0001-01-01"}, []string{"2023-02-29", "1900-02-29", "2023-04-31", "2023-13-01", "2023-1-01", "20230101", ""}},
		"time":      {[]string{"23:59:59Z", "00:00:00.123+05:30", "12:30:00-08:00"}, []string{"24:00:00Z", "12:60:00Z", "12:00:00", "12:00Z"}},
		"date-time": {[]string{"2024-02-29T12:00:00Z", "1985-04-12T23:20:50.52-07:00"}, []string{"2024-02-30T12:00:00Z", "2024-02-29 12:00:00Z", "2024-02-29T12:00:00"}},
		"duration":  {[]string{"P1Y2M3DT4H5M6S", "P3W", "PT1M", "P1D", "PT36H"}, []string{"P", "PT", "P1H", "1Y", "P1S", "P1M1Y"}},
		"email":     {[]string{"a@b.co", "first.last+tag@example.org", "x_y@localhost"}, []string{"a..b@c.d", ".a@b.c", "a@", "@b.c", "a b@c.d", "a@-b.c"}},
		"hostname":  {[]string{"example.com", "a-b.c1", "localhost"}, []string{"-a.com", "a-.com", "a..b", "a_b.com", ""}},
		"ipv4":      {[]string{"192.168.0.1", "0.0.0.0", "255.255.255.255"}, []string{"256.1.1.1", "01.1.1.1", "1.1.1", "1.1.1.1.1"}},
		"ipv6":      {[]string{"::1", "::", "2001:db8::8a2e:370:7334", "fe80:0:0:0:0:0:0:1", "1:2:3:4:5:6:7::"}, []string{"1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", ":1"}},
		"uuid":      {[]string{"123e4567-e89b-12d3-a456-426614174000", "ABCDEFAB-1234-5678-9ABC-DEF012345678"}, []string{"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
		"uri":       {[]string{"https://example.com", "http://a.b:8080/p/q?x=1&y=%20#frag", "urn:isbn:0451450523", "mailto:a@b.c"}, []string{"example.com", "/relative", "http://a b", "http://x/%zz", ""}},
	}
	for name, c := range cases {
		schema := fmt.Sprintf(`{"type":"string","format":%q}`, name)
		g := mustCompile(t, schema)
		val := independentValidator(t, schema)
		for _, v := range c.ok {
			doc := jsonString(v, func(int) bool { return false })
			if err := validateDoc(val, doc); err != nil {
				t.Fatalf("%s: fixture %s is not valid: %v", name, doc, err)
			}
			if !complete(g, doc) {
				t.Errorf("%s: %s rejected", name, doc)
			}
		}
		for _, v := range c.bad {
			doc := jsonString(v, func(int) bool { return false })
			if complete(g, doc) {
				t.Errorf("%s: %s accepted", name, doc)
			}
		}
	}
	if _, err := Compile([]byte(`{"type":"string","format":"password"}`)); err == nil || !strings.Contains(err.Error(), "format password") {
		t.Errorf("unknown format: err %v, want one naming it", err)
	}
	// format applies to strings only: on other types it asserts nothing.
	if g := mustCompile(t, `{"type":"integer","format":"int64"}`); !complete(g, "12") {
		t.Error("integer with format int64 refused 12")
	}
}

func validateDoc(val *jsonschema.Schema, doc string) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(doc)))
	if err != nil {
		return err
	}
	return val.Validate(inst)
}

// TestPatternBounds: patterns past the bounds, and the constructions
// the automaton does not do, are refused by name.
func TestPatternBounds(t *testing.T) {
	for _, c := range []struct {
		pattern string
		want    string
	}{
		{`(a|b)*a(a|b){20}`, "pattern too complex"},         // 2^21 DFA states
		{strings.Repeat("(a|b)", 900) + "$", "too complex"}, // long
		{`((((a{100}){100}){100}){100})`, "pattern"},        // too large for regexp/syntax
		{`\bword\b`, `\b`},        // word boundaries
		{`(?m)^a$`, "multi-line"}, // line anchors
		{`(`, "pattern"},          // syntax
		{`^[a-z]{1000}$`, ""},     // large but fine (under the bounds)
		{`^(?:[a-z]+\.){0,30}[a-z]+$`, ""},
	} {
		s, _ := json.Marshal(map[string]any{"type": "string", "pattern": c.pattern})
		_, err := Compile(s)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%.40s: %v", c.pattern, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%.40s: err %v, want one naming %q", c.pattern, err, c.want)
		}
	}
	if _, err := Compile([]byte(`{"type":"string","pattern":"(a|b)*a(a|b){20}"}`)); !errors.Is(err, ErrPatternTooComplex) {
		t.Errorf("err %v, want ErrPatternTooComplex", err)
	}
	// Many patterns in one schema: bounded together.
	outer := map[string]any{}
	for j := range 6 {
		props := map[string]any{}
		for i := range 50 {
			props[fmt.Sprint("p", i)] = map[string]any{"type": "string", "pattern": fmt.Sprintf(`^[acegikmoqsuwy]{%d}$`, 500+i+j)}
		}
		outer[fmt.Sprint("o", j)] = map[string]any{"type": "object", "properties": props}
	}
	s, _ := json.Marshal(map[string]any{"type": "object", "properties": outer})
	if _, err := Compile(s); err == nil || !strings.Contains(err.Error(), "transitions") {
		t.Errorf("300 big patterns: err %v, want one about the schema's transitions", err)
	}
	// A pattern no value can match, or none within the length bounds.
	for _, s := range []string{`{"type":"string","pattern":"^a$","minLength":2}`, `{"type":"string","pattern":"[^\\x{0}-\\x{10FFFF}]"}`, `{"type":"string","pattern":"^$a"}`} {
		if _, err := Compile([]byte(s)); !errors.Is(err, ErrUnsatisfiable) {
			t.Errorf("%s: err %v, want ErrUnsatisfiable", s, err)
		}
	}
}

// TestPatternTablesConcurrent: generations on several goroutines share a
// format's automaton and its token tables (built as masks need them)
// and get the same masks (run with -race).
func TestPatternTablesConcurrent(t *testing.T) {
	v := syntheticVocab(t)
	g := mustCompile(t, `{"type":"array","items":{"type":"string","format":"email","maxLength":30}}`)
	prefix := []byte(`["ab`)
	want := make([]uint64, v.MaskWords())
	c0 := NewConstraint(g, v)
	if err := c0.AdvanceBytes(prefix); err != nil {
		t.Fatal(err)
	}
	c0.Mask(want)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			c := NewConstraint(g, v)
			if err := c.AdvanceBytes(prefix); err != nil {
				errs <- err
				return
			}
			got := make([]uint64, v.MaskWords())
			for range 3 {
				c.w.mask(c.m.alts, got)
				if !slices.Equal(got, want) {
					errs <- fmt.Errorf("mask differs")
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

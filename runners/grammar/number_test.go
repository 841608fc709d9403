package grammar

import (
	"math/big"
	"regexp"
	"strings"
	"testing"
)

// TestNumberAutomaton: on every string of up to 6 bytes over the bytes
// numbers are made of, the matcher of a number schema accepts exactly the
// prefixes of JSON numbers (at most MaxExponentDigits exponent digits) and
// can end exactly on whole ones; integers take no fraction or exponent,
// and minimum 0 takes no minus sign.
func TestNumberAutomaton(t *testing.T) {
	const alphabet = "01-+.eE"
	for _, c := range []struct {
		schema string
		whole  *regexp.Regexp
	}{
		{`{"type":"number"}`, regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]{1,2})?$`)},
		{`{"type":"integer"}`, regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)},
		{`{"type":"number","minimum":0}`, regexp.MustCompile(`^(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]{1,2})?$`)},
	} {
		g, err := Compile([]byte(c.schema))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		var walk func(s string)
		walk = func(s string) {
			n++
			m := g.NewMatcher()
			ok := m.Advance([]byte(s)) == nil
			// every partial number needs one more digit at most
			viable := c.whole.MatchString(s) || c.whole.MatchString(s+"0")
			if ok != viable {
				t.Fatalf("%s: %q accepted %v, want %v", c.schema, s, ok, viable)
			}
			if !ok {
				return
			}
			if end := m.CanEnd(); end != c.whole.MatchString(s) {
				t.Fatalf("%s: %q can end %v", c.schema, s, end)
			}
			if len(s) < 6 {
				for i := range len(alphabet) {
					walk(s + alphabet[i:i+1])
				}
			}
		}
		walk("")
		if n < 100 {
			t.Fatalf("%s: %d strings", c.schema, n)
		}
	}
}

// TestNumberBoundsExact: on every string of up to 7 bytes over
// "0125.-", a number schema with bounds and multipleOf completes exactly
// the JSON numbers (without exponent) whose value meets them, and every
// prefix it takes can still be completed (a search over the same bytes,
// up to 8 more: the constraints' candidates all have a few digits).
func TestNumberBoundsExact(t *testing.T) {
	const alphabet = "0125.-"
	syntax := regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?$`)
	for _, c := range []struct {
		schema string
		ok     func(v *big.Rat) bool
	}{
		{`{"type":"number","minimum":0,"maximum":1}`, func(v *big.Rat) bool { return v.Sign() >= 0 && v.Cmp(big.NewRat(1, 1)) <= 0 }},
		{`{"type":"number","exclusiveMinimum":-1.5,"exclusiveMaximum":2}`, func(v *big.Rat) bool { return v.Cmp(big.NewRat(-3, 2)) > 0 && v.Cmp(big.NewRat(2, 1)) < 0 }},
		{`{"type":"number","multipleOf":0.25}`, func(v *big.Rat) bool { return new(big.Rat).Quo(v, big.NewRat(1, 4)).IsInt() }},
		{`{"type":"number","multipleOf":0.5,"minimum":1,"exclusiveMaximum":10.5}`, func(v *big.Rat) bool {
			return new(big.Rat).Quo(v, big.NewRat(1, 2)).IsInt() && v.Cmp(big.NewRat(1, 1)) >= 0 && v.Cmp(big.NewRat(21, 2)) < 0
		}},
		{`{"type":"integer","multipleOf":5,"minimum":-20,"maximum":200}`, func(v *big.Rat) bool {
			return v.IsInt() && new(big.Rat).Quo(v, big.NewRat(5, 1)).IsInt() && v.Cmp(big.NewRat(-20, 1)) >= 0 && v.Cmp(big.NewRat(200, 1)) <= 0
		}},
		{`{"type":"number","maximum":-0.5}`, func(v *big.Rat) bool { return v.Cmp(big.NewRat(-1, 2)) <= 0 }},
	} {
		g := mustCompile(t, c.schema)
		integer := strings.Contains(c.schema, "integer")
		var walk func(s string)
		yes := 0
		walk = func(s string) {
			m := g.NewMatcher()
			if m.Advance([]byte(s)) != nil {
				return
			}
			want := syntax.MatchString(s) && !(integer && strings.Contains(s, "."))
			if want {
				v, _ := new(big.Rat).SetString(s)
				want = c.ok(v)
			}
			if m.CanEnd() != want {
				t.Fatalf("%s: %q completes %v, want %v", c.schema, s, m.CanEnd(), want)
			}
			if want {
				yes++
			}
			if !canComplete(m, alphabet, 8) {
				t.Fatalf("%s: %q is taken but nothing completes it", c.schema, s)
			}
			if len(s) < 7 {
				for i := range len(alphabet) {
					walk(s + alphabet[i:i+1])
				}
			}
		}
		walk("")
		if yes < 5 {
			t.Fatalf("%s: only %d numbers complete", c.schema, yes)
		}
		// and the refused ones: a bad value that is valid JSON
		for _, s := range []string{"3", "-3", "0.3", "1.1"} {
			v, _ := new(big.Rat).SetString(s)
			if complete(g, s) != (c.ok(v) && !(integer && strings.Contains(s, "."))) {
				t.Errorf("%s: %s", c.schema, s)
			}
		}
	}
}

// canComplete searches up to depth more bytes of alphabet for an end.
func canComplete(m *Matcher, alphabet string, depth int) bool {
	if m.CanEnd() {
		return true
	}
	if depth == 0 {
		return false
	}
	for i := range len(alphabet) {
		c := m.Clone()
		if c.Advance([]byte{alphabet[i]}) == nil && canComplete(c, alphabet, depth-1) {
			return true
		}
	}
	return false
}

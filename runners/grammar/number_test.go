package grammar

import (
	"regexp"
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

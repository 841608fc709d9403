package tokenizer

import (
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// regexPieces splits s with a backtracking regex engine that supports the
// lookahead (github.com/dlclark/regexp2, test-only): the reference for the
// hand-written matchers.
func regexPieces(t testing.TB, re *regexp2.Regexp, s string) []string {
	rs := []rune(s)
	var out []string
	last := 0
	m, err := re.FindRunesMatch(rs)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		if m.Index > last {
			out = append(out, string(rs[last:m.Index]))
		}
		out = append(out, string(rs[m.Index:m.Index+m.Length]))
		last = m.Index + m.Length
	}
	if err != nil {
		t.Fatal(err)
	}
	if last < len(rs) {
		out = append(out, string(rs[last:]))
	}
	return out
}

func ourPieces(sp splitter, s string) []string {
	var out []string
	sp.split(s, func(p string) { out = append(out, p) })
	return out
}

var splitRefs = []struct {
	name    string
	pattern string
	sp      splitter
}{
	{"gpt2", patternGPT2, regexSplit{}},
	{"llama3", patternLlama3, regexSplit{llama3: true, maxDigits: 3}},
	{"qwen2", patternQwen2, regexSplit{llama3: true, maxDigits: 1}},
}

func checkSplits(t *testing.T, s string) {
	for _, r := range splitRefs {
		re := regexp2.MustCompile(r.pattern, regexp2.Unicode)
		want := regexPieces(t, re, s)
		if got := ourPieces(r.sp, s); !slices.Equal(got, want) {
			t.Errorf("%s split of %q:\n got %q\nwant %q", r.name, s, got, want)
		}
	}
}

func TestSplitMatchesRegexEngine(t *testing.T) {
	for _, s := range texts(t) {
		checkSplits(t, s)
	}
	for _, s := range []string{
		"", " ", "  ", "a  b", "x \n\n y", "\r\n", " \r\n ", "'S'T'Re'VE'm'LL'd", "''s", "a'", "123456789",
		"   (x)  ", "\t\tz", "?!\n\n", " ?!\r\n", "\u00a0a", "\u3000日本", "x\u2028y", "٣٤٥٦ ½Ⅻ", " 12", "a1b2",
	} {
		checkSplits(t, s)
	}
}

// FuzzSplitMatchesRegexEngine compares the hand-written GPT-2 / Llama 3 /
// Qwen2 split matchers with a backtracking regex engine on arbitrary text.
func FuzzSplitMatchesRegexEngine(f *testing.F) {
	for _, s := range texts(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // the reference works on runes
		}
		checkSplits(t, s)
	})
}

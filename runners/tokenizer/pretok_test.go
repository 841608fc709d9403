package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
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
	{"o200k", patternO200k, o200kSplit{}},
}

// splitRefRegexes are splitRefs' patterns compiled once (with our category
// tables): compiling the large classes takes a while.
var splitRefRegexes = sync.OnceValue(func() []*regexp2.Regexp {
	out := make([]*regexp2.Regexp, len(splitRefs))
	for i, r := range splitRefs {
		// regexp2's (?i) does not fold ſ (U+017F) to s; Oniguruma's does
		p := strings.ReplaceAll(r.pattern, `(?i:'s|`, `(?i:'s|'ſ|`)
		out[i] = regexp2.MustCompile(withCategoryTables(p), regexp2.Unicode)
	}
	return out
})

func checkSplits(t *testing.T, s string) {
	for i, r := range splitRefs {
		re := splitRefRegexes()[i]
		want := regexPieces(t, re, s)
		if got := ourPieces(r.sp, s); !slices.Equal(got, want) {
			t.Errorf("%s split of %q:\n got %q\nwant %q", r.name, s, got, want)
		}
	}
}

func TestSplitMatchesRegexEngine(t *testing.T) {
	for _, s := range append(texts(t), broadTexts(t)...) {
		checkSplits(t, s)
	}
	for _, s := range []string{
		"", " ", "  ", "a  b", "x \n\n y", "\r\n", " \r\n ", "'S'T'Re'VE'm'LL'd", "''s", "a'", "123456789",
		"   (x)  ", "\t\tz", "?!\n\n", " ?!\r\n", "\u00a0a", "\u3000日本", "x\u2028y", "٣٤٥٦ ½Ⅻ", " 12", "a1b2",
		// o200k: upper/lower runs, marks, contractions after words, "/" after punctuation
		"HELLOworld", "helloWORLD", "ǅǆ", "\u0301a", "\u0301A", "!\u0301", "a\u0301B", "Ab'S", "AB's", "x'LL", " ;/\n/",
		"\u0301\u0302", "'s", " 'd", "Ⅻa", "ʰʰ", "ʰA", "Aʰa", "\U00010D50\U00010D70", "\U00010D70\U00010D50",
		"x'ſ y", "'ſa", "X'ſT", "it'ſ",
	} {
		checkSplits(t, s)
	}
}

// FuzzSplitMatchesRegexEngine compares the hand-written GPT-2 / Llama 3 /
// Qwen2 / o200k split matchers with a backtracking regex engine on
// arbitrary text.
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

// TestPreTokenizersMatchHF builds each Split pre-tokenizer of
// testdata/pretok_pieces.json (the GPT-2, Llama 3, Qwen2, o200k and
// DeepSeek V3 patterns, and every behavior with and without invert) and
// compares its pieces of texts.txt and texts_broad.txt with HF's
// pre_tokenize_str (as SHA-256 prefixes; make_fixtures.py). The broad
// texts hold letters Unicode 16 added, which Go's tables (15.0) lack.
func TestPreTokenizersMatchHF(t *testing.T) {
	b, err := os.ReadFile("testdata/pretok_pieces.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Configs []struct {
			Name         string
			PreTokenizer *component `json:"pre_tokenizer"`
			Hashes       []string
		}
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	ts := append(texts(t), broadTexts(t)...)
	for _, c := range f.Configs {
		if c.Name == "deepseek_v3" { // the same patterns as the GGUF "deepseek-v3" pre-tokenizer
			var ps []string
			for _, p := range c.PreTokenizer.Pretokenizers {
				ps = append(ps, *p.Pattern.Regex)
			}
			if !slices.Equal(ps, deepSeekV3Patterns) {
				t.Errorf("deepSeekV3Patterns %q differ from the fixture's %q", deepSeekV3Patterns, ps)
			}
		}
		t.Run(c.Name, func(t *testing.T) {
			if len(c.Hashes) != len(ts) {
				t.Fatalf("%d hashes for %d texts", len(c.Hashes), len(ts))
			}
			var tok Tokenizer
			if _, err := tok.setPreTokenizer(c.PreTokenizer); err != nil {
				t.Fatal(err)
			}
			bad := 0
			for i, s := range ts {
				pieces := []string{s}
				for _, sp := range tok.pretok {
					var next []string
					for _, p := range pieces {
						sp.split(p, func(x string) { next = append(next, x) })
					}
					pieces = next
				}
				sum := sha256.Sum256([]byte(strings.Join(pieces, "\x1f")))
				if got := hex.EncodeToString(sum[:8]); got != c.Hashes[i] {
					if bad++; bad <= 3 {
						t.Errorf("text %d %q: our pieces %q differ from HF's", i, s, pieces)
					}
				}
			}
		})
	}
	if len(f.Configs) < 16 {
		t.Fatalf("only %d configurations", len(f.Configs))
	}
}

// TestCategoryTables: letters Unicode 16 added are letters to our tables
// (Go's unicode package is at an older version), and a split pattern run by
// regexp2 sees them through withCategoryTables.
func TestCategoryTables(t *testing.T) {
	for _, c := range []struct {
		r     rune
		table string
	}{
		{0x10D50, "Lu"}, // GARAY CAPITAL LETTER A
		{0x10D70, "Ll"}, // GARAY SMALL LETTER A
		{0x11380, "Lo"}, // TULU-TIGALARI LETTER A
		{0x16D43, "Lo"}, // KIRAT RAI LETTER A
		{0x16D70, "Nd"}, // KIRAT RAI DIGIT ZERO
	} {
		if !unicode.Is(categoryTables[c.table], c.r) {
			t.Errorf("U+%04X not in %s (Unicode %s tables)", c.r, c.table, unicodeVersion)
		}
	}
	sp, err := splitterForPattern(`\p{L}+|\p{N}+|[^\p{L}\p{N}]+`)
	if err != nil {
		t.Fatal(err)
	}
	got := ourPieces(sp, "a\U00010D50\U00010D70!\U00016D70")
	if want := []string{"a\U00010D50\U00010D70", "!", "\U00016D70"}; !slices.Equal(got, want) {
		t.Errorf("regexp2 split with our tables: %q, want %q", got, want)
	}
}

// BenchmarkSplitO200k: the hand-written o200k split against the same
// pattern on regexp2 (with our category tables), on texts_broad.txt.
func BenchmarkSplitO200k(b *testing.B) {
	text := strings.Join(broadTexts(b), " ")
	re, err := splitterForPattern(withCategoryTables(patternO200k) + "|(?!)") // any change defeats the by-name match
	if err != nil {
		b.Fatal(err)
	}
	if _, ok := re.(lookaheadSplit); !ok {
		b.Fatalf("%T, want regexp2", re)
	}
	for _, c := range []struct {
		name string
		sp   splitter
	}{{"hand", o200kSplit{}}, {"regexp2", re}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				c.sp.split(text, func(string) {})
			}
		})
	}
}

package tokenizer

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The split patterns of HF byte-level BPE tokenizers, as they appear in
// tokenizer.json. They use a negative lookahead that Go's regexp lacks, so
// they are implemented by hand below (matchGPT2, matchLlama3) with the
// semantics of a leftmost-first backtracking engine (Oniguruma, which HF
// tokenizers uses).
const (
	patternGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	// the same contractions spelled case by case (as llama.cpp writes them)
	contractionsCI   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)`
	contractionsCase = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`
)

// splitter cuts one piece of text into smaller pieces (substrings, in order,
// covering the input exactly: pre-tokenization never drops bytes here).
type splitter interface {
	split(s string, emit func(string))
}

// regexSplit isolates the matches of a GPT-2-family pattern.
type regexSplit struct {
	llama3    bool // the Llama 3 / Qwen2 family; false: GPT-2
	maxDigits int  // Llama 3: 3, Qwen2: 1
}

// digitSplit isolates digits (\p{N}): each one (individual) or each run.
type digitSplit struct{ individual bool }

// lookaheadSplit isolates the matches of any other pattern, with a
// backtracking engine that has lookahead (github.com/dlclark/regexp2, .NET
// syntax, close to Oniguruma's for these patterns). Slower than the
// hand-written matchers; used for split patterns we do not know by name.
type lookaheadSplit struct{ re *regexp2.Regexp }

// splitterForPattern returns the splitter for a Split pre-tokenizer regex.
func splitterForPattern(p string) (splitter, error) {
	if strings.HasPrefix(p, contractionsCase) {
		p = contractionsCI + p[len(contractionsCase):]
	}
	switch p {
	case patternGPT2:
		return regexSplit{}, nil
	case patternLlama3:
		return regexSplit{llama3: true, maxDigits: 3}, nil
	case patternQwen2:
		return regexSplit{llama3: true, maxDigits: 1}, nil
	case patternO200k:
		return o200kSplit{}, nil
	}
	re, err := regexp2.Compile(withCategoryTables(p), regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("unsupported split pattern %q: %w", p, err)
	}
	re.MatchTimeout = 10 * time.Second
	return lookaheadSplit{re}, nil
}

func (g lookaheadSplit) split(s string, emit func(string)) {
	last := 0
	g.find(s, func(a, b int) {
		if a > last {
			emit(s[last:a])
		}
		if b > a {
			emit(s[a:b])
		}
		last = b
	})
	if last < len(s) { // the rest, also after a match timeout
		emit(s[last:])
	}
}

func (d digitSplit) split(s string, emit func(string)) {
	start := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.Is(tableN, r) {
			i += n
			continue
		}
		if i > start {
			emit(s[start:i])
		}
		j := i + n
		if !d.individual {
			for j < len(s) {
				r2, n2 := utf8.DecodeRuneInString(s[j:])
				if !unicode.Is(tableN, r2) {
					break
				}
				j += n2
			}
		}
		emit(s[i:j])
		i, start = j, j
	}
	if start < len(s) {
		emit(s[start:])
	}
}

func (x regexSplit) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		var j int
		if x.llama3 {
			j = matchLlama3(s, i, x.maxDigits)
		} else {
			j = matchGPT2(s, i)
		}
		emit(s[i:j])
		i = j
	}
}

type charClass uint8

const (
	clsLetter charClass = iota
	clsNumber
	clsSpace
	clsOther // [^\s\p{L}\p{N}]
)

func classOf(r rune) charClass {
	switch {
	case r < utf8.RuneSelf:
		switch {
		case 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z':
			return clsLetter
		case '0' <= r && r <= '9':
			return clsNumber
		case r == ' ' || '\t' <= r && r <= '\r':
			return clsSpace
		}
		return clsOther
	case unicode.Is(tableL, r):
		return clsLetter
	case unicode.Is(tableN, r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// runOf returns the end of the run of class c starting at i.
func runOf(s string, i int, c charClass) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if classOf(r) != c {
			break
		}
		i += n
	}
	return i
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at i (s[i] == '\”), returning
// the end or -1.
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) {
		return -1
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	if fold && strings.HasPrefix(s[i+1:], "ſ") { // U+017F folds to 's' (Oniguruma's (?i), as HF)
		return i + 1 + len("ſ")
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return i + 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return i + 3
		}
	}
	return -1
}

// spaceTail handles the last alternatives `\s+(?!\S)|\s+` at a whitespace
// rune at i: the whole run at the end of the text, else the run minus its
// last rune when that leaves at least one, else the single rune.
func spaceTail(s string, i int) int {
	end, last := i, i
	for end < len(s) {
		r, n := runeAt(s, end)
		if classOf(r) != clsSpace {
			break
		}
		last = end
		end += n
	}
	if end == len(s) || last == i {
		return end
	}
	return last
}

// matchGPT2 returns the end of the match of patternGPT2 at i.
func matchGPT2(s string, i int) int {
	r, n := runeAt(s, i)
	if r == '\'' {
		if j := contraction(s, i, false); j > 0 {
			return j
		}
	}
	if r == ' ' && i+n < len(s) {
		r2, _ := runeAt(s, i+n)
		if c := classOf(r2); c != clsSpace {
			return runOf(s, i+n, c)
		}
	}
	if c := classOf(r); c != clsSpace {
		return runOf(s, i, c)
	}
	return spaceTail(s, i)
}

// matchLlama3 returns the end of the match of patternLlama3 (maxDigits 3) or
// patternQwen2 (maxDigits 1) at i.
func matchLlama3(s string, i int, maxDigits int) int {
	r, n := runeAt(s, i)
	if r == '\'' {
		if j := contraction(s, i, true); j > 0 {
			return j
		}
	}
	c := classOf(r)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clsLetter {
		return runOf(s, i, clsLetter)
	}
	if c != clsNumber && r != '\r' && r != '\n' && i+n < len(s) {
		if r2, _ := runeAt(s, i+n); classOf(r2) == clsLetter {
			return runOf(s, i+n, clsLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if c == clsNumber {
		j := i + n
		for k := 1; k < maxDigits && j < len(s); k++ {
			r2, n2 := runeAt(s, j)
			if classOf(r2) != clsNumber {
				break
			}
			j += n2
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	p := i
	if r == ' ' && i+n < len(s) {
		if r2, _ := runeAt(s, i+n); classOf(r2) == clsOther {
			p = i + n
		}
	}
	if r2, _ := runeAt(s, p); classOf(r2) == clsOther {
		j := runOf(s, p, clsOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// here r is whitespace.
	return whitespaceEnd(s, i)
}

// bytesToRunes is GPT-2's reversible byte ↔ printable-rune mapping:
// printable Latin-1 bytes map to themselves, the rest to 256, 257, … in
// byte order.
func byteLevelTables() (b2r [256]rune, r2b map[rune]byte) {
	r2b = make(map[rune]byte, 256)
	next := rune(256)
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = next
			next++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}

// patternO200k is the split pattern of OpenAI's o200k vocabulary (GPT-4o,
// gpt-oss): words are an optional non-letter, then upper-case-ish letters
// and then lower-case-ish ones (or the reverse), each with an optional
// contraction; numbers in groups of up to three; "/" joins the newlines
// after punctuation.
const patternO200k = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// o200kSplit isolates the matches of patternO200k (hand-written, with the
// semantics of a leftmost-first backtracking engine, like regexSplit).
type o200kSplit struct{}

func (o200kSplit) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := matchO200k(s, i)
		emit(s[i:j])
		i = j
	}
}

// o200k character classes: upper-ish [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
// lower-ish [\p{Ll}\p{Lm}\p{Lo}\p{M}] (Lm, Lo and M are both).
const (
	o2Upper = 1 << iota
	o2Lower
)

func o200kClass(r rune) (charClass, uint8) {
	if r < utf8.RuneSelf {
		switch {
		case 'a' <= r && r <= 'z':
			return clsLetter, o2Lower
		case 'A' <= r && r <= 'Z':
			return clsLetter, o2Upper
		}
		return classOf(r), 0
	}
	switch {
	case unicode.Is(tableL, r):
		switch {
		case unicode.Is(tableLl, r):
			return clsLetter, o2Lower
		case unicode.Is(tableLu, r) || unicode.Is(tableLt, r):
			return clsLetter, o2Upper
		}
		return clsLetter, o2Upper | o2Lower // Lm, Lo
	case unicode.Is(tableM, r):
		return clsOther, o2Upper | o2Lower
	}
	return classOf(r), 0
}

// o200kWord matches [U]*[W]+ (upperFirst false) or [U]+[W]* (true) at p,
// then the optional contraction; it returns the end or -1.
func o200kWord(s string, p int, upperFirst bool) int {
	q, lastLower := p, -1 // end of the upper-ish run; end of its last lower-ish rune
	for q < len(s) {
		r, n := runeAt(s, q)
		_, k := o200kClass(r)
		if k&o2Upper == 0 {
			break
		}
		q += n
		if k&o2Lower != 0 {
			lastLower = q
		}
	}
	e := q
	for e < len(s) {
		r, n := runeAt(s, e)
		if _, k := o200kClass(r); k&o2Lower == 0 {
			break
		}
		e += n
	}
	switch {
	case upperFirst && q == p:
		return -1
	case !upperFirst && e == q: // [W]+ must give back runes of the upper-ish run
		if lastLower < 0 {
			return -1
		}
		e = lastLower
	}
	if e < len(s) && s[e] == '\'' {
		if j := contraction(s, e, true); j > 0 {
			return j
		}
	}
	return e
}

// matchO200k returns the end of the match of patternO200k at i.
func matchO200k(s string, i int) int {
	r, n := runeAt(s, i)
	c, _ := o200kClass(r)
	prefix := c != clsLetter && c != clsNumber && r != '\r' && r != '\n' && i+n < len(s)
	for _, upperFirst := range [2]bool{false, true} {
		if prefix {
			if j := o200kWord(s, i+n, upperFirst); j > 0 {
				return j
			}
		}
		if j := o200kWord(s, i, upperFirst); j > 0 {
			return j
		}
	}
	if c == clsNumber { // \p{N}{1,3}
		j := i + n
		for k := 1; k < 3 && j < len(s); k++ {
			r2, n2 := runeAt(s, j)
			if classOf(r2) != clsNumber {
				break
			}
			j += n2
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
	p := i
	if r == ' ' && i+n < len(s) {
		if r2, _ := runeAt(s, i+n); classOf(r2) == clsOther {
			p = i + n
		}
	}
	if r2, _ := runeAt(s, p); classOf(r2) == clsOther {
		j := runOf(s, p, clsOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
			j++
		}
		return j
	}
	// whitespace: `\s*[\r\n]+`, then `\s+(?!\S)|\s+`
	return whitespaceEnd(s, i)
}

// whitespaceEnd is where the piece starting with the whitespace at s[i]
// ends: `\s*[\r\n]+` (up to the run's last newline) when the run holds a
// newline, else spaceTail's `\s+(?!\S)|\s+`.
func whitespaceEnd(s string, i int) int {
	nl := -1
	for j := i; j < len(s); {
		r2, n2 := runeAt(s, j)
		if classOf(r2) != clsSpace {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			nl = j
		}
		j += n2
	}
	if nl >= 0 {
		return nl + 1
	}
	return spaceTail(s, i)
}

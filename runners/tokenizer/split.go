package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// behavior is what HF's Split pre-tokenizer does with the matches of its
// pattern (SplitDelimiterBehavior).
type behavior uint8

const (
	isolated   behavior = iota // each match and each gap is a piece
	removed                    // matches are dropped; gaps are pieces
	mergedPrev                 // a match joins the piece before it
	mergedNext                 // a match joins the piece after it
	contiguous                 // consecutive matches (and consecutive gaps) form one piece
)

var behaviors = map[string]behavior{
	"": isolated, "Isolated": isolated, "Removed": removed, "MergedWithPrevious": mergedPrev,
	"MergedWithNext": mergedNext, "Contiguous": contiguous,
}

// matcher finds the matches of a Split pattern in s, in order and without
// overlap (zero-length matches allowed).
type matcher interface {
	find(s string, match func(a, b int))
}

// patternSplit is HF's Split pre-tokenizer for any behavior: the text is
// cut into segments, the matches of the pattern and the gaps between them
// (with invert, the gaps count as the matches), and the segments are
// grouped into pieces by the behavior; empty pieces are dropped. (The
// common Isolated case without invert uses the matcher's own splitter.)
type patternSplit struct {
	m        matcher
	behavior behavior
	invert   bool
}

func (p patternSplit) split(s string, emit func(string)) {
	start, end := -1, -1 // the piece being built, if start >= 0
	held := false        // mergedNext: the piece is a match waiting for the gap after it
	prevMatch := false
	flush := func() {
		if start >= 0 && end > start {
			emit(s[start:end])
		}
		start, held = -1, false
	}
	segment := func(a, b int, isMatch bool) {
		m := isMatch != p.invert
		switch p.behavior {
		case isolated:
			if b > a {
				emit(s[a:b])
			}
		case removed:
			if !m && b > a {
				emit(s[a:b])
			}
		case contiguous:
			if start >= 0 && m == prevMatch {
				end = b
			} else {
				flush()
				start, end = a, b
			}
		case mergedPrev:
			if start >= 0 && m && !prevMatch {
				end = b
			} else {
				flush()
				start, end = a, b
			}
		case mergedNext:
			if held && !m {
				end = b
				flush()
				break
			}
			flush()
			start, end, held = a, b, m
		}
		prevMatch = m
	}
	if s == "" {
		return
	}
	last := 0
	p.m.find(s, func(a, b int) {
		if a > last {
			segment(last, a, false)
		}
		segment(a, b, true)
		last = b
	})
	if last < len(s) {
		segment(last, len(s), false)
	}
	flush()
}

// find implements matcher for a literal string: each occurrence.
func (d stringSplit) find(s string, match func(a, b int)) {
	if d == "" {
		return
	}
	for off := 0; ; {
		i := strings.Index(s[off:], string(d))
		if i < 0 {
			return
		}
		match(off+i, off+i+len(d))
		off += i + len(d)
	}
}

// find implements matcher for the hand-written patterns (every piece of
// their split is a match: the patterns cover all text).
func (x regexSplit) find(s string, match func(a, b int)) {
	i := 0
	x.split(s, func(p string) {
		match(i, i+len(p))
		i += len(p)
	})
}

func (x o200kSplit) find(s string, match func(a, b int)) {
	i := 0
	x.split(s, func(p string) {
		match(i, i+len(p))
		i += len(p)
	})
}

// find implements matcher with regexp2, on runes (invalid bytes: U+FFFD of
// width 1). As HF's iterator over Oniguruma's matches, it skips an empty
// match that starts where the previous match ended (regexp2 reports it).
func (g lookaheadSplit) find(s string, match func(a, b int)) {
	rs := make([]rune, 0, len(s))
	offs := make([]int, 0, len(s)+1)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		rs = append(rs, r)
		offs = append(offs, i)
		i += n
	}
	offs = append(offs, len(s))
	prevEnd := -1
	m, err := g.re.FindRunesMatch(rs)
	for ; m != nil && err == nil; m, err = g.re.FindNextMatch(m) {
		if m.Length == 0 && m.Index == prevEnd {
			continue
		}
		match(offs[m.Index], offs[m.Index+m.Length])
		prevEnd = m.Index + m.Length
	}
}

// withCategoryTables rewrites the \p{X} and \pX classes of a regex whose
// category our tables know (L, Lu, …, N, P, S: unicode_tables.go), so that
// regexp2 (which uses Go's older Unicode tables) matches as HF's Oniguruma
// does: \p{X} becomes [\p{X}…] with the code points Go's table lacks
// (inside brackets, just those added), or, where Go's table also has code
// points ours lacks (a category changed), the whole table as ranges. \P{X}
// outside brackets becomes the negated class; inside brackets it is left to
// regexp2.
func withCategoryTables(p string) string {
	var b strings.Builder
	inClass := false
	rs := []rune(p)
	classes := map[string]string{} // category → the inside of its class
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == '\\' && i+1 < len(rs) && (rs[i+1] == 'p' || rs[i+1] == 'P'):
			name, n := "", 0
			switch {
			case i+2 < len(rs) && rs[i+2] == '{':
				if j := indexRune(rs[i+3:], '}'); j >= 0 {
					name, n = string(rs[i+3:i+3+j]), 3+j+1
				}
			case i+2 < len(rs):
				name, n = string(rs[i+2]), 3
			}
			tab, ok := categoryTables[name]
			neg := rs[i+1] == 'P'
			if !ok || (neg && inClass) {
				b.WriteRune(r)
				continue
			}
			inner, ok := classes[name]
			if !ok {
				var w strings.Builder
				if added, exact := categoryDelta(name, tab); exact {
					fmt.Fprintf(&w, `\p{%s}`, name)
					writeRanges(&w, added)
				} else {
					writeRanges(&w, tab)
				}
				inner = w.String()
				classes[name] = inner
			}
			switch {
			case inClass:
				b.WriteString(inner)
			case neg:
				b.WriteString("[^" + inner + "]")
			default:
				b.WriteString("[" + inner + "]")
			}
			i += n - 1
		case r == '\\' && i+1 < len(rs):
			b.WriteRune(r)
			b.WriteRune(rs[i+1])
			i++
		case r == '[' && !inClass:
			inClass = true
			b.WriteRune(r)
			if i+1 < len(rs) && rs[i+1] == '^' {
				b.WriteRune('^')
				i++
			}
		case r == ']' && inClass:
			inClass = false
			b.WriteRune(r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// categoryDelta returns the code points of tab that Go's table of the same
// category lacks, and whether Go's table holds no code point tab lacks (so
// that Go's table plus the delta is exactly tab).
func categoryDelta(name string, tab *unicode.RangeTable) (*unicode.RangeTable, bool) {
	goTab, ok := unicode.Categories[name]
	if !ok {
		return nil, false
	}
	var added []unicode.Range32
	each(tab, func(r rune) bool {
		if !unicode.Is(goTab, r) {
			if k := len(added) - 1; k >= 0 && added[k].Hi == uint32(r)-1 {
				added[k].Hi++
			} else {
				added = append(added, unicode.Range32{Lo: uint32(r), Hi: uint32(r), Stride: 1})
			}
		}
		return true
	})
	exact := true
	each(goTab, func(r rune) bool {
		exact = unicode.Is(tab, r)
		return exact
	})
	return &unicode.RangeTable{R32: added}, exact
}

// each calls f with every code point of t until f returns false.
func each(t *unicode.RangeTable, f func(rune) bool) {
	for _, r := range t.R16 {
		for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
			if !f(c) {
				return
			}
		}
	}
	for _, r := range t.R32 {
		for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
			if !f(c) {
				return
			}
		}
	}
}

func indexRune(rs []rune, r rune) int {
	for i, x := range rs {
		if x == r {
			return i
		}
	}
	return -1
}

// writeRanges writes a table's ranges as the inside of a character class:
// \uXXXX escapes in the BMP, the characters themselves above it.
func writeRanges(b *strings.Builder, t *unicode.RangeTable) {
	one := func(r rune) {
		if r <= 0xFFFF {
			fmt.Fprintf(b, `\u%04X`, r)
		} else {
			b.WriteRune(r)
		}
	}
	rng := func(lo, hi, stride rune) {
		if stride != 1 {
			for r := lo; r <= hi; r += stride {
				one(r)
			}
			return
		}
		one(lo)
		if hi > lo {
			b.WriteByte('-')
			one(hi)
		}
	}
	for _, r := range t.R16 {
		rng(rune(r.Lo), rune(r.Hi), rune(r.Stride))
	}
	for _, r := range t.R32 {
		rng(rune(r.Lo), rune(r.Hi), rune(r.Stride))
	}
}

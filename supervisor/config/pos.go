package config

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Pos is a place in a cluster file, 1-based.
type Pos struct{ Line, Col int }

// keyPos records where one key (or array element) of the file starts. Path
// holds the key's components; array indexes are components that start with
// idxMark followed by the decimal index.
type keyPos struct {
	path []string
	pos  Pos
}

const idxMark = "\x00"

func idx(i int) string { return idxMark + strconv.Itoa(i) }

func joinPath(p []string) string { return strings.Join(p, ".") }

func stripIdx(p []string) string {
	out := make([]string, 0, len(p))
	for _, s := range p {
		if !strings.HasPrefix(s, idxMark) {
			out = append(out, s)
		}
	}
	return joinPath(out)
}

// scanPositions walks TOML text that the real parser has already accepted
// and records the position of every key and array element. It only needs to
// be right for valid TOML; on anything it does not understand it stops, and
// errors then fall back to the position of the enclosing key (or 1:1).
func scanPositions(src string) []keyPos {
	s := &scanner{src: src, line: 1, col: 1, arrays: map[string]int{}}
	defer func() { _ = recover() }() // malformed input: keep what we have
	s.document()
	return s.out
}

type scanner struct {
	src       string
	i         int
	line, col int
	out       []keyPos
	arrays    map[string]int // stripped array-table path → current index
}

func (s *scanner) eof() bool { return s.i >= len(s.src) }
func (s *scanner) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.i]
}
func (s *scanner) has(p string) bool { return strings.HasPrefix(s.src[s.i:], p) }
func (s *scanner) pos() Pos          { return Pos{s.line, s.col} }

func (s *scanner) adv() {
	r, n := utf8.DecodeRuneInString(s.src[s.i:])
	s.i += n
	if r == '\n' {
		s.line++
		s.col = 1
	} else {
		s.col++
	}
}

// skip skips spaces, tabs and comments; with nl also newlines.
func (s *scanner) skip(nl bool) {
	for !s.eof() {
		switch c := s.peek(); {
		case c == ' ' || c == '\t' || c == '\r':
			s.adv()
		case c == '\n' && nl:
			s.adv()
		case c == '#':
			for !s.eof() && s.peek() != '\n' {
				s.adv()
			}
		default:
			return
		}
	}
}

func (s *scanner) document() {
	var table []string
	for {
		s.skip(true)
		if s.eof() {
			return
		}
		if s.peek() == '[' {
			s.adv()
			array := s.peek() == '['
			if array {
				s.adv()
			}
			s.skip(false)
			at := s.pos()
			key := s.key()
			s.skip(false)
			s.adv()
			if array {
				s.adv()
			}
			table = s.resolve(key)
			if array {
				st := joinPath(key)
				n := -1
				if v, ok := s.arrays[st]; ok {
					n = v
				}
				s.arrays[st] = n + 1
				table = append(s.resolve(key), idx(n+1))
			}
			s.out = append(s.out, keyPos{clone(table), at})
			continue
		}
		s.keyval(table)
	}
}

// resolve inserts the current index of every array-of-tables prefix.
func (s *scanner) resolve(key []string) []string {
	var out []string
	for i, k := range key {
		out = append(out, k)
		if n, ok := s.arrays[joinPath(key[:i+1])]; ok && i < len(key)-1 {
			out = append(out, idx(n))
		}
	}
	return out
}

func clone(p []string) []string { return append([]string(nil), p...) }

func (s *scanner) keyval(table []string) {
	at := s.pos()
	key := s.key()
	path := append(clone(table), key...)
	s.out = append(s.out, keyPos{clone(path), at})
	s.skip(false)
	s.adv() // '='
	s.skip(false)
	s.value(path)
}

func (s *scanner) key() []string {
	var parts []string
	for {
		s.skip(false)
		switch s.peek() {
		case '"', '\'':
			parts = append(parts, s.str())
		default:
			start := s.i
			for !s.eof() {
				c := s.peek()
				if c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
					s.adv()
					continue
				}
				break
			}
			parts = append(parts, s.src[start:s.i])
		}
		s.skip(false)
		if s.peek() != '.' {
			return parts
		}
		s.adv()
	}
}

// str reads a quoted string and returns its (approximately unescaped) text.
func (s *scanner) str() string {
	q := s.peek()
	if s.has(`"""`) || s.has(`'''`) {
		end := strings.Repeat(string(q), 3)
		s.adv()
		s.adv()
		s.adv()
		start := s.i
		for !s.eof() && !s.has(end) {
			if q == '"' && s.peek() == '\\' {
				s.adv()
			}
			s.adv()
		}
		text := s.src[start:s.i]
		for s.peek() == q { // up to two extra quotes belong to the string
			s.adv()
		}
		return text
	}
	s.adv()
	var b strings.Builder
	for !s.eof() && s.peek() != q {
		if q == '"' && s.peek() == '\\' {
			s.adv()
		}
		b.WriteByte(s.peek())
		s.adv()
	}
	s.adv()
	return b.String()
}

func (s *scanner) value(path []string) {
	switch c := s.peek(); c {
	case '"', '\'':
		s.str()
	case '[':
		s.adv()
		for n := 0; ; n++ {
			s.skip(true)
			if s.peek() == ']' {
				s.adv()
				return
			}
			el := append(clone(path), idx(n))
			s.out = append(s.out, keyPos{el, s.pos()})
			s.value(el)
			s.skip(true)
			if s.peek() == ',' {
				s.adv()
			}
		}
	case '{':
		s.adv()
		for {
			s.skip(false)
			if s.peek() == '}' {
				s.adv()
				return
			}
			s.keyval(path)
			s.skip(false)
			if s.peek() == ',' {
				s.adv()
			}
		}
	default:
		for !s.eof() {
			switch s.peek() {
			case ',', ']', '}', '\n', '#', ' ', '\t', '\r':
				return
			}
			s.adv()
		}
	}
}

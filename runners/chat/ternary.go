package chat

import (
	"fmt"
	"iter"
	"strings"
)

// hoistConditionals works around gonja v2.9.1 parsing Jinja's conditional
// expression (`a if b else c`) only at the top of an expression: inside
// parentheses it fails ("Unbalanced parenthesis"), and Gemma 3's template
// writes `'…' + (first_user_prefix if loop.first else "")`. Each such
// parenthesized conditional inside a `{{ … }}` is moved into a
// `{% set __exo_condN = a if b else c %}` right before the output tag (same
// scope, still evaluated lazily as Jinja does) and replaced by the
// variable. A left whitespace-control dash moves to the inserted tag.
// Templates without such parentheses come back unchanged.
func hoistConditionals(src string) string {
	var out strings.Builder
	n := 0
	for {
		i := strings.Index(src, "{{")
		if i < 0 {
			out.WriteString(src)
			return out.String()
		}
		end := exprEnd(src, i+2)
		if end < 0 {
			out.WriteString(src)
			return out.String()
		}
		out.WriteString(src[:i])
		expr := src[i+2 : end]
		dash := strings.HasPrefix(expr, "-")
		if dash {
			expr = expr[1:]
		}
		var sets []string
		for {
			lo, hi, ok := innerConditional(expr)
			if !ok {
				break
			}
			name := fmt.Sprintf("__exo_cond%d", n)
			n++
			sets = append(sets, fmt.Sprintf("set %s = %s", name, expr[lo+1:hi]))
			expr = expr[:lo] + name + expr[hi+1:]
		}
		for k, s := range sets {
			if k == 0 && dash {
				out.WriteString("{%- " + s + " %}")
			} else {
				out.WriteString("{% " + s + " %}")
			}
		}
		out.WriteString("{{")
		if dash && len(sets) == 0 {
			out.WriteString("-")
		}
		out.WriteString(expr + "}}")
		src = src[end+2:]
	}
}

// exprEnd returns the index of the "}}" closing an output tag whose body
// starts at from, skipping string literals; -1 if none.
func exprEnd(s string, from int) int {
	for i, c := range code(s, from) {
		if c == '}' && i+1 < len(s) && s[i+1] == '}' {
			return i
		}
	}
	return -1
}

// code yields the bytes of s from index from that lie outside Jinja string
// literals ('…' or "…", with backslash escapes), with their indexes: the
// one lexer the scanners here share.
func code(s string, from int) iter.Seq2[int, byte] {
	return func(yield func(int, byte) bool) {
		var quote byte
		for i := from; i < len(s); i++ {
			c := s[i]
			switch {
			case quote != 0:
				if c == '\\' {
					i++
				} else if c == quote {
					quote = 0
				}
			case c == '\'' || c == '"':
				quote = c
			default:
				if !yield(i, c) {
					return
				}
			}
		}
	}
}

// innerConditional finds an innermost parenthesized group of expr holding
// the words "if" and "else" at its own depth (outside strings) and returns
// the indexes of its parentheses.
func innerConditional(expr string) (lo, hi int, ok bool) {
	var stack []int
	for i, c := range code(expr, 0) {
		switch {
		case c == '(':
			stack = append(stack, i)
		case c == ')' && len(stack) > 0:
			open := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if hasWordsAtTop(expr[open+1:i], "if", "else") {
				return open, i, true
			}
		}
	}
	return 0, 0, false
}

// hasWordsAtTop reports whether s has every word as a whole word outside
// strings and nested parentheses or brackets.
func hasWordsAtTop(s string, words ...string) bool {
	found := map[string]bool{}
	depth := 0
	isIdent := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i, c := range code(s, 0) {
		switch {
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case depth == 0 && isIdent(c) && (i == 0 || !isIdent(s[i-1])):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			found[s[i:j]] = true
		}
	}
	for _, w := range words {
		if !found[w] {
			return false
		}
	}
	return true
}

package chat

import (
	"errors"
	"regexp"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// Fixes for gonja v2.9.1 where it departs from Python/Jinja semantics that
// HF chat templates rely on (each is covered by testdata/features.jinja):
//   - list[-n] with n == len(list) yields None (messages[-1] of a one-message
//     conversation): the messages list is an ItemGetter with Python indexing;
//   - str.split() without a separator fails (Python splits on whitespace runs);
//   - str.replace(old, new) without a count fails;
//   - lstrip_blocks strips the spaces before any block tag, also mid-line
//     ("{{ x }} {% endfor %}" loses its space): we apply Jinja's rule (only
//     whitespace from the start of a line) to the source instead.
//
// Known remaining differences: a variable bound to None (tools, documents) is
// "not defined" for gonja, Jinja says defined (templates test "tools is not
// none" or default tools to none when undefined, which behaves the same);
// gonja drops the newline right after "{% raw %}", Jinja keeps it.

// pyList is a list with Python indexing (negative indexes count from the end).
type pyList []any

// GetItem implements exec.ItemGetter.
func (l pyList) GetItem(key any) (*exec.Value, bool) {
	i, ok := key.(int)
	if !ok {
		return exec.AsValue(nil), false
	}
	if i < 0 {
		i += len(l)
	}
	if i < 0 || i >= len(l) {
		return exec.AsValue(nil), false
	}
	return exec.AsValue(l[i]), true
}

// strMethodNames are gonja's string methods, delegated to as they are.
var strMethodNames = []string{
	"capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
	"format_map", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "islower", "isnumeric",
	"isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "partition",
	"removeprefix", "removesuffix", "rfind", "rjust", "rpartition", "rsplit", "rstrip",
	"splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill",
}

// methods returns gonja's builtin methods with str.split replaced; it
// builds new sets and leaves gonja's globals alone.
func methods() exec.Methods {
	str := map[string]exec.Method[string]{"split": pySplit, "replace": pyReplace}
	for _, name := range strMethodNames {
		if _, ok := builtins.Methods.Str.Get(name); !ok {
			continue
		}
		str[name] = func(self string, sv *exec.Value, args *exec.VarArgs) (any, error) {
			f, _ := builtins.Methods.Str.Get(name)
			return f(self, sv, args)
		}
	}
	m := builtins.Methods
	m.Str = exec.NewMethodSet(str)
	return m
}

// pySplit is Python's str.split(sep=None, maxsplit=-1).
func pySplit(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
	var sep, maxSplit *exec.Value
	if len(args.Args) > 0 {
		sep = args.Args[0]
	}
	if len(args.Args) > 1 {
		maxSplit = args.Args[1]
	}
	if v, ok := args.KwArgs["sep"]; ok {
		sep = v
	}
	if v, ok := args.KwArgs["maxsplit"]; ok {
		maxSplit = v
	}
	n := -1
	if maxSplit != nil && !maxSplit.IsNil() {
		if !maxSplit.IsInteger() {
			return nil, errors.New("split: maxsplit must be an integer")
		}
		n = maxSplit.Integer()
	}
	var parts []string
	if sep == nil || sep.IsNil() {
		parts = splitWhitespace(self, n)
	} else {
		if !sep.IsString() {
			return nil, errors.New("split: sep must be a string or None")
		}
		s := sep.String()
		if s == "" {
			return nil, errors.New("split: empty separator")
		}
		if n < 0 {
			parts = strings.Split(self, s)
		} else {
			parts = strings.SplitN(self, s, n+1)
		}
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

// splitWhitespace splits on runs of whitespace, dropping empty fields; with
// n ≥ 0 at most n splits are made and the rest (left-trimmed) is the last field.
func splitWhitespace(s string, n int) []string {
	if n < 0 {
		return strings.Fields(s)
	}
	var out []string
	s = strings.TrimLeft(s, " \t\n\r\v\f")
	for len(out) < n && s != "" {
		i := strings.IndexAny(s, " \t\n\r\v\f")
		if i < 0 {
			break
		}
		out = append(out, s[:i])
		s = strings.TrimLeft(s[i:], " \t\n\r\v\f")
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

// pyReplace is Python's str.replace(old, new, count=-1).
func pyReplace(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
	get := func(i int, name string) *exec.Value {
		if v, ok := args.KwArgs[name]; ok {
			return v
		}
		if i < len(args.Args) {
			return args.Args[i]
		}
		return nil
	}
	old, repl, count := get(0, "old"), get(1, "new"), get(2, "count")
	if old == nil || repl == nil || !old.IsString() || !repl.IsString() {
		return nil, errors.New("replace: want replace(old, new[, count]) with strings")
	}
	n := -1
	if count != nil && !count.IsNil() {
		if !count.IsInteger() {
			return nil, errors.New("replace: count must be an integer")
		}
		n = count.Integer()
	}
	return strings.Replace(self, old.String(), repl.String(), n), nil
}

var (
	// leading spaces and tabs of a line before a block or comment tag
	// ("{%+" opts out, as in Jinja)
	lstripRE = regexp.MustCompile(`(?m)^[ \t]+(\{%[^+]|\{#)`)
	rawRE    = regexp.MustCompile(`\{%-?\s*raw\s*-?%\}(?s:.*?)\{%-?\s*endraw\s*-?%\}`)
)

// lstripBlocks applies Jinja's lstrip_blocks to template source, leaving
// {% raw %} sections alone.
func lstripBlocks(src string) string {
	var b strings.Builder
	last := 0
	for _, m := range rawRE.FindAllStringIndex(src, -1) {
		b.WriteString(lstripRE.ReplaceAllString(src[last:m[0]], "$1"))
		b.WriteString(src[m[0]:m[1]])
		last = m[1]
	}
	b.WriteString(lstripRE.ReplaceAllString(src[last:], "$1"))
	return b.String()
}

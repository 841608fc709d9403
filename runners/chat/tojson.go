package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// filterToJSON is HF transformers' tojson: Python's
// json.dumps(x, ensure_ascii=False, indent=indent) (so ", " and ": "
// separators without indent), not Jinja's HTML-safe one. Go maps have no
// insertion order: "role" and "content" come first (as in the messages HF
// builds), other keys follow sorted.
func filterToJSON(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	indent := -1
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		indent = v.Integer()
	}
	raw, err := json.Marshal(in.ToGoSimpleType(false))
	if err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	var b strings.Builder
	pyDump(&b, v, indent, 0)
	return exec.AsSafeValue(b.String())
}

func pyDump(b *strings.Builder, v any, indent, depth int) {
	nl := func(d int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	itemSep := ", "
	if indent >= 0 {
		itemSep = ","
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case json.Number:
		b.WriteString(x.String())
	case string:
		pyString(b, x)
	case []any:
		if len(x) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(itemSep)
			}
			nl(depth + 1)
			pyDump(b, e, indent, depth+1)
		}
		nl(depth)
		b.WriteByte(']')
	case map[string]any:
		if len(x) == 0 {
			b.WriteString("{}")
			return
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int {
			if ra, rb := keyRank(a), keyRank(b); ra != rb {
				return ra - rb
			}
			return strings.Compare(a, b)
		})
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(itemSep)
			}
			nl(depth + 1)
			pyString(b, k)
			b.WriteString(": ")
			pyDump(b, x[k], indent, depth+1)
		}
		nl(depth)
		b.WriteByte('}')
	default:
		fmt.Fprintf(b, "%v", x)
	}
}

// pyString writes s as json.dumps(ensure_ascii=False) does.
func pyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// keyRank orders the keys of the dicts HF builds as Python would have
// them: messages (role, content), tool calls (id, type, function), tools
// ({"type", "function": {"name", "description", "parameters"}}) and
// schemas ("type" first); the rest sorted. (A schema's property names
// come sorted, not in the order the client wrote them.)
func keyRank(k string) int {
	switch k {
	case "role":
		return 0
	case "content":
		return 1
	case "id":
		return 2
	case "type":
		return 3
	case "function":
		return 4
	case "name":
		return 5
	case "description":
		return 6
	case "parameters":
		return 7
	}
	return 8
}

package anthropic

import (
	"bytes"
	"encoding/json"
)

// completeInput is the input object of a tool_use block whose arguments
// were cut off (max_tokens): the arguments' complete part, as Anthropic's
// SDKs build it from the streamed input_json_delta pieces (a partial JSON
// parse): every value read whole is kept, open arrays and objects are
// closed, and a value or key cut mid-way is left out with its key. What
// is not an object this way is {}.
func completeInput(args []byte) json.RawMessage {
	var (
		stack []byte // the closers of the open containers
		cut   = -1   // the end of the longest complete prefix…
		at    []byte // …and the closers it needs
		prev  byte   // the last structural byte: { [ : , or 'v' after a value
	)
	mark := func(end int) { cut, at = end, append(at[:0], stack...) }
	i, n := 0, len(args)
scan:
	for i < n {
		c := args[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '{' || c == '[':
			stack = append(stack, c+2) // '}' is '{'+2, ']' is '['+2
			i++
			mark(i)
		case c == '}' || c == ']':
			if len(stack) == 0 || stack[len(stack)-1] != c {
				break scan
			}
			stack = stack[:len(stack)-1]
			i++
			mark(i)
		case c == ':' || c == ',':
			i++
		case c == '"':
			j := i + 1
			for j < n && args[j] != '"' {
				if args[j] == '\\' {
					j++
				}
				j++
			}
			if j >= n {
				break scan // cut inside the string
			}
			i = j + 1
			key := len(stack) > 0 && stack[len(stack)-1] == '}' && (prev == '{' || prev == ',')
			if !key {
				mark(i)
			}
			prev = 'v'
			if key {
				prev = 's'
			}
			continue
		case c == 't' || c == 'f' || c == 'n':
			lit := map[byte]string{'t': "true", 'f': "false", 'n': "null"}[c]
			if !bytes.HasPrefix(args[i:], []byte(lit)) {
				break scan // cut inside the literal
			}
			i += len(lit)
			mark(i)
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < n && bytes.IndexByte([]byte("+-.eE0123456789"), args[j]) >= 0 {
				j++
			}
			if last := args[j-1]; last < '0' || last > '9' {
				break scan // "1.", "-", "1e": not a number yet
			}
			i = j
			mark(i)
		default:
			break scan
		}
		prev = c
		if c != '{' && c != '[' && c != ':' && c != ',' {
			prev = 'v'
		}
	}
	if cut < 0 {
		return json.RawMessage(`{}`)
	}
	out := append([]byte(nil), args[:cut]...)
	for k := len(at) - 1; k >= 0; k-- {
		out = append(out, at[k])
	}
	if !json.Valid(out) || bytes.TrimSpace(out)[0] != '{' {
		return json.RawMessage(`{}`)
	}
	return out
}

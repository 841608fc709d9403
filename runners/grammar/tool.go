package grammar

import (
	"errors"
	"fmt"
)

// Tool is a function the model may call: its name and the JSON Schema of
// its arguments (nil or empty: any JSON object).
type Tool struct {
	Name       string
	Parameters []byte
}

// CallFormat is how a model family writes tool calls.
type CallFormat struct {
	// Prefix and Suffix wrap each call (Hermes: "<tool_call>\n" and
	// "\n</tool_call>"); Separator goes between calls.
	Prefix, Suffix, Separator string
	// List: the calls are one JSON array after ListPrefix (Mistral:
	// "[TOOL_CALLS]"); Prefix, Suffix and Separator are not used.
	List       bool
	ListPrefix string
	// ArgsKey names the arguments member: "arguments" (Hermes, Mistral) or
	// "parameters" (Llama 3.1/3.2).
	ArgsKey string
	// Parallel allows more than one call in one answer.
	Parallel bool
}

// MaxParallelCalls bounds the calls in one answer.
const MaxParallelCalls = 16

// ToolCalls compiles the grammar of an answer that is nothing but calls
// of the given tools (tool_choice "required", or a named tool when tools
// holds just that one): each {"name": <a tool's name>, ArgsKey: <its
// arguments>} with the arguments valid under that tool's schema, in the
// family's wrapping.
func ToolCalls(tools []Tool, f CallFormat) (*Grammar, error) {
	b := &builder{}
	n, err := b.toolCalls(tools, f)
	if err != nil {
		return nil, err
	}
	return b.root(n), nil
}

// ToolCallsOr is the grammar of an answer that is either tool calls (as
// ToolCalls) or a document of schema (nil: any JSON object): tool_choice
// "auto" together with response_format.
func ToolCallsOr(tools []Tool, f CallFormat, schema []byte) (*Grammar, error) {
	b := &builder{}
	calls, err := b.toolCalls(tools, f)
	if err != nil {
		return nil, err
	}
	var doc *node
	if schema == nil {
		doc = b.node(kObject)
		doc.additional = b.anyValue()
		doc.finishObject()
	} else if doc, err = b.schema(schema); err != nil {
		return nil, err
	}
	u := b.node(kUnion)
	u.alts = []*node{calls, doc}
	return b.root(u), nil
}

func (b *builder) toolCalls(tools []Tool, f CallFormat) (*node, error) {
	if len(tools) == 0 {
		return nil, errors.New("grammar: no tools to call")
	}
	if f.ArgsKey == "" {
		return nil, errors.New("grammar: call format without an arguments key")
	}
	call := b.node(kUnion)
	for _, t := range tools {
		var args *node
		if len(t.Parameters) == 0 {
			args = b.node(kObject)
			args.additional = b.anyValue()
			args.finishObject()
		} else {
			var err error
			if args, err = b.schema(t.Parameters); err != nil {
				return nil, fmt.Errorf("tool %q parameters: %w", t.Name, err)
			}
		}
		obj := b.node(kObject)
		obj.props = []prop{
			{key: []byte("name"), node: b.literalJSON(t.Name), required: true},
			{key: encodeKey(f.ArgsKey), node: args, required: true},
		}
		obj.finishObject()
		call.alts = append(call.alts, obj)
	}
	maxCalls := int32(1)
	if f.Parallel {
		maxCalls = MaxParallelCalls
	}
	if f.List {
		list := b.node(kArray)
		list.items, list.minItems, list.maxItems = call, 1, maxCalls
		return b.seq(b.wrapper(f.ListPrefix), list), nil
	}
	one := call
	if f.Prefix != "" || f.Suffix != "" {
		one = b.seq(b.wrapper(f.Prefix), call, b.wrapper(f.Suffix))
	}
	if maxCalls == 1 {
		return one, nil
	}
	more := b.node(kRepeat)
	more.items, more.minItems, more.maxItems = b.seq(b.wrapper(f.Separator), one), 0, maxCalls-1
	return b.seq(one, more), nil
}

// literalJSON is the node of one JSON string value.
func (b *builder) literalJSON(s string) *node {
	return b.lit(`"` + string(encodeKey(s)) + `"`)
}

// wrapper is a literal of the call format (nil parts are skipped by seq).
func (b *builder) wrapper(s string) *node {
	if s == "" {
		return nil
	}
	n := b.lit(s)
	b.wrappers = append(b.wrappers, []byte(s))
	return n
}

func (b *builder) seq(parts ...*node) *node {
	n := b.node(kSeq)
	for _, p := range parts {
		if p != nil {
			n.alts = append(n.alts, p)
		}
	}
	return n
}

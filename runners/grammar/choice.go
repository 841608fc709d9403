package grammar

import (
	"errors"
	"fmt"
)

// Alt is one way a Choice may go: a literal Head (it may spell special
// tokens, as a harmony message header does), then a body: calls of Tools
// in Format, or a document of Schema, or any JSON object (Object), or
// calls or a document when Tools and Schema/Object are both given (as
// ToolCallsOr), or nothing (the Head alone, e.g. the opening of a
// reasoning block that the caller leaves unconstrained).
type Alt struct {
	Head   string
	Tools  []Tool
	Format CallFormat
	Schema []byte
	Object bool
}

// Choice compiles the grammar of one of alts. With space the document may
// start with white space (as between JSON tokens, see MaxIndent); without it the first
// byte is a Head's. It is how a model that reasons before answering is
// constrained once the answer begins: the caller offers the reasoning
// opener as a head-only Alt and the answer's headers with their bodies.
func Choice(alts []Alt, space bool) (*Grammar, error) {
	if len(alts) == 0 {
		return nil, errors.New("grammar: no alternatives")
	}
	b := &builder{}
	u := b.node(kUnion)
	for i, a := range alts {
		body, err := b.altBody(a)
		if err != nil {
			return nil, fmt.Errorf("alternative %d: %w", i, err)
		}
		switch {
		case body == nil && a.Head == "":
			return nil, fmt.Errorf("grammar: alternative %d is empty", i)
		case body == nil:
			u.alts = append(u.alts, b.wrapper(a.Head))
		case a.Head == "":
			u.alts = append(u.alts, body)
		default:
			u.alts = append(u.alts, b.seq(b.wrapper(a.Head), body))
		}
	}
	g := b.root(u)
	g.root.tight = !space
	return g, nil
}

func (b *builder) altBody(a Alt) (*node, error) {
	doc := func() (*node, error) {
		switch {
		case a.Schema != nil:
			return b.schema(a.Schema)
		case a.Object:
			obj := b.node(kObject)
			obj.additional = b.anyValue()
			obj.finishObject()
			return obj, nil
		}
		return nil, nil
	}
	if len(a.Tools) == 0 {
		return doc()
	}
	calls, err := b.toolCalls(a.Tools, a.Format)
	if err != nil {
		return nil, err
	}
	d, err := doc()
	if err != nil || d == nil {
		return calls, err
	}
	u := b.node(kUnion)
	u.alts = []*node{calls, d}
	return u, nil
}

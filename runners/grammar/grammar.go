// Package grammar owns constrained decoding: it compiles a subset of JSON
// Schema (and the tool-call wrappers built on it) into a byte-level
// pushdown automaton, runs that automaton incrementally over generated
// bytes (Matcher), and turns a matcher state into a per-step token mask by
// walking a byte trie of the vocabulary (Vocab). It knows nothing of HTTP,
// tokenizers or engines: callers hand it token bytes and logits masks.
//
// Supported JSON Schema keywords: type (one or a list), properties,
// required, additionalProperties (schema or boolean; absent: no other
// key is generated, see below), enum, const, items, minItems, maxItems,
// minLength, maxLength, minimum / maximum / exclusiveMinimum /
// exclusiveMaximum / multipleOf on integers and numbers (decimal.go), anyOf, allOf with one member, $ref into $defs /
// definitions / the root, nullable (OpenAPI), boolean schemas, pattern
// and format on strings (regex.go), prefixItems, oneOf over branches no
// value can match twice, minProperties, maxProperties, uniqueItems over
// literal items, not {"type": …}, and the annotations title, description,
// default, examples, $schema, $id, $comment, deprecated, readOnly,
// writeOnly, discriminator. Any other keyword is an
// *UnsupportedError naming it.
//
// What the generated text looks like: object properties come with the
// required ones first, each group in the order the schema declares them
// (optional ones may be skipped, required ones may not); a property the
// schema does not name comes only where additionalProperties says so
// explicitly (a schema or true; an object schema without properties
// allows any keys, as json_object does), as a plain string without
// escapes that never equals a declared name; whitespace between tokens
// is nothing, one space, or a newline and at most MaxIndent spaces or
// tabs; numbers have at most MaxNumberLen bytes and MaxExponentDigits
// exponent digits. A schema that admits no document (false, an anyOf of
// false, a required property of schema false…) does not compile.
//
// ToolCalls (and ToolCallsOr) build the grammar of an answer made of tool
// calls in a family's wrapping (Hermes <tool_call>, Llama's bare JSON,
// Mistral's [TOOL_CALLS] list), each call's arguments compiled from that
// tool's schema. Constraint pairs a grammar with a Vocab for one
// generation: Mask gives the allowed tokens as a bitset (end tokens only
// when the document is complete; special tokens never, except where a
// wrapper spells one), Accept consumes the chosen token. Masks are walked
// over the trie with the automaton, pruning a subtree at its first refused
// byte; inside free strings the all-plain tokens come from a set
// precomputed per UTF-8 state, and masks are cached by automaton state.
package grammar

import (
	"fmt"
	"strings"
	"sync"
)

// MaxIndent bounds the indentation after a newline between JSON tokens.
// A run of whitespace between tokens is one of: nothing, one space, or
// one newline followed by at most MaxIndent spaces or tabs (what compact,
// spaced and indented encoders write), so that a model cannot pad
// forever or drift into blank lines.
const MaxIndent = 32

// MaxLeadingSpace bounds the whitespace before the document (a model
// that has closed its reasoning writes "\n\n" before the answer).
const MaxLeadingSpace = 4

// Whitespace states of a frame's ws: none yet, after the single space,
// after the newline (+ indentation characters so far).
const (
	wsNone  uint8 = 0
	wsSpace uint8 = 1
	wsNL    uint8 = 2
)

// MaxNumberLen bounds the bytes of one JSON number.
const MaxNumberLen = 32

// MaxExponentDigits bounds a number's exponent (e±99), so that every
// number fits a float64 (decoders refuse 1e999).
const MaxExponentDigits = 2

type kind uint8

const (
	kNever  kind = iota // matches nothing (schema false)
	kLit                // one of a set of byte strings (enum, const, true, false, null, wrappers)
	kString             // a JSON string
	kNumber             // a JSON number (integer: no fraction or exponent)
	kArray              // a JSON array
	kObject             // a JSON object
	kUnion              // one of alts
	kSeq                // alts in order
	kRepeat             // items, minItems..maxItems times
	kRoot               // the document: optional leading whitespace, then alts[0]
)

type node struct {
	id   int32
	kind kind

	integer bool // kNumber

	// kNumber with integer: bounds from minimum/maximum (exclusive ones
	// made inclusive).
	bounded, hasLo, hasHi bool
	lo, hi                int64
	nonNegative           bool     // kNumber, not integer: minimum 0
	dec                   *decCons // kNumber: exact bounds / multipleOf (decimal.go)

	minLen, maxLen int32 // kString (maxLen < 0: none), code points
	re             *dfa  // kString: pattern/format (lengths folded in; minLen, maxLen then unused)

	items              *node   // kArray (after prefix; nil: no more items), kRepeat
	prefix             []*node // kArray: prefixItems, one per leading position
	unique             bool    // kArray: uniqueItems over literal items (their bits in the frame's mask)
	minItems, maxItems int32   // kArray, kRepeat (maxItems < 0: none)

	props      []prop   // kObject, in the order generated
	additional *node    // kObject: schema of other keys, nil: none allowed
	allowed    []uint64 // kObject: per progress p, the props that may come next
	closable   []bool   // kObject: per progress p, whether '}' may come

	minProps, maxProps int32   // kObject: minProperties, maxProperties (< 0: none)
	reqAfter           []int32 // kObject: per progress p, required props from p on
	availAfter         []int32 // kObject: per progress p, props that can still come from p on

	lit *litTrie // kLit

	alts []*node // kUnion, kSeq, kRoot

	tight bool // kRoot: no leading whitespace
}

type prop struct {
	key      []byte // the JSON encoding of the name, without the quotes
	node     *node
	required bool
}

// litTrie is a byte trie of a set of literals; node 0 is the root.
// term and below (made by indexTerms, for uniqueItems) number the
// literals and give each node the set of those under it.
type litTrie struct {
	nodes []litNode
	term  []uint8
	below []uint64
}

// indexTerms numbers the literals (at most 63) and fills below.
func (t *litTrie) indexTerms() bool {
	t.term = make([]uint8, len(t.nodes))
	t.below = make([]uint64, len(t.nodes))
	k := 0
	var walk func(i int32) uint64
	walk = func(i int32) uint64 {
		var m uint64
		if t.nodes[i].terminal {
			t.term[i] = uint8(k)
			m |= 1 << k
			k++
		}
		for _, e := range t.nodes[i].edges {
			m |= walk(e.to)
		}
		t.below[i] = m
		return m
	}
	walk(0)
	return k <= 63
}

type litNode struct {
	edges    []litEdge
	terminal bool
}

type litEdge struct {
	b  byte
	to int32
}

func newLitTrie(lits [][]byte) *litTrie {
	t := &litTrie{nodes: []litNode{{}}}
	for _, l := range lits {
		cur := int32(0)
	next:
		for _, b := range l {
			for _, e := range t.nodes[cur].edges {
				if e.b == b {
					cur = e.to
					continue next
				}
			}
			t.nodes = append(t.nodes, litNode{})
			to := int32(len(t.nodes) - 1)
			t.nodes[cur].edges = append(t.nodes[cur].edges, litEdge{b, to})
			cur = to
		}
		t.nodes[cur].terminal = true
	}
	return t
}

func (t *litTrie) step(pos int32, b byte) int32 {
	for _, e := range t.nodes[pos].edges {
		if e.b == b {
			return e.to
		}
	}
	return -1
}

// Grammar is a compiled grammar. It is immutable and safe for concurrent
// use; each generation runs its own Matcher.
type Grammar struct {
	root     *node
	nodes    int32
	wrappers [][]byte // tool-call wrapper literals
	shared   *sharedMasks
}

// sharedMasks caches masks by automaton state across the generations of
// one Grammar (an agent sends the same tools turn after turn), for the
// first Vocab it is used with.
type sharedMasks struct {
	mu sync.Mutex
	v  *Vocab
	m  map[string][]uint64
}

// maxShared bounds the masks a Grammar keeps for all its generations.
const maxShared = 256

func (s *sharedMasks) get(v *Vocab, key []byte) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.v != v {
		return nil
	}
	return s.m[string(key)]
}

// put stores mask (never modified afterwards) under key.
func (s *sharedMasks) put(v *Vocab, key []byte, mask []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.v == nil {
		s.v = v
	}
	if s.v != v {
		return
	}
	if s.m == nil || len(s.m) >= maxShared {
		s.m = map[string][]uint64{}
	}
	s.m[string(key)] = mask
}

// UnsupportedError names JSON Schema keywords the compiler does not
// implement, with the JSON pointer of the schema that uses them.
type UnsupportedError struct {
	Keywords []string
	Path     string
}

func (e *UnsupportedError) Error() string {
	p := e.Path
	if p == "" {
		p = "#"
	}
	return fmt.Sprintf("unsupported JSON Schema keyword(s) %s at %s", strings.Join(e.Keywords, ", "), p)
}

type builder struct {
	next     int32
	wrappers [][]byte
	reCells  int             // transitions of the schema's patterns so far
	formats  map[string]*dfa // the formats' automata compiled so far
}

func (b *builder) node(k kind) *node {
	n := &node{id: b.next, kind: k, maxLen: -1, maxItems: -1, maxProps: -1}
	b.next++
	return n
}

func (b *builder) lit(lits ...string) *node {
	bs := make([][]byte, len(lits))
	for i, l := range lits {
		bs[i] = []byte(l)
	}
	n := b.node(kLit)
	n.lit = newLitTrie(bs)
	return n
}

// anyValue returns a node matching any JSON value.
func (b *builder) anyValue() *node {
	u := b.node(kUnion)
	obj := b.node(kObject)
	obj.additional = u
	obj.finishObject()
	arr := b.node(kArray)
	arr.items = u
	str := b.node(kString)
	num := b.node(kNumber)
	u.alts = []*node{obj, arr, str, num, b.lit("true", "false", "null")}
	return u
}

// itemAt is array n's schema of item i (nil: none may come there).
func (n *node) itemAt(i int32) *node {
	if int(i) < len(n.prefix) {
		return n.prefix[i]
	}
	return n.items
}

// canItem reports whether array n may take an item at index i.
func (n *node) canItem(i int32) bool {
	it := n.itemAt(i)
	return it != nil && it.kind != kNever && (n.maxItems < 0 || i < n.maxItems)
}

func (n *node) inRange(v int64) bool {
	return (!n.hasLo || v >= n.lo) && (!n.hasHi || v <= n.hi)
}

// finishObject computes allowed, closable, reqAfter and availAfter.
func (n *node) finishObject() {
	k := len(n.props)
	n.allowed = make([]uint64, k+1)
	n.closable = make([]bool, k+1)
	n.reqAfter = make([]int32, k+2)
	n.availAfter = make([]int32, k+2)
	for p := k - 1; p >= 0; p-- {
		n.reqAfter[p], n.availAfter[p] = n.reqAfter[p+1], n.availAfter[p+1]
		if n.props[p].node.kind != kNever {
			n.availAfter[p]++
			if n.props[p].required {
				n.reqAfter[p]++
			}
		}
	}
	n.closable[k] = true
	for p := k - 1; p >= 0; p-- {
		if n.props[p].node.kind == kNever { // never generated, but its name is not an additional key
			n.allowed[p] = n.allowed[p+1]
			n.closable[p] = n.closable[p+1]
			continue
		}
		if n.props[p].required {
			n.allowed[p] = 1 << p
		} else {
			n.allowed[p] = 1<<p | n.allowed[p+1]
			n.closable[p] = n.closable[p+1]
		}
	}
}

func (b *builder) root(v *node) *Grammar {
	r := b.node(kRoot)
	r.alts = []*node{v}
	return &Grammar{root: r, nodes: b.next, wrappers: b.wrappers, shared: &sharedMasks{}}
}

// AnyJSONObject returns the grammar of response_format json_object: any
// JSON object.
func AnyJSONObject() *Grammar {
	b := &builder{}
	obj := b.node(kObject)
	obj.additional = b.anyValue()
	obj.finishObject()
	return b.root(obj)
}

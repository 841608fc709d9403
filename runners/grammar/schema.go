package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Compile compiles a JSON Schema (the subset in the package comment) into
// a Grammar whose documents are the JSON texts the schema accepts.
func Compile(schema []byte) (*Grammar, error) {
	b := &builder{}
	n, err := b.schema(schema)
	if err != nil {
		return nil, err
	}
	return b.root(n), nil
}

// schema compiles one schema document into b's node space.
func (b *builder) schema(schema []byte) (*node, error) {
	d := json.NewDecoder(bytes.NewReader(schema))
	d.UseNumber()
	v, err := decodeOrdered(d)
	if err != nil {
		return nil, fmt.Errorf("grammar: schema is not JSON: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("grammar: schema: trailing data after the JSON value")
	}
	c := &compiler{b: b, root: v, refs: map[string]*node{}}
	n, err := c.compile(v, "")
	if err != nil {
		return nil, err
	}
	if err := checkLeftRecursion(n); err != nil {
		return nil, err
	}
	if !prune(n) {
		return nil, ErrUnsatisfiable
	}
	return n, nil
}

// ErrUnsatisfiable is returned by Compile for a schema that admits no
// JSON document (false, an anyOf of false, a required property that
// admits nothing, a $ref to such a schema…): generating under it could
// only fail.
var ErrUnsatisfiable = errors.New("grammar: the schema admits no JSON document")

// allNodes returns the nodes reachable from root.
func allNodes(root *node) []*node {
	var all []*node
	seen := map[*node]bool{}
	var collect func(n *node)
	collect = func(n *node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		all = append(all, n)
		collect(n.items)
		for _, p := range n.prefix {
			collect(p)
		}
		collect(n.additional)
		for _, p := range n.props {
			collect(p.node)
		}
		for _, a := range n.alts {
			collect(a)
		}
	}
	collect(root)
	return all
}

// prune finds the nodes that admit some value (least fixpoint: a value
// is finite, so a recursion that can never stop admits nothing), turns
// the others into kNever so that the automaton never enters a value it
// cannot finish, and reports whether root admits a value.
func prune(root *node) bool {
	all := allNodes(root)
	ok := map[*node]bool{}
	for changed := true; changed; {
		changed = false
		for _, n := range all {
			if !ok[n] && admits(n, ok) {
				ok[n] = true
				changed = true
			}
		}
	}
	for _, n := range all {
		if !ok[n] {
			*n = node{id: n.id, kind: kNever, maxLen: -1, maxItems: -1}
		}
	}
	for _, n := range all {
		switch n.kind {
		case kObject:
			if n.additional != nil && n.additional.kind == kNever {
				n.additional = nil
			}
			n.finishObject()
		case kUnion:
			n.alts = slices.DeleteFunc(n.alts, func(a *node) bool { return a.kind == kNever })
		}
	}
	return ok[root]
}

// admits reports whether n admits a value, given the nodes known to (ok).
func admits(n *node, ok map[*node]bool) bool {
	switch n.kind {
	case kLit:
		for _, l := range n.lit.nodes {
			if l.terminal {
				return true
			}
		}
		return false
	case kString:
		return n.re == nil || n.re.start >= 0 && n.re.fits(n.re.start, 0, n.minLen, n.maxLen)
	case kNumber:
		if n.dec == nil {
			return true
		}
		// Some magnitude, positive or negative (the state after a
		// minus, read with either sign).
		return decFeasible(n, &frame{n: n, st: sNumMinus}) || decFeasible(n, &frame{n: n, st: sNumMinus, u8: 1})
	case kArray:
		for i := int32(0); i < n.minItems; i++ {
			if it := n.itemAt(i); it == nil || !ok[it] {
				return false
			}
			if int(i) >= len(n.prefix) {
				break // the rest take the same schema
			}
		}
		return true
	case kRepeat:
		return n.minItems <= 0 || ok[n.items]
	case kObject:
		req, avail := int32(0), int32(0)
		for _, p := range n.props {
			if p.required && !ok[p.node] {
				return false
			}
			if p.required {
				req++
			}
			if ok[p.node] {
				avail++
			}
		}
		if n.additional != nil && ok[n.additional] {
			avail = 1 << 30
		}
		return (n.maxProps < 0 || req <= n.maxProps) && avail >= n.minProps && (n.maxProps < 0 || n.minProps <= n.maxProps)
	case kUnion:
		return slices.ContainsFunc(n.alts, func(a *node) bool { return ok[a] })
	case kSeq:
		return !slices.ContainsFunc(n.alts, func(a *node) bool { return !ok[a] })
	case kRoot:
		return ok[n.alts[0]]
	}
	return false
}

type compiler struct {
	b     *builder
	root  any
	refs  map[string]*node
	depth int
}

var annotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true,
	"$schema": true, "$id": true, "$comment": true, "deprecated": true,
	"readOnly": true, "writeOnly": true, "$defs": true, "definitions": true,
	"discriminator": true, // OpenAPI's (pydantic writes it beside oneOf): oneOf is enforced from the branches
}

var supported = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"enum": true, "const": true, "items": true, "minItems": true, "maxItems": true,
	"minLength": true, "maxLength": true, "anyOf": true, "allOf": true, "$ref": true,
	"nullable": true, "minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true,
	"pattern": true, "format": true, "prefixItems": true, "oneOf": true, "multipleOf": true,
	"minProperties": true, "maxProperties": true, "not": true, "uniqueItems": true,
}

func schemaErr(path, format string, a ...any) error {
	return fmt.Errorf("grammar: schema at %s: %s", pathOrRoot(path), fmt.Sprintf(format, a...))
}

// MaxSchemaDepth bounds the nesting of schemas in one schema document,
// and MaxSchemaNodes the automaton nodes one grammar compiles to, so that
// a hostile or runaway schema is a clear error, not unbounded work.
const (
	MaxSchemaDepth = 64
	MaxSchemaNodes = 100000
)

func (c *compiler) compile(v any, path string) (*node, error) {
	if c.depth++; c.depth > MaxSchemaDepth {
		return nil, schemaErr(path, "schemas nested more than %d deep", MaxSchemaDepth)
	}
	defer func() { c.depth-- }()
	if c.b.next > MaxSchemaNodes {
		return nil, schemaErr(path, "the schema compiles to more than %d nodes", MaxSchemaNodes)
	}
	switch s := v.(type) {
	case bool:
		if s {
			return c.b.anyValue(), nil
		}
		return c.b.node(kNever), nil
	case map[string]any:
		return c.compileObject(s, path)
	}
	return nil, schemaErr(path, "a schema must be an object or a boolean")
}

func (c *compiler) compileObject(s map[string]any, path string) (*node, error) {
	var bad []string
	for k := range s {
		if !supported[k] && !annotations[k] && k != propOrderKey {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return nil, &UnsupportedError{Keywords: bad, Path: pathOrRoot(path)}
	}
	if ref, ok := s["$ref"]; ok {
		for k := range s {
			if k != "$ref" && !annotations[k] && k != propOrderKey {
				return nil, &UnsupportedError{Keywords: []string{"$ref with sibling " + k}, Path: pathOrRoot(path)}
			}
		}
		r, ok := ref.(string)
		if !ok {
			return nil, schemaErr(path, "$ref must be a string")
		}
		return c.ref(r, path)
	}
	if all, ok := s["allOf"]; ok {
		l, ok := all.([]any)
		if !ok || len(l) != 1 {
			return nil, &UnsupportedError{Keywords: []string{"allOf with other than one schema"}, Path: pathOrRoot(path)}
		}
		for k := range s {
			if k != "allOf" && !annotations[k] && k != propOrderKey {
				return nil, &UnsupportedError{Keywords: []string{"allOf with sibling " + k}, Path: pathOrRoot(path)}
			}
		}
		return c.compile(l[0], path+"/allOf/0")
	}
	_, hasAny := s["anyOf"]
	_, hasOne := s["oneOf"]
	if hasAny && hasOne {
		return nil, &UnsupportedError{Keywords: []string{"anyOf with sibling oneOf"}, Path: pathOrRoot(path)}
	}
	if hasAny || hasOne {
		kw := "anyOf"
		if hasOne {
			kw = "oneOf"
		}
		l, ok := s[kw].([]any)
		if !ok || len(l) == 0 {
			return nil, schemaErr(path, "%s must be a non-empty array", kw)
		}
		for k := range s {
			if k != kw && k != "nullable" && !annotations[k] && k != propOrderKey {
				return nil, &UnsupportedError{Keywords: []string{kw + " with sibling " + k}, Path: pathOrRoot(path)}
			}
		}
		u := c.b.node(kUnion)
		for i, a := range l {
			n, err := c.compile(a, path+"/"+kw+"/"+strconv.Itoa(i))
			if err != nil {
				return nil, err
			}
			u.alts = append(u.alts, n)
		}
		if nullable(s) {
			u.alts = append(u.alts, c.b.lit("null"))
		}
		if hasOne {
			// Exactly one branch: enforced as anyOf where no value can
			// be in two branches (different types, literals that
			// differ, a required property whose literal values differ:
			// a discriminated union).
			for i := range u.alts {
				for j := i + 1; j < len(u.alts); j++ {
					if !disjoint(u.alts[i], u.alts[j]) {
						return nil, &UnsupportedError{Keywords: []string{fmt.Sprintf("oneOf whose branches %d and %d may overlap (a discriminator property with const values, or anyOf, is enforced)", i, j)}, Path: pathOrRoot(path)}
					}
				}
			}
		}
		return u, nil
	}

	types, err := schemaTypes(s, path)
	if err != nil {
		return nil, err
	}
	if nv, ok := s["not"]; ok {
		if types, err = notTypes(types, nv, path); err != nil {
			return nil, err
		}
	}
	var lits []any
	if e, ok := s["enum"]; ok {
		l, ok := e.([]any)
		if !ok || len(l) == 0 {
			return nil, schemaErr(path, "enum must be a non-empty array")
		}
		lits = l
	}
	if cv, ok := s["const"]; ok {
		if lits != nil {
			return nil, &UnsupportedError{Keywords: []string{"enum with const"}, Path: pathOrRoot(path)}
		}
		lits = []any{cv}
	}
	var alts []*node
	for _, t := range types {
		n, err := c.typed(t, s, path)
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
	}
	var n *node
	if len(alts) == 1 {
		n = alts[0]
	} else {
		n = c.b.node(kUnion)
		n.alts = alts
	}
	if lits != nil {
		return c.literals(lits, n, path)
	}
	return n, nil
}

func pathOrRoot(p string) string {
	if p == "" {
		return "#"
	}
	return "#" + p
}

func nullable(s map[string]any) bool {
	b, _ := s["nullable"].(bool)
	return b
}

var allTypes = []string{"object", "array", "string", "number", "boolean", "null"}

// schemaTypes returns the types a schema allows: its "type", else those
// its keywords imply, else all.
func schemaTypes(s map[string]any, path string) ([]string, error) {
	var ts []string
	switch t := s["type"].(type) {
	case nil:
		_, props := s["properties"]
		_, addl := s["additionalProperties"]
		_, req := s["required"]
		_, minP := s["minProperties"]
		_, maxP := s["maxProperties"]
		req = req || minP || maxP
		_, items := s["items"]
		_, prefixI := s["prefixItems"]
		items = items || prefixI
		_, minI := s["minItems"]
		_, maxI := s["maxItems"]
		_, minL := s["minLength"]
		_, maxL := s["maxLength"]
		_, pat := s["pattern"]
		_, fmtK := s["format"]
		minL = minL || pat || fmtK
		if props || addl || req {
			ts = append(ts, "object")
		}
		if items || minI || maxI {
			ts = append(ts, "array")
		}
		if minL || maxL {
			ts = append(ts, "string")
		}
		if len(ts) == 0 {
			ts = allTypes
		}
	case string:
		ts = []string{t}
	case []any:
		for _, e := range t {
			str, ok := e.(string)
			if !ok {
				return nil, schemaErr(path, "type list entries must be strings")
			}
			ts = append(ts, str)
		}
		if len(ts) == 0 {
			return nil, schemaErr(path, "type must not be an empty list")
		}
	default:
		return nil, schemaErr(path, "type must be a string or a list of strings")
	}
	if nullable(s) && !slices.Contains(ts, "null") {
		ts = append(slices.Clone(ts), "null")
	}
	return ts, nil
}

func (c *compiler) typed(t string, s map[string]any, path string) (*node, error) {
	switch t {
	case "null":
		return c.b.lit("null"), nil
	case "boolean":
		return c.b.lit("true", "false"), nil
	case "number", "integer":
		n := c.b.node(kNumber)
		n.integer = t == "integer"
		if err := bounds(n, s, path); err != nil {
			return nil, err
		}
		return n, nil
	case "string":
		n := c.b.node(kString)
		var err error
		if n.minLen, err = count(s, "minLength", 0, path); err != nil {
			return nil, err
		}
		if n.maxLen, err = count(s, "maxLength", -1, path); err != nil {
			return nil, err
		}
		if n.maxLen >= 0 && n.minLen > n.maxLen {
			return nil, schemaErr(path, "minLength %d > maxLength %d", n.minLen, n.maxLen)
		}
		if err := c.stringLanguage(n, s, path); err != nil {
			return nil, err
		}
		return n, nil
	case "array":
		n := c.b.node(kArray)
		var err error
		if n.minItems, err = count(s, "minItems", 0, path); err != nil {
			return nil, err
		}
		if n.maxItems, err = count(s, "maxItems", -1, path); err != nil {
			return nil, err
		}
		if n.maxItems >= 0 && n.minItems > n.maxItems {
			return nil, schemaErr(path, "minItems %d > maxItems %d", n.minItems, n.maxItems)
		}
		pv, hasPrefix := s["prefixItems"]
		if hasPrefix {
			l, ok := pv.([]any)
			if !ok {
				return nil, schemaErr(path, "prefixItems must be an array of schemas")
			}
			for i, e := range l {
				pn, err := c.compile(e, path+"/prefixItems/"+strconv.Itoa(i))
				if err != nil {
					return nil, err
				}
				n.prefix = append(n.prefix, pn)
			}
		}
		if it, ok := s["items"]; ok {
			if _, isList := it.([]any); isList {
				return nil, &UnsupportedError{Keywords: []string{"items as a list (use prefixItems)"}, Path: pathOrRoot(path)}
			}
			if n.items, err = c.compile(it, path+"/items"); err != nil {
				return nil, err
			}
			if n.items.kind == kNever {
				n.items = nil
			}
		} else if !hasPrefix {
			n.items = c.b.anyValue()
		} // prefixItems without items: the tuple alone (a model must not invent more items)
		if n.items == nil && (n.maxItems < 0 || int(n.maxItems) > len(n.prefix)) {
			n.maxItems = int32(len(n.prefix))
		}
		if u, _ := s["uniqueItems"].(bool); u {
			if err := uniqueItems(n, path); err != nil {
				return nil, err
			}
		} else if _, ok := s["uniqueItems"].(bool); !ok && s["uniqueItems"] != nil {
			return nil, schemaErr(path, "uniqueItems must be a boolean")
		}
		if n.maxItems >= 0 && n.minItems > n.maxItems {
			return nil, ErrUnsatisfiable
		}
		return n, nil
	case "object":
		return c.object(s, path)
	}
	return nil, schemaErr(path, "unknown type %q", t)
}

// stringLanguage compiles a string schema's pattern or format into n.re;
// n.minLen and n.maxLen keep the length bound left to count (see
// compileRegex).
func (c *compiler) stringLanguage(n *node, s map[string]any, path string) error {
	pv, hasPat := s["pattern"]
	fv, hasFmt := s["format"]
	if !hasPat && !hasFmt {
		return nil
	}
	if hasPat && hasFmt {
		return &UnsupportedError{Keywords: []string{"pattern with format"}, Path: pathOrRoot(path)}
	}
	var d *dfa
	var lo, hi int32
	var err error
	if hasPat {
		p, ok := pv.(string)
		if !ok {
			return schemaErr(path, "pattern must be a string")
		}
		d, lo, hi, err = compileRegex(p, n.minLen, n.maxLen)
	} else {
		f, ok := fv.(string)
		if !ok {
			return schemaErr(path, "format must be a string")
		}
		if c.b.formats == nil {
			c.b.formats = map[string]*dfa{}
		}
		d, lo, hi, err = formatDFA(c.b.formats, f, n.minLen, n.maxLen)
	}
	var ue *UnsupportedError
	switch {
	case errors.As(err, &ue):
		ue.Path = pathOrRoot(path)
		return ue
	case err != nil && hasPat:
		return fmt.Errorf("grammar: schema at %s: pattern %q: %w", pathOrRoot(path), pv, err)
	case err != nil:
		return fmt.Errorf("grammar: schema at %s: format %q: %w", pathOrRoot(path), fv, err)
	}
	if c.b.reCells += len(d.trans); c.b.reCells > maxSchemaCells {
		return fmt.Errorf("grammar: schema at %s: %w: the schema's patterns and formats have more than %d transitions together", pathOrRoot(path), ErrPatternTooComplex, maxSchemaCells)
	}
	n.re, n.minLen, n.maxLen = d, lo, hi
	return nil
}

func count(s map[string]any, key string, def int32, path string) (int32, error) {
	v, ok := s[key]
	if !ok {
		return def, nil
	}
	var f float64
	switch x := v.(type) {
	case json.Number:
		var err error
		if f, err = x.Float64(); err != nil {
			return 0, schemaErr(path, "%s: %v", key, err)
		}
	case float64:
		f = x
	default:
		return 0, schemaErr(path, "%s must be a non-negative integer", key)
	}
	if f < 0 || f != float64(int64(f)) || f > 1<<24 {
		return 0, schemaErr(path, "%s must be a non-negative integer (at most %d)", key, 1<<24)
	}
	return int32(f), nil
}

func (c *compiler) object(s map[string]any, path string) (*node, error) {
	n := c.b.node(kObject)
	required := map[string]bool{}
	if r, ok := s["required"]; ok {
		l, ok := r.([]any)
		if !ok {
			return nil, schemaErr(path, "required must be an array of strings")
		}
		for _, e := range l {
			name, ok := e.(string)
			if !ok {
				return nil, schemaErr(path, "required must be an array of strings")
			}
			required[name] = true
		}
	}
	_, hasProps := s["properties"]
	switch a := s["additionalProperties"].(type) {
	case nil:
		if _, present := s["additionalProperties"]; present {
			return nil, schemaErr(path, "additionalProperties must be a schema")
		}
		// Absent: the schema allows any other key, but a model told the
		// keys it should write must not invent others (llama.cpp's
		// converter, xgrammar and Outlines do the same); an object
		// schema that names no properties is any object.
		if !hasProps {
			n.additional = c.b.anyValue()
		}
	case bool:
		if a {
			n.additional = c.b.anyValue()
		}
	default:
		ad, err := c.compile(a, path+"/additionalProperties")
		if err != nil {
			return nil, err
		}
		if ad.kind != kNever {
			n.additional = ad
		}
	}
	seen := map[string]bool{}
	if p, ok := s["properties"]; ok {
		m, ok := p.(map[string]any)
		if !ok {
			return nil, schemaErr(path, "properties must be an object")
		}
		for _, name := range orderedKeys(m) {
			pn, err := c.compile(m[name], path+"/properties/"+escapePointer(name))
			if err != nil {
				return nil, err
			}
			seen[name] = true
			n.props = append(n.props, prop{key: encodeKey(name), node: pn, required: required[name]})
		}
	}
	var extra []string
	for name := range required {
		if !seen[name] {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	_, explicitAdd := s["additionalProperties"]
	for _, name := range extra {
		add := n.additional
		if add == nil && !explicitAdd {
			add = c.b.anyValue() // allowed, since additionalProperties is absent
		}
		if add == nil {
			return nil, schemaErr(path, "required property %q is neither in properties nor allowed by additionalProperties", name)
		}
		n.props = append(n.props, prop{key: encodeKey(name), node: add, required: true})
	}
	// Required properties first (each group in schema order): a model
	// that writes optional ones first may run out of tokens before the
	// ones the schema needs.
	slices.SortStableFunc(n.props, func(a, b prop) int {
		switch {
		case a.required == b.required:
			return 0
		case a.required:
			return -1
		}
		return 1
	})
	var err error
	if n.minProps, err = count(s, "minProperties", 0, path); err != nil {
		return nil, err
	}
	if n.maxProps, err = count(s, "maxProperties", -1, path); err != nil {
		return nil, err
	}
	if len(n.props) > 64 {
		return nil, &UnsupportedError{Keywords: []string{"properties (more than 64 in one object)"}, Path: pathOrRoot(path)}
	}
	n.finishObject()
	return n, nil
}

// propOrderKey holds, in every object decodeOrdered makes, its keys in
// the order of the text: properties are generated in that order.
const propOrderKey = "\x00order"

// orderedKeys returns the keys of m in the order the schema text has them.
func orderedKeys(m map[string]any) []string {
	o, _ := m[propOrderKey].([]string)
	return o
}

// decodeOrdered decodes one JSON value like json.Decoder.Decode with
// UseNumber, recording each object's key order under propOrderKey.
func decodeOrdered(d *json.Decoder) (any, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		m := map[string]any{}
		var order []string
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := decodeOrdered(d)
			if err != nil {
				return nil, err
			}
			if _, dup := m[k]; !dup {
				order = append(order, k)
			}
			m[k] = v
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		m[propOrderKey] = order
		return m, nil
	case json.Delim('['):
		l := []any{}
		for d.More() {
			v, err := decodeOrdered(d)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		return l, nil
	}
	return t, nil
}

// stripOrder returns v without the propOrderKey entries.
func stripOrder(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			if k != propOrderKey {
				m[k] = stripOrder(e)
			}
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = stripOrder(e)
		}
		return l
	}
	return v
}

func encodeKey(name string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(name) // a string always encodes
	out := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	return out[1 : len(out)-1]
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func (c *compiler) ref(r, path string) (*node, error) {
	if n, ok := c.refs[r]; ok {
		return n, nil
	}
	if !strings.HasPrefix(r, "#") {
		return nil, &UnsupportedError{Keywords: []string{"$ref to " + r + " (only local #/... references)"}, Path: pathOrRoot(path)}
	}
	target := c.root
	ptr := strings.TrimPrefix(r, "#")
	if ptr != "" {
		if !strings.HasPrefix(ptr, "/") {
			return nil, &UnsupportedError{Keywords: []string{"$ref to " + r + " (anchors)"}, Path: pathOrRoot(path)}
		}
		for _, tok := range strings.Split(ptr[1:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			m, ok := target.(map[string]any)
			if !ok {
				return nil, schemaErr(path, "$ref %s does not resolve", r)
			}
			if target, ok = m[tok]; !ok {
				return nil, schemaErr(path, "$ref %s does not resolve", r)
			}
		}
	}
	n := c.b.node(kUnion) // a forwarder, so that recursive references resolve
	c.refs[r] = n
	t, err := c.compile(target, ptr)
	if err != nil {
		return nil, err
	}
	n.alts = []*node{t}
	return n, nil
}

// literals compiles enum/const values; values the other keywords (the
// node n) do not accept are dropped.
func (c *compiler) literals(vals []any, n *node, path string) (*node, error) {
	g := &Grammar{root: &node{kind: kRoot, alts: []*node{n}}}
	var lits [][]byte
	for _, v := range vals {
		b, err := canonicalJSON(v)
		if err != nil {
			return nil, schemaErr(path, "enum/const value: %v", err)
		}
		m := g.NewMatcher()
		if m.Advance(b) == nil && m.CanEnd() {
			lits = append(lits, b)
		}
	}
	if len(lits) == 0 {
		return c.b.node(kNever), nil
	}
	l := c.b.node(kLit)
	l.lit = newLitTrie(lits)
	return l, nil
}

func canonicalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(stripOrder(v)); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// checkLeftRecursion refuses schemas that reach themselves through anyOf
// and $ref alone ({"anyOf":[{"$ref":"#"}]}): such a value would have to
// start with itself.
func checkLeftRecursion(root *node) error {
	const (
		white = iota
		grey
		black
	)
	color := map[*node]int{}
	all := allNodes(root)
	var visit func(n *node) bool
	visit = func(n *node) bool {
		switch color[n] {
		case grey:
			return false
		case black:
			return true
		}
		color[n] = grey
		if n.kind == kUnion {
			for _, a := range n.alts {
				if !visit(a) {
					return false
				}
			}
		}
		color[n] = black
		return true
	}
	for _, n := range all {
		if !visit(n) {
			return errors.New("grammar: schema refers to itself through anyOf/$ref without a value in between")
		}
	}
	return nil
}

// bounds reads minimum, maximum, exclusiveMinimum and exclusiveMaximum into
// an integer node (|bound| < 10^18); on type number only minimum 0 is
// taken (no minus sign), the rest refused.
func bounds(n *node, s map[string]any, path string) error {
	var present []string
	for _, k := range []string{"exclusiveMaximum", "exclusiveMinimum", "maximum", "minimum"} {
		if _, ok := s[k]; ok {
			present = append(present, k)
		}
	}
	_, mult := s["multipleOf"]
	if mult || len(present) > 0 && !n.integer && !(len(present) == 1 && present[0] == "minimum" && isZero(s["minimum"])) {
		return decBounds(n, s, path)
	}
	if len(present) == 0 {
		return nil
	}
	if !n.integer && len(present) == 1 && present[0] == "minimum" {
		if v, ok := s["minimum"].(json.Number); ok && (v.String() == "0" || v.String() == "0.0") {
			n.nonNegative = true // ge=0, the common case: no minus sign
			return nil
		}
	}
	if !n.integer {
		kw := make([]string, len(present))
		for i, k := range present {
			kw[i] = k + " on type number (integers only; minimum 0 alone is supported)"
		}
		return &UnsupportedError{Keywords: kw, Path: pathOrRoot(path)}
	}
	n.bounded = true
	for _, k := range present {
		var f float64
		switch x := s[k].(type) {
		case json.Number:
			var err error
			if f, err = x.Float64(); err != nil {
				return schemaErr(path, "%s: %v", k, err)
			}
		case float64:
			f = x
		default:
			return schemaErr(path, "%s must be a number", k)
		}
		if math.IsNaN(f) || math.Abs(f) >= 1e18 {
			return schemaErr(path, "%s must be a number of magnitude below 10^18", k)
		}
		switch k {
		case "minimum", "exclusiveMinimum":
			lo := int64(math.Ceil(f))
			if k == "exclusiveMinimum" {
				lo = int64(math.Floor(f)) + 1
			}
			if !n.hasLo || lo > n.lo {
				n.lo, n.hasLo = lo, true
			}
		default:
			hi := int64(math.Floor(f))
			if k == "exclusiveMaximum" {
				hi = int64(math.Ceil(f)) - 1
			}
			if !n.hasHi || hi < n.hi {
				n.hi, n.hasHi = hi, true
			}
		}
	}
	if n.hasLo && n.hasHi && n.lo > n.hi {
		return schemaErr(path, "no integer lies between the bounds (%d > %d)", n.lo, n.hi)
	}
	return nil
}

// JSON types, as bits.
const (
	tObject = 1 << iota
	tArray
	tString
	tNumber
	tBool
	tNull
	tAll = 1<<iota - 1
)

// resolve follows single-branch unions ($ref forwarders); nil when one
// is not resolved yet (a recursive reference).
func resolve(n *node) *node {
	for i := 0; n != nil && n.kind == kUnion && len(n.alts) == 1 && i < 64; i++ {
		n = n.alts[0]
	}
	if n != nil && n.kind == kUnion && len(n.alts) == 0 {
		return nil // a forwarder not filled yet
	}
	return n
}

// typesOf returns the JSON types n's values may have (tAll when unsure).
func typesOf(n *node, depth int) int {
	n = resolve(n)
	if n == nil || depth > 16 {
		return tAll
	}
	switch n.kind {
	case kNever:
		return 0
	case kString:
		return tString
	case kNumber:
		return tNumber
	case kArray:
		return tArray
	case kObject:
		return tObject
	case kLit:
		t := 0
		for _, l := range n.lit.strings() {
			t |= litType(l)
		}
		return t
	case kUnion:
		t := 0
		for _, a := range n.alts {
			t |= typesOf(a, depth+1)
		}
		return t
	}
	return tAll
}

func litType(l []byte) int {
	if len(l) == 0 {
		return tAll
	}
	switch c := l[0]; {
	case c == '"':
		return tString
	case c == '{':
		return tObject
	case c == '[':
		return tArray
	case c == 't' || c == 'f':
		return tBool
	case c == 'n':
		return tNull
	}
	return tNumber
}

// strings returns the literals of t.
func (t *litTrie) strings() [][]byte {
	var out [][]byte
	var walk func(i int32, pre []byte)
	walk = func(i int32, pre []byte) {
		if t.nodes[i].terminal {
			out = append(out, slices.Clone(pre))
		}
		for _, e := range t.nodes[i].edges {
			walk(e.to, append(pre, e.b))
		}
	}
	walk(0, nil)
	return out
}

// disjoint reports whether no JSON value can match both a and b (false
// when unsure). Literals are canonical JSON, so different literals of
// one type are different values, except numbers (1 and 1.0).
func disjoint(a, b *node) bool {
	if typesOf(a, 0)&typesOf(b, 0) == 0 {
		return true
	}
	a, b = resolve(a), resolve(b)
	if a == nil || b == nil {
		return false
	}
	if a.kind == kLit && b.kind == kLit {
		return litsDisjoint(a, b)
	}
	if a.kind == kNumber && b.kind == kNumber && a.integer && b.integer && a.bounded && b.bounded {
		return a.hasHi && b.hasLo && a.hi < b.lo || b.hasHi && a.hasLo && b.hi < a.lo
	}
	if a.kind == kObject && b.kind == kObject {
		// A discriminator: a property both require, with literal values
		// that differ.
		for _, p := range a.props {
			if !p.required {
				continue
			}
			for _, q := range b.props {
				if q.required && bytes.Equal(p.key, q.key) {
					pn, qn := resolve(p.node), resolve(q.node)
					if pn != nil && qn != nil && pn.kind == kLit && qn.kind == kLit && litsDisjoint(pn, qn) {
						return true
					}
				}
			}
		}
	}
	return false
}

func litsDisjoint(a, b *node) bool {
	la, lb := a.lit.strings(), b.lit.strings()
	for _, x := range la {
		for _, y := range lb {
			if bytes.Equal(x, y) || litType(x) == tNumber && litType(y) == tNumber {
				return false // equal, or numbers that may be equal (1, 1.0)
			}
		}
	}
	return true
}

func isZero(v any) bool {
	x, ok := v.(json.Number)
	return ok && (x.String() == "0" || x.String() == "0.0")
}

// decBounds reads number bounds and multipleOf (and multipleOf on
// integers, with their bounds) into n.dec, exact over decimals.
func decBounds(n *node, s map[string]any, path string) error {
	c := &decCons{}
	for _, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"} {
		v, ok := s[k]
		if !ok {
			continue
		}
		r, err := decRat(v, k, path)
		if err != nil {
			return err
		}
		switch k {
		case "minimum", "exclusiveMinimum":
			if ex := k == "exclusiveMinimum"; c.lo == nil || r.Cmp(c.lo) > 0 || r.Cmp(c.lo) == 0 && ex {
				c.lo, c.loEx = r, ex
			}
		case "maximum", "exclusiveMaximum":
			if ex := k == "exclusiveMaximum"; c.hi == nil || r.Cmp(c.hi) < 0 || r.Cmp(c.hi) == 0 && ex {
				c.hi, c.hiEx = r, ex
			}
		default:
			if r.Sign() <= 0 {
				return schemaErr(path, "multipleOf must be greater than 0")
			}
			if n.integer && !r.IsInt() {
				// The integers among the multiples of p/q (reduced) are
				// the multiples of p.
				r = new(big.Rat).SetInt(new(big.Int).Set(r.Num()))
			}
			c.mult = r
		}
	}
	n.dec = c
	return nil
}

// notTypes applies "not" of the simple form {"type": T} (a type or a
// list, annotations aside): the types left are the schema's less T.
// "not integer" on numbers (fractions only) and any other form are
// refused by name.
func notTypes(types []string, nv any, path string) ([]string, error) {
	unsupported := &UnsupportedError{Keywords: []string{`not (other than {"type": …})`}, Path: pathOrRoot(path)}
	m, ok := nv.(map[string]any)
	if !ok {
		return nil, unsupported
	}
	for k := range m {
		if k != "type" && !annotations[k] && k != propOrderKey {
			return nil, unsupported
		}
	}
	out, err := schemaTypes(m, path+"/not")
	if err != nil {
		return nil, err
	}
	if _, ok := m["type"]; !ok {
		return nil, ErrUnsatisfiable // not {}: nothing
	}
	var left []string
	for _, t := range types {
		switch {
		case slices.Contains(out, t):
		case t == "integer" && slices.Contains(out, "number"):
		case t == "number" && slices.Contains(out, "integer"):
			return nil, &UnsupportedError{Keywords: []string{"not integer on type number"}, Path: pathOrRoot(path)}
		default:
			left = append(left, t)
		}
	}
	if len(left) == 0 {
		return nil, ErrUnsatisfiable
	}
	return left, nil
}

// uniqueItems makes array n's items distinct, where they are a set of
// literals (enum, const, boolean): the frame keeps the ones used and a
// used one is not offered again. Other items are refused by name (their
// values cannot be compared as they are written).
func uniqueItems(n *node, path string) error {
	unsupported := &UnsupportedError{Keywords: []string{"uniqueItems (on items other than enum/const/boolean literals)"}, Path: pathOrRoot(path)}
	it := resolve(n.items)
	if len(n.prefix) > 0 || it == nil || it.kind != kLit {
		return unsupported
	}
	lits := it.lit.strings()
	var nums []*big.Rat
	for _, l := range lits {
		if litType(l) == tNumber {
			r, ok := new(big.Rat).SetString(string(l))
			if !ok {
				return unsupported
			}
			for _, o := range nums {
				if o.Cmp(r) == 0 {
					return unsupported // two spellings of one number (1, 1.0)
				}
			}
			nums = append(nums, r)
		}
	}
	t := &litTrie{nodes: it.lit.nodes}
	if !t.indexTerms() {
		return &UnsupportedError{Keywords: []string{"uniqueItems (over more than 63 literals)"}, Path: pathOrRoot(path)}
	}
	cp := *it
	cp.lit = t
	n.items = &cp
	n.unique = true
	if k := int32(len(lits)); n.maxItems < 0 || n.maxItems > k {
		n.maxItems = k // each literal once
	}
	return nil
}

package grammar

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func mustCompile(t testing.TB, schema string) *Grammar {
	t.Helper()
	g, err := Compile([]byte(schema))
	if err != nil {
		t.Fatalf("Compile(%s): %v", schema, err)
	}
	return g
}

// complete reports whether doc is a whole document of g.
func complete(g *Grammar, doc string) bool {
	m := g.NewMatcher()
	return m.Advance([]byte(doc)) == nil && m.CanEnd()
}

func TestMatcherTable(t *testing.T) {
	cases := []struct {
		schema string
		ok     []string
		bad    []string
	}{
		{`{"type":"string"}`, []string{`""`, `"a b"`, `"é\n\u00e9"`, ` "x"`, `"\"\\\/\b\f\n\r\t"`, `"日本"`},
			[]string{`"`, `"a`, `"a""`, "\"\x01\"", `"\x"`, `"\u12"`, `"\ud800"`, `1`, `"a" `, "\"\xff\"", "\"\xe0\x80\x80\"", "\"\xed\xa0\x80\""}},
		{`{"type":"string","minLength":2,"maxLength":3}`, []string{`"ab"`, `"abc"`, `"\n\t"`, `"éé"`}, []string{`"a"`, `"abcd"`, `""`}},
		{`{"type":"integer"}`, []string{`0`, `-1`, `123`, `-0`}, []string{`01`, `1.5`, `1e3`, `-`, `+1`, `""`}},
		{`{"type":"number"}`, []string{`0`, `1.5`, `-0.25e-3`, `1E+9`, `12`}, []string{`1.`, `.5`, `1e`, `00`, `1.5.`, `1e999`, `2E-100`}},
		{`{"type":"boolean"}`, []string{`true`, `false`}, []string{`tru`, `null`, `"true"`}},
		{`{"type":"null"}`, []string{`null`}, []string{`nul`, `0`}},
		{`{"type":["string","null"]}`, []string{`null`, `"x"`}, []string{`1`}},
		{`{"type":"string","nullable":true}`, []string{`null`, `"x"`}, []string{`1`}},
		{`{"enum":["a","ab",1,12,null,{"k":[1]}]}`, []string{`"a"`, `"ab"`, `1`, `12`, `null`, `{"k":[1]}`}, []string{`"abc"`, `123`, `2`, `{"k":[2]}`}},
		{`{"type":"string","enum":["a",1]}`, []string{`"a"`}, []string{`1`}},
		{`{"const":"fixed"}`, []string{`"fixed"`}, []string{`"fixe"`, `"fixedd"`}},
		{`{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2}`,
			[]string{`[1]`, `[1,2]`, `[ 1 , 2 ]`, "[\n1\n]"}, []string{`[]`, `[1,2,3]`, `[1,]`, `["a"]`}},
		{`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"],"additionalProperties":false}`,
			// Required properties first, then the optional ones.
			[]string{`{"b":"x"}`, `{"b":"x","a":1}`, `{ "b" : "" , "a" : 1 }`},
			[]string{`{}`, `{"a":1}`, `{"a":1,"b":"x"}`, `{"b":"x","c":1}`, `{"b":"x","b":"y"}`, `{"b":"x",}`, `{"a":1,"a":2,"b":"x"}`, `{"b":"x","a":1,"a":2}`}},
		{`{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true}`,
			[]string{`{}`, `{"a":1}`, `{"x":[1,{"y":null}]}`, `{"a":1,"ab":"s","b":true}`, `{"ab":1}`},
			[]string{`{"a":"s"}`, `{"x":1,"a":"s"}`, `{"a\u0062":1}`}},
		// additionalProperties absent: only the named properties are
		// generated (the schema allows others; a model must not invent them).
		{`{"type":"object","properties":{"a":{"type":"integer"}}}`,
			[]string{`{}`, `{"a":1}`},
			[]string{`{"a":"s"}`, `{"x":1,"a":"s"}`, `{"a\u0062":1}`, `{"x":[1,{"y":null}]}`, `{"a":1,"ab":"s","b":true}`, `{"ab":1}`}},
		{`{"type":"object","required":["a"]}`, []string{`{"a":[1]}`, `{"a":1,"b":2}`}, []string{`{}`, `{"b":2}`}},
		{`{"type":"object","properties":{"a":{"type":"integer"}},"required":["a","z"]}`, []string{`{"a":1,"z":{"q":null}}`}, []string{`{"a":1}`, `{"z":1,"a":1}`, `{"a":1,"z":1,"y":2}`}},
		{`{"type":"object","properties":{"q\"t":{"type":"integer"}},"required":["q\"t"],"additionalProperties":false}`,
			[]string{`{"q\"t":1}`}, []string{`{"q":1}`, `{"qt":1}`}},
		{`{"anyOf":[{"type":"object","properties":{"k":{"const":"a"},"v":{"type":"integer"}},"required":["k","v"],"additionalProperties":false},{"type":"object","properties":{"k":{"const":"b"},"v":{"type":"string"}},"required":["k","v"],"additionalProperties":false}]}`,
			[]string{`{"k":"a","v":1}`, `{"k":"b","v":"s"}`}, []string{`{"k":"a","v":"s"}`, `{"k":"b","v":1}`}},
		{`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},"$ref":"#/$defs/node"}`,
			[]string{`{"v":1,"next":null}`, `{"v":1,"next":{"v":2,"next":null}}`}, []string{`{"v":1}`, `{"v":1,"next":{"v":2}}`}},
		{`{"type":"array","items":{"$ref":"#"},"maxItems":2}`, []string{`[]`, `[[],[[]]]`}, []string{`[1]`, `[[],[],[]]`}},
		{`true`, []string{`1`, `{"a":[true,null,"x",-1.5e3]}`}, []string{`{`, `[1,]`}},
		{`{}`, []string{`"s"`, `[]`}, []string{`nul`}},
		{`{"type":"object","properties":{"a":false},"additionalProperties":true}`, []string{`{"b":1}`}, []string{`{"a":1}`}},
		{`{"type":"object","properties":{"a":false}}`, []string{`{}`}, []string{`{"a":1}`, `{"b":1}`}},
		// A property whose schema admits nothing is never entered.
		{`{"type":"object","properties":{"a":{"anyOf":[false,{"type":"object","properties":{"x":false},"required":["x"]}]},"b":{"type":"integer"}}}`,
			[]string{`{}`, `{"b":1}`}, []string{`{"a":{}}`, `{"a":{"x":1},"b":1}`}},
		{`{"type":"array","items":{"anyOf":[false]}}`, []string{`[]`}, []string{`[1]`}},
		{`{"allOf":[{"type":"integer"}],"description":"d"}`, []string{`5`}, []string{`"5"`}},
		{`{"type":"integer","minimum":0}`, []string{`0`, `7`, `-0`, `123456789`}, []string{`-1`, `-12`}},
		{`{"type":"integer","minimum":10,"maximum":20}`, []string{`10`, `15`, `20`}, []string{`9`, `21`, `1`, `2`, `100`, `-15`, `0`}},
		{`{"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":3}`, []string{`-2`, `0`, `2`, `-0`}, []string{`-3`, `3`, `-10`}},
		{`{"type":"integer","maximum":-5}`, []string{`-5`, `-100`}, []string{`-4`, `0`, `5`, `-0`}},
		{`{"type":"integer","minimum":1.5,"maximum":2.5}`, []string{`2`}, []string{`1`, `3`}},
		{`{"type":"number","minimum":0}`, []string{`0`, `1.5`, `2e3`}, []string{`-1`, `-0.5`}},
		// prefixItems: the tuple, then items if any (none without).
		{`{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}]}`, []string{`[]`, `[1]`, `[1,"a"]`}, []string{`["a"]`, `[1,2]`, `[1,"a",3]`}},
		{`{"type":"array","prefixItems":[{"type":"integer"}],"items":{"type":"boolean"},"minItems":2}`, []string{`[1,true]`, `[1,true,false]`}, []string{`[1]`, `[true,true]`, `[1,2]`}},
		{`{"type":"array","prefixItems":[{"type":"integer"},{"type":"null"}],"items":false,"minItems":2,"maxItems":2}`, []string{`[1,null]`}, []string{`[1]`, `[1,null,1]`}},
		// oneOf over disjoint branches: types, literals, a discriminator.
		{`{"oneOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]}`, []string{`"a"`, `1`, `null`}, []string{`true`}},
		{`{"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind","x"]},{"type":"object","properties":{"kind":{"const":"b"},"y":{"type":"string"}},"required":["kind","y"]}],"discriminator":{"propertyName":"kind"}}`,
			[]string{`{"kind":"a","x":1}`, `{"kind":"b","y":"s"}`}, []string{`{"kind":"a","y":"s"}`, `{"kind":"c","x":1}`}},
		{`{"oneOf":[{"enum":["x","y"]},{"const":"z"}]}`, []string{`"x"`, `"z"`}, []string{`"w"`}},
		// uniqueItems over literals.
		{`{"type":"array","items":{"enum":["a","ab",1,true]},"uniqueItems":true}`,
			[]string{`[]`, `["a","ab"]`, `["ab","a",1,true]`}, []string{`["a","a"]`, `["ab",1,"ab"]`, `[true,true]`, `["a","ab",1,true,"a"]`}},
		{`{"type":"array","items":{"type":"boolean"},"uniqueItems":true,"minItems":2}`, []string{`[true,false]`, `[false,true]`}, []string{`[true,true]`, `[true]`}},
		{`{"type":"array","items":{"type":"string"},"uniqueItems":false}`, []string{`["a","a"]`}, nil},
		// not {"type": …}: the types left.
		{`{"not":{"type":"null"}}`, []string{`1`, `"a"`, `[]`, `{}`, `true`}, []string{`null`}},
		{`{"type":["string","integer","null"],"not":{"type":["null","number"]}}`, []string{`"a"`}, []string{`1`, `null`}},
		// minProperties / maxProperties, with the order and the required ones.
		{`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"minProperties":2}`,
			[]string{`{"a":1,"b":2}`, `{"a":1,"c":3}`, `{"b":1,"c":2}`, `{"a":1,"b":2,"c":3}`}, []string{`{}`, `{"a":1}`, `{"c":1}`}},
		{`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["c"],"maxProperties":2}`,
			[]string{`{"c":1}`, `{"c":1,"a":2}`, `{"c":1,"b":2}`}, []string{`{"c":1,"a":2,"b":3}`, `{}`}},
		{`{"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2}`,
			[]string{`{"x":1}`, `{"x":1,"y":2}`}, []string{`{}`, `{"x":1,"y":2,"z":3}`}},
		{`{"type":"object","properties":{"r":{"type":"integer"}},"required":["r"],"additionalProperties":true,"maxProperties":1}`,
			[]string{`{"r":1}`}, []string{`{"x":1,"r":1}`, `{"r":1,"x":1}`}},
	}
	for _, c := range cases {
		g := mustCompile(t, c.schema)
		for _, d := range c.ok {
			if !complete(g, d) {
				t.Errorf("%s: %q rejected", c.schema, d)
			}
		}
		for _, d := range c.bad {
			if complete(g, d) {
				t.Errorf("%s: %q accepted", c.schema, d)
			}
		}
	}
}

func TestWhitespaceBounded(t *testing.T) {
	g := mustCompile(t, `{"type":"array","items":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}}`)
	indent := strings.Repeat(" ", MaxIndent)
	for _, d := range []string{`[{"a":1}]`, `[ { "a" : 1 } , {"a": 2} ]`, "[\n  {\n    \"a\": 1\n  }\n]", "[\n\t{\"a\":1}]", "[\n" + indent + "{\"a\":1}]", ` [{"a":1}]`} {
		if !complete(g, d) {
			t.Errorf("%q rejected", d)
		}
	}
	for _, d := range []string{"[  {\"a\":1}]", "[\n\n{\"a\":1}]", "[\n" + indent + " {\"a\":1}]", "[ \n{\"a\":1}]", "[\r\n{\"a\":1}]", "[\t{\"a\":1}]", "\n\n\n\n\n[{\"a\":1}]", `[{"a" :  1}]`} {
		if complete(g, d) {
			t.Errorf("%q accepted", d)
		}
	}
}

func TestUnsatisfiableSchemas(t *testing.T) {
	for _, s := range []string{
		`false`,
		`{"anyOf":[false,false]}`,
		`{"$ref":"#/$defs/no","$defs":{"no":false}}`,
		`{"type":"object","properties":{"a":false},"required":["a"]}`,
		`{"type":"object","properties":{"a":{"anyOf":[false]}},"required":["a"]}`,
		`{"type":"array","items":false,"minItems":1}`,
		`{"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]}`, // an infinite value
		`{"type":"string","enum":[1,2]}`,
		`{"type":"object","required":["x"],"additionalProperties":false}`,
		`{"type":"object","properties":{"a":{"type":"integer"}},"minProperties":2}`,
		`{"type":"string","not":{"type":"string"}}`,
		`{"type":"array","items":{"type":"boolean"},"uniqueItems":true,"minItems":3}`,
		`{"not":{}}`,
		`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"maxProperties":1}`,
	} {
		if _, err := Compile([]byte(s)); err == nil {
			t.Errorf("%s compiled", s)
		}
	}
	if _, err := Compile([]byte(`{"anyOf":[false,false]}`)); !errors.Is(err, ErrUnsatisfiable) {
		t.Errorf("anyOf of false: err %v, want ErrUnsatisfiable", err)
	}
	if _, err := Choice([]Alt{{Head: "x", Schema: []byte(`false`)}}, false); !errors.Is(err, ErrUnsatisfiable) {
		t.Errorf("Choice with a schema of false: err %v, want ErrUnsatisfiable", err)
	}
	if _, err := ToolCalls([]Tool{{Name: "f", Parameters: []byte(`{"anyOf":[false]}`)}}, hermes); !errors.Is(err, ErrUnsatisfiable) {
		t.Errorf("a tool whose parameters admit nothing: err %v, want ErrUnsatisfiable", err)
	}
}

// TestSchemaBounds: a schema too deep, too wide or too big to compile is
// an error saying so, not unbounded work.
func TestSchemaBounds(t *testing.T) {
	deep := strings.Repeat(`{"type":"array","items":`, 1000) + `{}` + strings.Repeat(`}`, 1000)
	if _, err := Compile([]byte(deep)); err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Errorf("depth 1000: err %v", err)
	}
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range 10000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string"}`, i)
	}
	b.WriteString(`}}`)
	if _, err := Compile([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "properties") {
		t.Errorf("10,000 properties: err %v", err)
	}
	// Wide but nested: 60 objects of 60 objects of 10 properties.
	b.Reset()
	b.WriteString(`{"type":"object","properties":{`)
	for i := range 60 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"o%d":{"type":"object","properties":{`, i)
		for j := range 60 {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"p%d":{"type":"object","properties":{`, j)
			for k := range 10 {
				if k > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `"q%d":{"anyOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]}`, k)
			}
			b.WriteString(`}}`)
		}
		b.WriteString(`}}`)
	}
	b.WriteString(`}}`)
	if _, err := Compile([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "nodes") {
		t.Errorf("36,000 nested properties: err %v", err)
	}
}

func TestAdvanceRejectKeepsState(t *testing.T) {
	g := mustCompile(t, `{"type":"array","items":{"type":"integer"}}`)
	m := g.NewMatcher()
	if err := m.Advance([]byte("[1")); err != nil {
		t.Fatal(err)
	}
	if err := m.Advance([]byte(`,"`)); !errors.Is(err, ErrRejected) {
		t.Fatalf("Advance(,\") = %v, want ErrRejected", err)
	}
	if err := m.Advance([]byte("2]")); err != nil || !m.CanEnd() {
		t.Fatalf("after a rejected Advance the state moved: %v", err)
	}
}

func TestUnsupportedKeywords(t *testing.T) {
	cases := map[string][]string{
		`{"type":"object","patternProperties":{"^a":{}}}`:                            {"patternProperties"},
		`{"type":"object","properties":{"a":{"type":"number","minimum":0.1234567}}}`: {"minimum 0.1234567 (on numbers: below 10^9 in magnitude, at most 6 fraction digits)"},
		`{"oneOf":[{"type":"string"},{"type":"string","maxLength":3}]}`:              {"oneOf whose branches 0 and 1 may overlap (a discriminator property with const values, or anyOf, is enforced)"},
		`{"type":"array","contains":{"type":"integer"}}`:                             {"contains"},
		`{"not":{"const":1}}`:                                           {`not (other than {"type": …})`},
		`{"type":"number","not":{"type":"integer"}}`:                    {"not integer on type number"},
		`{"type":"array","items":{"type":"string"},"uniqueItems":true}`: {"uniqueItems (on items other than enum/const/boolean literals)"},
		`{"$ref":"http://example.com/s.json"}`:                          {"$ref to http://example.com/s.json (only local #/... references)"},
	}
	for schema, want := range cases {
		_, err := Compile([]byte(schema))
		var ue *UnsupportedError
		if !errors.As(err, &ue) {
			t.Errorf("%s: err %v, want *UnsupportedError", schema, err)
			continue
		}
		if strings.Join(ue.Keywords, ",") != strings.Join(want, ",") {
			t.Errorf("%s: keywords %q, want %q", schema, ue.Keywords, want)
		}
		for _, k := range want {
			if !strings.Contains(err.Error(), k) {
				t.Errorf("%s: error %q does not name %q", schema, err, k)
			}
		}
	}
	if _, err := Compile([]byte(`{"type":"object","properties":{"a":{"type":"strin"}}}`)); err == nil || !strings.Contains(err.Error(), "#/properties/a") {
		t.Errorf("unknown type: err %v, want one naming #/properties/a", err)
	}
	if _, err := Compile([]byte(`{"type":`)); err == nil {
		t.Error("truncated schema compiled")
	}
}

func TestPropertyOrderFollowsSchemaText(t *testing.T) {
	g := mustCompile(t, `{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"integer"}},"required":["z","a"],"additionalProperties":false}`)
	if !complete(g, `{"z":1,"a":2}`) || complete(g, `{"a":2,"z":1}`) {
		t.Error("properties are not generated in the schema's order")
	}
}

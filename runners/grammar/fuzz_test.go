package grammar

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// FuzzCompile feeds the compiler arbitrary schemas and the matcher
// arbitrary documents: nothing panics (and compiling is bounded: patterns,
// depth and size have limits), and a document the grammar completes is
// JSON that the independent validator accepts (format assertions on).
func FuzzCompile(f *testing.F) {
	for _, s := range handSchemas {
		f.Add([]byte(s), []byte(`{"name":"x","age":1,"tags":[]}`))
	}
	f.Add([]byte(`{"type":"array","items":{"$ref":"#"}}`), []byte(`[[],[[]]]`))
	f.Add([]byte(`{"$ref":"#"}`), []byte(`1`))
	f.Add([]byte(`{"anyOf":[{"$ref":"#/anyOf/0"}]}`), []byte(`1`))
	f.Add([]byte(`{"enum":[1,"a",null]}`), []byte(`"a"`))
	f.Add([]byte(`{"type":"integer","minimum":-7,"exclusiveMaximum":40}`), []byte(`-7`))
	f.Add([]byte(`{"type":"string","minLength":1,"maxLength":2}`), []byte(`"\u00e9x"`))
	f.Add([]byte(`{"type":"string","pattern":"^(a|b)*c{2,3}$","maxLength":5}`), []byte(`"abcc"`))
	f.Add([]byte(`{"type":"string","format":"date-time"}`), []byte(`"2024-02-29T12:00:00Z"`))
	f.Add([]byte(`{"type":"string","format":"email","minLength":3}`), []byte(`"a@b.c"`))
	f.Add([]byte(`{"type":"number","exclusiveMinimum":-1.5,"maximum":2,"multipleOf":0.25}`), []byte(`-1.25`))
	f.Add([]byte(`{"type":"array","prefixItems":[{"type":"integer"},{"const":"x"}],"items":false}`), []byte(`[1,"x"]`))
	f.Add([]byte(`{"oneOf":[{"type":"object","properties":{"k":{"const":"a"}},"required":["k"]},{"type":"object","properties":{"k":{"const":"b"}},"required":["k"]}]}`), []byte(`{"k":"b"}`))
	f.Add([]byte(`{"type":"string","pattern":"(x+x+)+y"}`), []byte(`"xxy"`))
	f.Fuzz(func(t *testing.T, schema, doc []byte) {
		g, err := Compile(schema)
		if err != nil {
			return
		}
		m := g.NewMatcher()
		if m.Advance(doc) != nil || !m.CanEnd() {
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("schema %s: completed %q is not JSON", schema, doc)
		}
		sd, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
		if err != nil {
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if c.AddResource("s.json", sd) != nil {
			return
		}
		sch, err := c.Compile("s.json")
		if err != nil || bytes.Contains(schema, []byte("nullable")) {
			return // a schema it refuses, or OpenAPI's nullable, which it ignores
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
		if err != nil {
			t.Fatalf("validator cannot read %q: %v", doc, err)
		}
		if err := sch.Validate(inst); err != nil {
			t.Fatalf("schema %s: completed %q does not validate: %v", schema, doc, err)
		}
	})
}

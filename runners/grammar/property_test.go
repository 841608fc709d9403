package grammar

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// handSchemas are schemas written to hit the corners: recursion, anyOf
// over objects, enums of every type, escapes in names, empty objects.
var handSchemas = []string{
	`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["name","age","tags"],"additionalProperties":false}`,
	`{"type":"object","properties":{"location":{"type":"string","description":"city"},"unit":{"enum":["celsius","fahrenheit"]}},"required":["location"],"additionalProperties":false}`,
	`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v","kids"],"additionalProperties":false}},"$ref":"#/$defs/node"}`,
	`{"anyOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"],"additionalProperties":false},{"type":"object","properties":{"kind":{"const":"rect"},"w":{"type":"number"},"h":{"type":"number"}},"required":["kind","w","h"],"additionalProperties":false}]}`,
	`{"type":"object"}`,
	`{"type":"object","properties":{"a":{"type":"integer"}}}`,
	`{"type":"array","items":{"type":["string","null","boolean"]},"minItems":2,"maxItems":4}`,
	`{"enum":["a","ab","abc",1,1.5,-2,true,null,{"x":[1,2]},[]]}`,
	`{"type":"object","properties":{"q\"uote":{"type":"string"},"back\\slash":{"type":"integer"},"é":{"type":"boolean"}},"required":["q\"uote","back\\slash","é"],"additionalProperties":false}`,
	`{"type":"string","minLength":3,"maxLength":5}`,
	`{"type":"object","properties":{"id":{"type":"integer"},"meta":{"type":"object","additionalProperties":{"type":"string"}}},"required":["id","meta"],"additionalProperties":false}`,
	`{"type":"array","items":{"$ref":"#"},"maxItems":2}`,
	`{"type":"object","properties":{"x":{"anyOf":[{"type":"string","maxLength":4},{"type":"integer"}]},"y":{"allOf":[{"$ref":"#/definitions/p"}]}},"required":["x","y"],"additionalProperties":false,"definitions":{"p":{"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3}}}`,
	`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"string"}},"required":["c"]}`,
	`true`,
	`{"type":"object","properties":{"age":{"type":"integer","minimum":0,"maximum":120},"delta":{"type":"integer","exclusiveMinimum":-5,"exclusiveMaximum":5},"big":{"type":"integer","minimum":1000000}},"required":["age","delta","big"],"additionalProperties":false}`,
	`{"type":"object","properties":{"when":{"type":"string","format":"date-time"},"day":{"type":"string","format":"date"},"at":{"type":"string","format":"time"},"for":{"type":"string","format":"duration"},"mail":{"type":"string","format":"email"},"host":{"type":"string","format":"hostname"},"v4":{"type":"string","format":"ipv4"},"v6":{"type":"string","format":"ipv6"},"id":{"type":"string","format":"uuid"},"link":{"type":"string","format":"uri"}},"required":["when","day","at","for","mail","host","v4","v6","id","link"],"additionalProperties":false}`,
	`{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}-\\d{4}$"},"slug":{"type":"string","pattern":"^[a-z0-9]+(?:-[a-z0-9]+)*$","maxLength":12},"any":{"type":"string","pattern":"[0-9]"},"name":{"type":"string","pattern":"^\\p{L}+$","minLength":2,"maxLength":6}},"required":["code","slug","any","name"]}`,
	`{"type":"array","items":{"type":"string","format":"uri","minLength":1,"maxLength":2083},"minItems":1,"maxItems":2}`,
	`{"$defs":{"Cat":{"properties":{"pet_type":{"const":"cat","title":"Pet Type","type":"string"},"meows":{"title":"Meows","type":"integer"}},"required":["pet_type","meows"],"title":"Cat","type":"object"},"Dog":{"properties":{"pet_type":{"const":"dog","title":"Pet Type","type":"string"},"barks":{"title":"Barks","type":"number"}},"required":["pet_type","barks"],"title":"Dog","type":"object"}},"properties":{"pet":{"discriminator":{"mapping":{"cat":"#/$defs/Cat","dog":"#/$defs/Dog"},"propertyName":"pet_type"},"oneOf":[{"$ref":"#/$defs/Cat"},{"$ref":"#/$defs/Dog"}],"title":"Pet"},"n":{"title":"N","type":"integer"}},"required":["pet","n"],"title":"Model","type":"object"}`,
	`{"type":"object","properties":{"point":{"type":"array","prefixItems":[{"type":"number"},{"type":"number"},{"type":"string","format":"date"}],"minItems":3,"maxItems":3},"tags":{"type":"array","prefixItems":[{"const":"first"}],"items":{"type":"string","maxLength":3}},"v":{"oneOf":[{"type":"string"},{"type":"array","items":{"type":"integer"},"maxItems":2},{"type":"null"}]}},"required":["point","tags","v"]}`,
	`{"type":"object","properties":{"p":{"type":"number","minimum":0,"maximum":1},"t":{"type":"number","exclusiveMinimum":-273.15,"maximum":1000},"price":{"type":"number","multipleOf":0.01,"exclusiveMinimum":0},"n":{"type":"integer","multipleOf":5,"maximum":100}},"required":["p","t","price","n"],"additionalProperties":false}`,
	`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"},"c":{"type":"boolean"},"d":{"type":"null"}},"required":["d"],"minProperties":3,"maxProperties":3}`,
	`{"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":3}`,
	`{"type":"object","properties":{"tags":{"type":"array","items":{"enum":["red","green","blue","re"]},"uniqueItems":true},"flags":{"type":"array","items":{"type":"boolean"},"uniqueItems":true,"minItems":1},"v":{"not":{"type":["null","object","array"]}}},"required":["tags","flags","v"]}`,
	`{"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},"required":["explanation","output"],"additionalProperties":false}},"final_answer":{"type":"string"}},"required":["steps","final_answer"],"additionalProperties":false}`,
}

// randomSchema makes a schema of the supported subset, depth-bounded.
func randomSchema(r *rand.Rand, depth int) map[string]any {
	names := []string{"a", "ab", "name", "value", "x_1", "ünï", "sp ace", "k"}
	pick := r.IntN(10)
	if depth <= 0 && pick >= 6 {
		pick = r.IntN(6)
	}
	switch pick {
	case 0:
		s := map[string]any{"type": "string"}
		if r.IntN(2) == 0 {
			lo := r.IntN(3)
			s["minLength"] = lo
			s["maxLength"] = lo + r.IntN(6)
		}
		switch r.IntN(4) {
		case 0:
			s["format"] = []string{"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"}[r.IntN(10)]
			delete(s, "minLength")
			if r.IntN(2) == 0 {
				delete(s, "maxLength")
			} else {
				s["maxLength"] = 40
			}
		case 1:
			s["pattern"] = []string{`^[a-z]+$`, `^\d{1,3}(\.\d+)?$`, `[aeiou]`, `^(ab|cd)*$`, `^é`, `^[^"\\]{0,4}$`}[r.IntN(6)]
		}
		return s
	case 1:
		if r.IntN(2) == 0 {
			lo := r.IntN(200) - 100
			return map[string]any{"type": "integer", "minimum": lo, "maximum": lo + r.IntN(300)}
		}
		if r.IntN(2) == 0 {
			lo := float64(r.IntN(400)-200) / 8
			s := map[string]any{"type": "number", "minimum": lo, "exclusiveMaximum": lo + float64(1+r.IntN(80))/4}
			if r.IntN(2) == 0 {
				s["multipleOf"] = []float64{0.5, 0.125, 3, 0.01}[r.IntN(4)]
				delete(s, "minimum")
			}
			return s
		}
		return map[string]any{"type": []string{"integer", "number"}[r.IntN(2)]}
	case 2:
		return map[string]any{"type": []any{"boolean", "null", []string{"string", "null"}, []string{"integer", "boolean"}}[r.IntN(4)]}
	case 3:
		vals := []any{"red", "green", "re", 7, 7.5, false, nil, "with \"q\"", map[string]any{"o": 1}}
		r.Shuffle(len(vals), func(i, j int) { vals[i], vals[j] = vals[j], vals[i] })
		return map[string]any{"enum": vals[:1+r.IntN(4)]}
	case 4:
		return map[string]any{"const": []any{"c", 3, true, []any{1, "x"}}[r.IntN(4)]}
	case 5:
		return map[string]any{}
	case 6, 7:
		props := map[string]any{}
		var req []string
		n := 1 + r.IntN(4)
		for i := 0; i < n; i++ {
			nm := names[r.IntN(len(names))]
			props[nm] = randomSchema(r, depth-1)
			if r.IntN(2) == 0 {
				req = append(req, nm)
			}
		}
		s := map[string]any{"type": "object", "properties": props}
		if len(req) > 0 {
			s["required"] = dedupStrings(req)
		}
		switch r.IntN(3) {
		case 0:
			s["additionalProperties"] = false
		case 1:
			s["additionalProperties"] = randomSchema(r, 0)
		}
		return s
	case 8:
		s := map[string]any{"type": "array", "items": randomSchema(r, depth-1)}
		if r.IntN(2) == 0 {
			lo := r.IntN(3)
			s["minItems"] = lo
			s["maxItems"] = lo + r.IntN(3)
		}
		return s
	default:
		k := 2 + r.IntN(2)
		var alts []any
		for i := 0; i < k; i++ {
			alts = append(alts, randomSchema(r, depth-1))
		}
		return map[string]any{"anyOf": alts}
	}
}

// pydanticSchemas are what the openai Python SDK sends for pydantic
// models (fixture by scripts/grammar/make_pydantic_schemas.py).
func pydanticSchemas(t testing.TB) []string {
	b, err := os.ReadFile("testdata/pydantic_schemas.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, name := range []string{"person", "reasoning", "node", "get_weather"} {
		if m[name] == nil {
			t.Fatalf("fixture lacks %s", name)
		}
		out = append(out, string(m[name]))
	}
	return out
}

func dedupStrings(l []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range l {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func propertySchemas(t testing.TB) []string {
	out := append([]string(nil), handSchemas...)
	out = append(out, pydanticSchemas(t)...)
	r := rand.New(rand.NewPCG(1, 2))
	for len(out) < 64 {
		b, err := json.Marshal(randomSchema(r, 3))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

type namedVocab struct {
	name string
	v    *Vocab
}

func vocabOf(t testing.TB, tok *tokenizer.Tokenizer) *Vocab {
	v, err := NewVocab(tok.VocabSize(), tok.TokenBytes, tok.IsSpecial, tok.EOS())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// syntheticVocab has every byte, JSON punctuation runs, words and
// multi-byte characters split across tokens; it runs where no real
// tokenizer is installed.
func syntheticVocab(t testing.TB) *Vocab {
	var toks [][]byte
	for b := 0; b < 256; b++ {
		toks = append(toks, []byte{byte(b)})
	}
	for _, s := range []string{`{"`, `":`, `":"`, `",`, `","`, `"}`, `}}`, `]}`, `},{`, `[{`, `null`, `true`, `false`, `name`, `value`, ` "`, "\n  ", `\n`, `\"`, `\u00`, `é`, "\xc3", "\xa9\"", `日本`, `123`, `.5`, `e-`, `red`, `green`, `abc`, ` the`, `<tool_call>`} {
		toks = append(toks, []byte(s))
	}
	eos := int32(len(toks))
	toks = append(toks, []byte("<eos>"))
	v, err := NewVocab(len(toks), func(id int32) []byte { return toks[id] }, nil, []int32{eos})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var (
	vocabsOnce sync.Once
	vocabs     []namedVocab
)

// testVocabs loads the vocabularies once per test binary.
func testVocabs(t *testing.T) []namedVocab {
	vocabsOnce.Do(func() { vocabs = loadVocabs(t) })
	if vocabs == nil {
		t.Fatal("vocabularies failed to load (see the first test that used them)")
	}
	return vocabs
}

func loadVocabs(t *testing.T) []namedVocab {
	vs := []namedVocab{{"synthetic", syntheticVocab(t)}}
	if p, err := findSmolLM2(); err == nil {
		tok, err := tokenizer.Load(p)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, namedVocab{"smollm2", vocabOf(t, tok)})
	} else {
		t.Logf("SmolLM2 not installed (%v): its vocabulary is not exercised", err)
	}
	if root := os.Getenv("EXO_REAL_TOKENIZERS"); root != "" && !testing.Short() {
		tok, err := tokenizer.Load(filepath.Join(root, "qwen3"))
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, namedVocab{"qwen3", vocabOf(t, tok)})
	}
	return vs
}

// findSmolLM2 resolves SmolLM2 as testenv.SmolLM2 does, without
// skipping the whole test when it is missing.
func findSmolLM2() (string, error) {
	p, err := hf.FindSmolLM2(context.Background())
	if err != nil && os.Getenv("EXO_SMOLLM2_GGUF") != "" {
		panic(err) // a misconfigured run must not pass as a skip
	}
	return p, err
}

// generate runs c to the end choosing random allowed tokens, drifting
// towards closing the document after a while; every step checks the mask
// against the matcher on a sample of allowed and refused tokens.
func generate(t *testing.T, v *Vocab, c *Constraint, r *rand.Rand) []byte {
	t.Helper()
	mask := make([]uint64, v.MaskWords())
	var out []byte
	warm := 5 + r.IntN(40)
	for step := 0; step < 800; step++ {
		c.Mask(mask)
		var allowed []int32
		for w, word := range mask {
			for word != 0 {
				i := int32(w*64 + trailing(word))
				word &= word - 1
				allowed = append(allowed, i)
			}
		}
		if len(allowed) == 0 {
			t.Fatalf("dead end after %q", out)
		}
		checkMask(t, v, c, mask, allowed, r, out)
		id := choose(v, c, allowed, r, step >= warm)
		if err := c.Accept(id); err != nil {
			t.Fatalf("after %q: Accept(%d %q) of an allowed token: %v", out, id, v.TokenBytes(id), err)
		}
		if c.Done() {
			return out
		}
		out = append(out, v.TokenBytes(id)...)
	}
	t.Fatalf("no end after 800 tokens: %q", out)
	return nil
}

func trailing(w uint64) int {
	n := 0
	for w&1 == 0 {
		w >>= 1
		n++
	}
	return n
}

func checkMask(t *testing.T, v *Vocab, c *Constraint, mask []uint64, allowed []int32, r *rand.Rand, out []byte) {
	t.Helper()
	m := c.Matcher()
	for range 6 {
		id := allowed[r.IntN(len(allowed))]
		if v.IsEOS(id) {
			if !m.CanEnd() {
				t.Fatalf("after %q: EOS allowed before the end", out)
			}
			continue
		}
		if !m.Accepts(v.TokenBytes(id)) {
			t.Fatalf("after %q: token %q allowed by the mask but rejected by the matcher", out, v.TokenBytes(id))
		}
	}
	for range 12 {
		id := int32(r.IntN(v.Size()))
		if mask[id/64]&(1<<(id%64)) != 0 {
			continue
		}
		if v.IsEOS(id) {
			if m.CanEnd() {
				t.Fatalf("after %q: EOS refused at the end", out)
			}
			continue
		}
		if b := v.TokenBytes(id); b != nil && m.Accepts(b) {
			t.Fatalf("after %q: token %q refused by the mask but accepted by the matcher", out, b)
		}
	}
}

// choose picks uniformly at first, then prefers what closes the innermost
// value (the matcher's stack top) so that every run ends.
func choose(v *Vocab, c *Constraint, allowed []int32, r *rand.Rand, closing bool) int32 {
	if !closing {
		return allowed[r.IntN(len(allowed))]
	}
	var want []byte
	if m := c.Matcher(); len(m.alts) > 0 {
		f := m.alts[r.IntN(len(m.alts))]
		if f.n.kind == kString && f.st != sStrDone {
			want = []byte(`"`)
		}
		for ; f != nil && want == nil; f = f.up {
			switch {
			case f.n.kind == kObject && f.st == sObjKey:
				want = []byte(`"`)
				// Head for a declared name where only one can come, or one
				// is due (a required property the object cannot close
				// without).
				if c := f.mask & f.n.allowed[f.cnt]; c != 0 && (f.u8 == noAdd || !f.n.closable[f.cnt]) {
					if k := f.n.props[trailing(c)].key; int(f.pos) < len(k) {
						want = k[f.pos : f.pos+1]
					}
				}
			case f.n.kind == kObject && (f.st == sObjFirst || f.st == sObjComma) && !f.n.closable[f.cnt]:
				want = []byte(`"`)
			case f.n.kind == kObject && f.st == sObjColon:
				want = []byte(`:`)
			case f.n.kind == kObject && f.st != sObjDone:
				want = []byte(`}`)
			case f.n.kind == kArray && f.st != sArrDone:
				want = []byte(`]`)
			}
		}
	}
	var single []int32
	for _, id := range allowed {
		if v.IsEOS(id) {
			return id
		}
		if b := v.TokenBytes(id); len(b) == 1 {
			if bytes.IndexByte(want, b[0]) >= 0 {
				return id
			}
			if !isWS(b[0]) {
				single = append(single, id)
			}
		}
	}
	if len(single) > 0 {
		return single[r.IntN(len(single))]
	}
	return allowed[r.IntN(len(allowed))]
}

func TestPropertyGeneratedOutputsValidate(t *testing.T) {
	schemas := propertySchemas(t)
	if len(schemas) < 50 {
		t.Fatalf("only %d schemas", len(schemas))
	}
	for _, nv := range testVocabs(t) {
		t.Run(nv.name, func(t *testing.T) {
			runs, schemas := 3, schemas
			if nv.v.Size() > 100000 { // the big vocabulary, once: the written and pydantic schemas, 8 random
				runs, schemas = 1, schemas[:len(handSchemas)+12]
			}
			for i, s := range schemas {
				g, err := Compile([]byte(s))
				if err != nil {
					t.Fatalf("schema %d %s: %v", i, s, err)
				}
				val := independentValidator(t, s)
				for run := 0; run < runs; run++ {
					r := rand.New(rand.NewPCG(uint64(i), uint64(run)))
					out := generate(t, nv.v, NewConstraint(g, nv.v), r)
					inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
					if err != nil {
						t.Fatalf("schema %d %s: output %q is not JSON: %v", i, s, out, err)
					}
					if run == 0 && i%8 == 0 {
						t.Logf("schema %d: %q", i, out)
					}
					if err := val.Validate(inst); err != nil {
						t.Fatalf("schema %d %s: output %q does not validate: %v", i, s, out, err)
					}
				}
			}
		})
	}
}

func independentValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(schema)))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("independent validator refuses %s: %v", schema, err)
	}
	return sch
}

package grammar

import (
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

const benchSchema = `{"type":"object","properties":{
 "user":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"emails":{"type":"array","items":{"type":"string"}}},"required":["name","age","emails"],"additionalProperties":false},
 "orders":{"type":"array","items":{"type":"object","properties":{
   "id":{"type":"integer"},
   "lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer"},"price":{"type":"number"}},"required":["sku","qty","price"],"additionalProperties":false}},
   "status":{"enum":["open","shipped","cancelled"]},
   "note":{"anyOf":[{"type":"string"},{"type":"null"}]}},
  "required":["id","lines","status","note"],"additionalProperties":false}},
 "tags":{"type":"array","items":{"type":"string"},"maxItems":5}},
 "required":["user","orders","tags"],"additionalProperties":false}`

const benchDoc = `{"user": {"name": "Ada Lovelace", "age": 36, "emails": ["ada@example.com", "countess@lovelace.org"]}, ` +
	`"orders": [{"id": 1843, "lines": [{"sku": "ENGINE-ANALYTICAL", "qty": 1, "price": 17470.5}, {"sku": "PUNCH-CARD", "qty": 400, "price": 0.25}], "status": "shipped", "note": "Deliver to the Royal Society, attention of Mr. Babbage."}, ` +
	`{"id": 1844, "lines": [{"sku": "NOTE-G", "qty": 3, "price": 12}], "status": "open", "note": null}], ` +
	`"tags": ["mathematics", "poetical science", "bernoulli"]}`

// BenchmarkMaskQwen3 times Constraint.Mask per token over the Qwen3
// vocabulary (151k) while following the tokenization of benchDoc, a
// document of the nested benchSchema. cold: every mask computed (no
// cache); cached: as a first generation runs it (masks reused by state
// within it); shared: a later generation of the same grammar (masks of
// earlier generations reused, up to maxShared of them). The
// baseline is one pass over a float32 logits row of the vocabulary (what
// applying any mask costs), timed in the same run.
func BenchmarkMaskQwen3(b *testing.B) {
	root := os.Getenv("EXO_REAL_TOKENIZERS")
	if root == "" {
		b.Skip("set EXO_REAL_TOKENIZERS (scripts/run-tests fetches it)")
	}
	tok, err := tokenizer.Load(filepath.Join(root, "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	v := vocabOf(b, tok)
	b.Logf("trie over %d tokens: %d nodes, built in %v", v.Size(), len(v.nodes), time.Since(t0))
	benchMasks(b, tok, v, func() *Grammar { return mustCompile(b, benchSchema) }, benchDoc)
	logits := make([]float32, v.Size())
	b.Run("baseline-logits-pass", func(b *testing.B) {
		mask := make([]uint64, v.MaskWords())
		for i := range mask {
			mask[i] = 0x5555555555555555
		}
		b.SetBytes(int64(4 * len(logits)))
		for b.Loop() {
			for i := range logits {
				if mask[i/64]&(1<<(i%64)) == 0 {
					logits[i] = float32(math.Inf(-1))
				}
			}
		}
	})
}

// benchMasks times Mask while following doc's tokens through a grammar
// made by mk (cold, cached and shared, as BenchmarkMaskQwen3 says).
func benchMasks(b *testing.B, tok *tokenizer.Tokenizer, v *Vocab, mk func() *Grammar, doc string) {
	g := mk()
	ids := tok.Encode(doc)
	if ids[0] == tok.BOS() {
		ids = ids[1:]
	}
	b.Logf("document: %d bytes, %d tokens", len(doc), len(ids))
	for _, mode := range []string{"cold", "cached", "shared"} {
		b.Run(mode, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var d, cpu []time.Duration
			mask := make([]uint64, v.MaskWords())
			for b.Loop() {
				gg := g
				if mode != "shared" { // a grammar of its own: nothing from earlier generations
					gg = mk()
				}
				c := NewConstraint(gg, v)
				if mode == "cold" {
					c.cache = nil
				}
				for _, id := range ids {
					c0, ok := threadCPU()
					t := time.Now()
					c.Mask(mask)
					d = append(d, time.Since(t))
					if c1, _ := threadCPU(); ok {
						cpu = append(cpu, c1-c0)
					}
					if mask[id/64]&(1<<(id%64)) == 0 {
						b.Fatalf("token %q of the document is masked", v.TokenBytes(id))
					}
					if err := c.Accept(id); err != nil {
						b.Fatal(err)
					}
				}
			}
			report := func(d []time.Duration, unit string) {
				if len(d) == 0 {
					return
				}
				slices.Sort(d)
				us := func(x time.Duration) float64 { return float64(x.Nanoseconds()) / 1e3 }
				b.ReportMetric(us(d[len(d)/2]), "p50-"+unit)
				b.ReportMetric(us(d[len(d)*99/100]), "p99-"+unit)
				b.ReportMetric(us(d[len(d)-1]), "max-"+unit)
			}
			report(d, "wall-µs/token")
			report(cpu, "cpu-µs/token")
		})
	}
}

// BenchmarkMaskManyToolsQwen3: masks over Qwen3's vocabulary while a
// Hermes-wrapped call to the last of 64 tools is written; the 64 tools'
// names share a prefix, so all 64 alternatives stay open until the name
// differs (more than the 32 the matcher once kept).
func BenchmarkMaskManyToolsQwen3(b *testing.B) {
	root := os.Getenv("EXO_REAL_TOKENIZERS")
	if root == "" {
		b.Skip("set EXO_REAL_TOKENIZERS (scripts/run-tests fetches it)")
	}
	tok, err := tokenizer.Load(filepath.Join(root, "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	v := vocabOf(b, tok)
	tools := manyTools(64)
	mk := func() *Grammar {
		g, err := ToolCalls(tools, hermes)
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	benchMasks(b, tok, v, mk, "<tool_call>\n"+`{"name": "lookup_record_063", "arguments": {"p63": 7, "note": "the last one"}}`+"\n</tool_call>")
}

const benchPatternSchema = `{"type":"object","properties":{
 "id":{"type":"string","format":"uuid"},
 "created":{"type":"string","format":"date-time"},
 "email":{"type":"string","format":"email"},
 "site":{"type":"string","format":"uri"},
 "sku":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{4}$"},
 "title":{"type":"string","pattern":"^[A-Za-z ,.'-]+$","maxLength":80},
 "note":{"type":"string","pattern":"\\S"},
 "ip":{"type":"string","format":"ipv4"}},
 "required":["id","created","email","site","sku","title","note","ip"],"additionalProperties":false}`

const benchPatternDoc = `{"id": "123e4567-e89b-12d3-a456-426614174000", "created": "2024-05-01T12:30:00.250+01:00", ` +
	`"email": "ada.lovelace@example.org", "site": "https://example.org/notes/g?lang=en#bernoulli", "sku": "ENG-1843", ` +
	`"title": "Notes on the Analytical Engine, by A. A. L.", "note": "Deliver to the Royal Society, attention of Mr. Babbage.", "ip": "192.168.10.1"}`

// BenchmarkMaskPatternQwen3: masks over Qwen3's vocabulary while a
// document of formats and patterns (uuid, date-time, email, uri, ipv4,
// anchored and unanchored patterns, one with a maxLength counted beside
// its automaton) is written; plain is BenchmarkMaskQwen3's schema and
// document in the same run, the baseline of the ratio in BENCHMARKS.md.
func BenchmarkMaskPatternQwen3(b *testing.B) {
	root := os.Getenv("EXO_REAL_TOKENIZERS")
	if root == "" {
		b.Skip("set EXO_REAL_TOKENIZERS (scripts/run-tests fetches it)")
	}
	tok, err := tokenizer.Load(filepath.Join(root, "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	v := vocabOf(b, tok)
	b.Run("plain", func(b *testing.B) {
		benchMasks(b, tok, v, func() *Grammar { return mustCompile(b, benchSchema) }, benchDoc)
	})
	b.Run("pattern", func(b *testing.B) {
		benchMasks(b, tok, v, func() *Grammar { return mustCompile(b, benchPatternSchema) }, benchPatternDoc)
	})
}

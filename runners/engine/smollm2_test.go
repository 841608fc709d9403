package engine_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

type smol struct {
	m    *engine.Model
	tok  *tokenizer.Tokenizer
	tmpl *chat.Template
}

var (
	smolOnce sync.Once
	smolVal  smol
	smolErr  error
)

// loadSmol loads the model once per test binary (it takes seconds).
func loadSmol(t testing.TB) smol {
	path := testenv.SmolLM2(t)
	smolOnce.Do(func() {
		b, err := backend.Open("cpu", backend.Options{})
		if err != nil {
			smolErr = err
			return
		}
		if smolVal.m, smolErr = engine.Load(context.Background(), path, b, engine.LoadOptions{}); smolErr != nil {
			return
		}
		if smolVal.tok, smolErr = tokenizer.Load(path); smolErr != nil {
			return
		}
		smolVal.tmpl, smolErr = chat.Load(path)
	})
	if smolErr != nil {
		t.Fatal(smolErr)
	}
	return smolVal
}

func (s smol) promptIDs(t testing.TB, question string) []int32 {
	text, err := s.tmpl.Render([]chat.Message{{Role: "user", Content: question}}, true)
	if err != nil {
		t.Fatal(err)
	}
	return s.tok.Encode(text)
}

// generate decodes greedily from logits until EOS or n tokens.
func (s smol) generate(t testing.TB, c engine.KVCache, logits []float32, n int) []int32 {
	t.Helper()
	var out []int32
	for range n {
		next := int32(argmax(logits))
		if slices.Contains(s.tok.EOS(), next) {
			break
		}
		out = append(out, next)
		var err error
		if logits, err = s.m.Forward(context.Background(), c, []int32{next}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestSmolLM2CapitalOfFrance is the acceptance test: the real instruct
// model, loaded from its GGUF, answers greedily and mentions Paris.
func TestSmolLM2CapitalOfFrance(t *testing.T) {
	s := loadSmol(t)
	ids := s.promptIDs(t, "What is the capital of France?")
	c := s.m.NewCache()
	logits, err := s.m.Forward(context.Background(), c, ids)
	if err != nil {
		t.Fatal(err)
	}
	reply := s.tok.Decode(s.generate(t, c, logits, 24))
	t.Logf("reply: %q", reply)
	if !strings.Contains(reply, "Paris") {
		t.Fatalf("reply %q does not mention Paris", reply)
	}
}

// TestSmolLM2ImportedKVDecodesTheSame: KV exported from a cache prefilled
// in chunks (exporting each chunk from onChunk, as the prefill runner does)
// and imported on top of a locally computed prefix (start_pos > 0) gives the
// same greedy continuation as local prefill; chunked prefill gives it too.
func TestSmolLM2ImportedKVDecodesTheSame(t *testing.T) {
	s := loadSmol(t)
	ctx := context.Background()
	ids := s.promptIDs(t, "Name three primary colors.")
	body, last := ids[:len(ids)-1], ids[len(ids)-1]

	local := s.m.NewCache()
	if err := s.m.Prefill(ctx, local, body, 0, nil); err != nil {
		t.Fatal(err)
	}
	lg, err := s.m.Forward(ctx, local, []int32{last})
	if err != nil {
		t.Fatal(err)
	}
	want := s.generate(t, local, lg, 12)

	chunked := s.m.NewCache()
	if err := s.m.Prefill(ctx, chunked, body, 7, nil); err != nil {
		t.Fatal(err)
	}
	for l := range s.m.Info().Layers {
		k1, v1, _ := local.Export(l, 0, len(body))
		k2, v2, _ := chunked.Export(l, 0, len(body))
		if string(k1) != string(k2) || string(v1) != string(v2) {
			t.Fatalf("layer %d: KV of chunked prefill differs from one-shot", l)
		}
	}
	lg, err = s.m.Forward(ctx, chunked, []int32{last})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.generate(t, chunked, lg, 12); !slices.Equal(got, want) {
		t.Fatalf("chunked prefill decodes %q, one-shot %q", s.tok.Decode(got), s.tok.Decode(want))
	}

	const startPos = 10
	remote := s.m.NewCache()
	var exported [][2][]byte
	layers := s.m.Info().Layers
	if err := s.m.Prefill(ctx, remote, body, 16, func(start, n int) error {
		for l := range layers {
			k, v, err := remote.Export(l, start, n)
			if err != nil {
				return err
			}
			exported = append(exported, [2][]byte{k, v})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dst := s.m.NewCache()
	if err := s.m.Prefill(ctx, dst, body[:startPos], 0, nil); err != nil {
		t.Fatal(err)
	}
	// Re-export the range past startPos from the finished remote cache.
	for l := range layers {
		k, v, err := remote.Export(l, startPos, len(body)-startPos)
		if err != nil {
			t.Fatal(err)
		}
		if err := dst.Import(l, startPos, len(body)-startPos, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if len(exported) != layers*((len(body)+15)/16) {
		t.Fatalf("onChunk exported %d layer chunks", len(exported))
	}
	if err := dst.Commit(len(body)); err != nil {
		t.Fatal(err)
	}
	lg, err = s.m.Forward(ctx, dst, []int32{last})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.generate(t, dst, lg, 12); !slices.Equal(got, want) {
		t.Fatalf("imported KV decodes %q, local %q", s.tok.Decode(got), s.tok.Decode(want))
	}
	t.Logf("continuation: %q", s.tok.Decode(want))
}

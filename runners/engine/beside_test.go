package engine_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// TestLoadBeside: a draft loaded Beside its target on the same cpu backend
// (one step arena) steps concurrently with it — a decode runner drafts
// while its batch steps — and every logit equals what each gives alone
// (under -race, without the shared lock the two steps race on the arena);
// a model of another backend is refused.
func TestLoadBeside(t *testing.T) {
	ctx := context.Background()
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	write := func(layers int) string {
		dir := filepath.Join(t.TempDir(), "m")
		if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: layers}); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	targetDir, draftDir := write(2), write(1)
	target, err := engine.Load(ctx, targetDir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	draft, err := engine.Load(ctx, draftDir, b, engine.LoadOptions{Beside: target})
	if err != nil {
		t.Fatal(err)
	}
	defer draft.Close()
	other, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Load(ctx, draftDir, other, engine.LoadOptions{Beside: target}); err == nil || !strings.Contains(err.Error(), "another backend") {
		t.Fatalf("Beside a model of another backend: %v", err)
	}
	prompt := testmodel.ReferencePrompts()[1]
	run := func(m *engine.Model) [][]float32 {
		c := m.NewCache()
		defer c.Free()
		var out [][]float32
		l, err := m.Forward(ctx, c, prompt)
		for i := 0; err == nil && i < 40; i++ {
			out = append(out, slices.Clone(l))
			l, err = m.Forward(ctx, c, []int32{int32(10 + i)})
		}
		if err != nil {
			t.Error(err)
		}
		return out
	}
	want := [][][]float32{run(target), run(draft)}
	got := make([][][]float32, 2)
	var wg sync.WaitGroup
	for i, m := range []*engine.Model{target, draft} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = run(m)
		}()
	}
	wg.Wait()
	for i := range want {
		for step := range want[i] {
			if !slices.Equal(got[i][step], want[i][step]) {
				t.Fatalf("model %d, step %d: logits stepping beside the other differ from alone", i, step)
			}
		}
	}
}

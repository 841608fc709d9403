package paced

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend" // registers the weight loaders
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
)

// The paced prefill computes the same cache (every chunk handed on, in
// order) and gives up with the caller's context while it waits.
func TestPacedPrefill(t *testing.T) {
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("..", "..", "runners", "engine", "testdata", "reference", "qwen3_next"), cpu.New(1), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	toks := make([]int32, 40)
	for i := range toks {
		toks[i] = int32(3 + i)
	}
	p := Model{m, 1e6}
	c := m.NewCache()
	defer c.Free()
	var got [][2]int
	if err := p.Prefill(ctx, c, toks, 16, func(start, n int) error { got = append(got, [2]int{start, n}); return nil }); err != nil {
		t.Fatal(err)
	}
	if c.Len() != len(toks) || len(got) != 3 || got[0] != [2]int{0, 16} || got[2] != [2]int{32, 8} {
		t.Errorf("cache len %d, chunks %v", c.Len(), got)
	}
	// At one token a second the first chunk's turn is 16 s away: a
	// cancelled context ends the wait.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	c3 := m.NewCache()
	defer c3.Free()
	if err := (Model{m, 1}).Prefill(cctx, c3, toks, 16, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

package engine_test

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// closeRows fails unless got and want (logits of one position) agree to a
// small fraction of want's spread and pick the same argmax.
func closeRows(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d logits, want %d", what, len(got), len(want))
	}
	tol := 1e-3*float64(maxMinusMin(want)) + 1e-5
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol {
			t.Fatalf("%s: logit %d = %v, want %v (|d| %g > %g)", what, i, got[i], want[i], d, tol)
		}
	}
	if argmax(got) != argmax(want) {
		t.Fatalf("%s: argmax %d, want %d", what, argmax(got), argmax(want))
	}
}

// TestForwardAllEqualsStepwise: on every architecture family of the tiny
// models, ForwardAllInto's row i after a prefilled prompt equals the logits
// Forward returns after feeding the same tokens one at a time; and, where
// the cache can go back (full attention), truncating past rejected rows
// and continuing with another token gives the logits of a cache that never
// held them (a speculative decoder's rollback).
func TestForwardAllEqualsStepwise(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type model struct {
		name string
		dir  func(t *testing.T) string
	}
	var models []model
	for _, arch := range []string{"llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "mistral", "gemma3", "gptoss"} {
		models = append(models, model{arch, func(t *testing.T) string {
			dir := t.TempDir()
			if err := testmodel.Write(dir, testmodel.Spec{Arch: arch, Seed: 5}); err != nil {
				t.Fatal(err)
			}
			return dir
		}})
	}
	for _, ref := range []string{"smollm3", "olmo2", "qwen3_next", "qwen3_5"} {
		models = append(models, model{ref, func(*testing.T) string { return filepath.Join("testdata", "reference", ref) }})
	}
	for _, mc := range models {
		t.Run(mc.name, func(t *testing.T) {
			m, err := engine.Load(ctx, mc.dir(t), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			prompt := testmodel.ReferencePrompts()[1]
			feed := []int32{7, 11, 13, 17, 19}
			step := m.NewCache()
			defer step.Free()
			if _, err := m.Forward(ctx, step, prompt); err != nil {
				t.Fatal(err)
			}
			var want [][]float32
			for _, tok := range feed {
				l, err := m.Forward(ctx, step, []int32{tok})
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, append([]float32(nil), l...))
			}
			c := m.NewCache()
			defer c.Free()
			if _, err := m.Forward(ctx, c, prompt); err != nil {
				t.Fatal(err)
			}
			rows, err := m.ForwardAllInto(ctx, c, feed, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != len(feed) || c.Len() != len(prompt)+len(feed) {
				t.Fatalf("%d rows, cache %d; want %d rows, cache %d", len(rows), c.Len(), len(feed), len(prompt)+len(feed))
			}
			for i := range feed {
				closeRows(t, "row "+string(rune('0'+i)), rows[i], want[i])
			}
			info := m.Info()
			if info.Windows != nil || info.Recurrent != nil {
				return // these caches' rollback: TestSpeculativeRollbackEqualsRecompute
			}
			// Keep the first two fed tokens, reject the rest, continue with 23.
			keep := len(prompt) + 2
			if !c.CanTruncate(keep) {
				t.Fatalf("full-attention cache cannot truncate to %d", keep)
			}
			c.Truncate(keep)
			got, err := m.Forward(ctx, c, []int32{23})
			if err != nil {
				t.Fatal(err)
			}
			fresh := m.NewCache()
			defer fresh.Free()
			if _, err := m.Forward(ctx, fresh, append(append([]int32(nil), prompt...), feed[:2]...)); err != nil {
				t.Fatal(err)
			}
			re, err := m.Forward(ctx, fresh, []int32{23})
			if err != nil {
				t.Fatal(err)
			}
			closeRows(t, "after rollback", got, re)
		})
	}
}

// TestForwardBatchAllEqualsAlone: on every architecture family of the tiny
// models (sliding windows, MoE, Gated DeltaNet hybrids), one
// ForwardBatchAllInto step of three sequences of different lengths (a
// speculating generation's token and drafts beside ones that feed one
// token) gives each sequence's rows bit for bit as ForwardAllInto of that
// sequence alone on the cpu backend, leaves each cache as long as alone,
// and, after a hybrid or sliding cache goes back past rejected rows, the
// next batched step still equals the sequence's alone.
func TestForwardBatchAllEqualsAlone(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dirs := map[string]func(t *testing.T) string{}
	for _, arch := range []string{"llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "mistral", "gemma3", "gptoss"} {
		dirs[arch] = func(t *testing.T) string {
			dir := t.TempDir()
			if err := testmodel.Write(dir, testmodel.Spec{Arch: arch, Seed: 5}); err != nil {
				t.Fatal(err)
			}
			return dir
		}
	}
	for _, ref := range []string{"smollm3", "olmo2", "qwen3_next", "qwen3_5"} {
		dirs[ref] = func(*testing.T) string { return filepath.Join("testdata", "reference", ref) }
	}
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			m, err := engine.Load(ctx, dir(t), b, engine.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			prompts := testmodel.ReferencePrompts()
			// Two rounds: the second after each sequence kept only part
			// of its first chunk (a verification's rollback).
			rounds := [][][]int32{
				{{7, 11, 13, 17, 19}, {23}, {29, 31, 37}},
				{{41, 43, 47}, {53, 59}, {61}},
			}
			keep := []int{2, 1, 1} // of round 0's chunks
			batch := make([]engine.KVCache, 3)
			alone := make([]engine.KVCache, 3)
			for i := range batch {
				batch[i], alone[i] = m.NewCache(), m.NewCache()
				defer batch[i].Free()
				defer alone[i].Free()
				p := prompts[i%len(prompts)]
				for _, c := range []engine.KVCache{batch[i], alone[i]} {
					if _, err := m.Forward(ctx, c, p); err != nil {
						t.Fatal(err)
					}
				}
			}
			for r, chunks := range rounds {
				for i := range batch {
					if r > 0 {
						// The rollback: both go back to keep what they kept
						// (a hybrid cache to its mark: the kept tokens are
						// fed again, as the decode runner does).
						n := alone[i].Len() - len(rounds[r-1][i]) + keep[i]
						for _, c := range []engine.KVCache{batch[i], alone[i]} {
							if !c.CanTruncate(n) {
								t.Fatalf("cache %d cannot go back to %d", i, n)
							}
							c.Truncate(n)
						}
						if got := batch[i].Len(); got != alone[i].Len() {
							t.Fatalf("cache %d: %d after the rollback, alone %d", i, got, alone[i].Len())
						}
						if lost := n - batch[i].Len(); lost > 0 {
							chunks[i] = append(append([]int32(nil), rounds[r-1][i][keep[i]-lost:keep[i]]...), chunks[i]...)
						}
					}
				}
				var want [][]float32
				for i, c := range alone {
					rows, err := m.ForwardAllInto(ctx, c, chunks[i], nil)
					if err != nil {
						t.Fatal(err)
					}
					for _, row := range rows {
						want = append(want, append([]float32(nil), row...))
					}
				}
				rows, err := m.ForwardBatchAllInto(ctx, batch, chunks, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) != len(want) {
					t.Fatalf("round %d: %d rows, want %d", r, len(rows), len(want))
				}
				for j := range want {
					if !sameBits(rows[j], want[j]) {
						t.Fatalf("round %d: row %d differs from the sequence's alone", r, j)
					}
				}
				for i := range batch {
					if batch[i].Len() != alone[i].Len() {
						t.Fatalf("round %d: cache %d holds %d, alone %d", r, i, batch[i].Len(), alone[i].Len())
					}
				}
			}
		})
	}
}

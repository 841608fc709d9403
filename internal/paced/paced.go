// Package paced is a TEST HOOK: it caps a model's prefill at a rate, so
// that one machine can look like several hosts of different speeds in the
// routing and scheduling end-to-end tests (the runner's hidden
// --test-slow-prefill-tokens-per-sec flag). Nothing in production serving
// uses it. It wraps *engine.Model and changes nothing but Prefill's pace.
package paced

import (
	"context"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Model caps prefill at Rate tokens/s: each chunk is handed on (and the
// call returns) no earlier than its last token's turn at that rate, so a
// remote stream flows at the simulated pace too. Real compute slower than
// the cap is not hidden: the time is then the real one.
type Model struct {
	*engine.Model
	Rate float64
}

// Prefill is engine.Model.Prefill, paced.
func (p Model) Prefill(ctx context.Context, c engine.KVCache, toks []int32, chunk int, on func(start, n int) error) error {
	t0 := time.Now()
	wait := func(tokens int) error {
		d := time.Until(t0.Add(time.Duration(float64(tokens) / p.Rate * float64(time.Second))))
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	base := c.Len()
	paced := func(start, n int) error {
		if err := wait(start + n - base); err != nil {
			return err
		}
		if on == nil {
			return nil
		}
		return on(start, n)
	}
	if err := p.Model.Prefill(ctx, c, toks, chunk, paced); err != nil {
		return err
	}
	return wait(len(toks))
}

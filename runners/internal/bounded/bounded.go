// Package bounded owns waiting on a call that may never return — MLX's
// group join waits for every rank or stage, and mlx-c cannot cancel it —
// for at most a bound: runners/stage's join of the stages' group and
// runners/tensor's join of the ranks' group wait through it.
//
// It must not know what the call is, nor end the process: a call past its
// bound is left running and the caller decides (a runner exits, and the
// supervisor restarts the group).
package bounded

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrTimeout is wrapped by Call's error when the call did not finish
// within its bound.
var ErrTimeout = errors.New("the call did not finish in its bound")

// Call runs f and waits for it at most timeout, or until ctx ends. It
// returns f's result; past the bound an error wrapping ErrTimeout (naming
// the bound); once ctx ends, context.Cause(ctx). f is then left behind:
// its result, if it ever comes, is dropped.
func Call[T any](ctx context.Context, timeout time.Duration, f func() (T, error)) (T, error) {
	type res struct {
		v   T
		err error
	}
	done := make(chan res, 1) // f's send never blocks when nobody waits
	go func() {
		v, err := f()
		done <- res{v, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	var zero T
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C:
		return zero, fmt.Errorf("%w (%v)", ErrTimeout, timeout)
	case <-ctx.Done():
		return zero, context.Cause(ctx)
	}
}

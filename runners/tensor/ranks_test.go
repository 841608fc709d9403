package tensor

import (
	"context"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
)

// ranks is what the tests' tensor groups share, whatever their ranks run
// (decode steps: group; prefill computations: prefillGroup): rank 0's
// Leader serving on loopback TCP, and followers, goroutines over real TCP
// links, that can be stopped (their link drops) and started again.
type ranks struct {
	t     *testing.T
	path  string // the model every rank loads
	g     *Leader
	addr  string
	ctx   context.Context      // rank 0's: done at cleanup
	stops []context.CancelFunc // per follower rank (index rank)
	done  []chan error
}

// startRanks starts rank 0's Leader (cfg) of a group of cfg.Size ranks on
// a loopback port. At cleanup every follower still running is stopped,
// then the Leader, whose Serve must end without an error.
func startRanks(t *testing.T, path string, cfg LeaderConfig) *ranks {
	t.Helper()
	g, err := NewLeader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := testutil.Serve(t, ctx, g.Serve) // cancelled after the cleanup below
	rs := &ranks{t: t, path: path, g: g, addr: addr, ctx: ctx,
		stops: make([]context.CancelFunc, cfg.Size), done: make([]chan error, cfg.Size)}
	t.Cleanup(func() {
		for r := range rs.stops {
			rs.stop(r)
		}
		cancel()
	})
	return rs
}

// follow runs f, rank r's follower, with m until stop(r); serve, when set,
// is first called with the rank's context (what the rank serves beside
// its link, its KV port, stops with it).
func (rs *ranks) follow(r int, f *Follower, m *engine.Model, serve func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	if serve != nil {
		serve(ctx)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, m) }()
	rs.stops[r], rs.done[r] = cancel, done
}

// stop stops follower rank r (its link drops), which must end without an
// error; a rank not running is left alone.
func (rs *ranks) stop(r int) {
	if rs.stops[r] == nil {
		return
	}
	rs.stops[r]()
	if err := <-rs.done[r]; err != nil {
		rs.t.Errorf("rank %d: %v", r, err)
	}
	rs.stops[r] = nil
}

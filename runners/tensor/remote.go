package tensor

import (
	"context"
	"fmt"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
)

// Remote fills a group cache from prefill runners: every rank asks for
// its own KV heads (the fill call; PROTOCOL.md §20), rank 0 through
// inner, a decode.Remote built on rank 0's share (its KVHeadRange), the
// followers through theirs (Follower.SetFill). A fill counts only when
// every rank's succeeded: otherwise every rank goes back to start and the
// error is returned, so that the decode server prefills locally.
func (g *Leader) Remote(inner decode.Remote) decode.Remote { return &remote{g: g, inner: inner} }

type remote struct {
	g     *Leader
	inner decode.Remote
}

func (r *remote) Classify(err error) string { return r.inner.Classify(err) }

func (r *remote) Prefill(ctx context.Context, reqID string, prompt []int32, start int, c engine.KVCache, prefer []string) (decode.RemoteStats, error) {
	g := r.g
	g.callMu.Lock()
	defer g.callMu.Unlock()
	cc, err := local(c)
	if err != nil {
		return decode.RemoteStats{}, err
	}
	if cc.local.Len() != start {
		return decode.RemoteStats{}, fmt.Errorf("tensor: remote fill from %d of a cache holding %d", start, cc.local.Len())
	}
	var st decode.RemoteStats
	// The ranks fetch at once (the prefill runner computes the prompt
	// once; its prefix cache serves the other ranks). rank 0's fetch may
	// be cancelled with ctx: a fill has no all_sums to keep in step.
	err = g.call(ctx, &call{op: opFill, ids: []uint64{cc.id}, n: start, tokens: prompt, reqID: reqID, prefer: prefer}, true,
		func(context.Context) error {
			var err error
			st, err = r.inner.Prefill(ctx, reqID, prompt, start, cc.local, prefer)
			return err
		})
	if err == nil && cc.local.Len() != len(prompt)-1 {
		err = fmt.Errorf("tensor: rank 0's remote fill ended at %d of %d", cc.local.Len(), len(prompt)-1)
	}
	if err != nil {
		// Some ranks may hold the prompt's KV: back to start on every
		// rank (a whole group only; a broken one is emptied when it is
		// whole again).
		if terr := g.call(context.Background(), &call{op: opTruncate, ids: []uint64{cc.id}, n: start}, false, func(context.Context) error { return nil }); terr == nil || cc.local.CanTruncate(start) {
			if cc.local.CanTruncate(start) {
				cc.local.Truncate(start)
			} else {
				cc.local.Truncate(0)
			}
		}
		return st, err
	}
	return st, nil
}

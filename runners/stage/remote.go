package stage

import (
	"context"
	"fmt"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
)

// Remote is remote prefill into a pipeline, a decode.Remote for stage 0's
// Server: stage 0 fetches its own layers' KV (Local, a decode.KVRemote over
// stage 0's model, asks the prefill runner for its layer range only), then
// every later stage fetches its range from the same prefill runner (a Fill
// down the ring, each stage's own KVRemote). Either every stage commits
// the same length, or every stage is put back where it began.
type Remote struct {
	Ring  *Ring
	Local decode.Remote
}

var _ decode.Remote = (*Remote)(nil)

// Prefill implements decode.Remote.
func (rm *Remote) Prefill(ctx context.Context, reqID string, prompt []int32, start int, cache engine.KVCache, prefer []string) (decode.RemoteStats, error) {
	sc, err := rm.Ring.seq(cache)
	if err != nil {
		return decode.RemoteStats{}, err
	}
	if sc.epoch == 0 {
		if err := sc.ready(); err != nil || sc.epoch == 0 {
			return decode.RemoteStats{}, fmt.Errorf("%w: no ring to fill", ErrDown)
		}
	}
	// The injection runs beside other sequences' steps: the engine's
	// caches take the model's lock where they use the backend.
	st, err := rm.Local.Prefill(ctx, reqID, prompt, start, sc.local, prefer)
	if err != nil {
		return st, err
	}
	got := sc.local.Len()
	msg, err := rm.Ring.call(ctx, sc.epoch, func(t uint64) any {
		return Fill{Ticket: t, Seq: sc.id, Start: start, OK: true, Len: got, Endpoint: st.Endpoint, ID: reqID, Tokens: prompt}
	})
	f, ok := msg.(Fill)
	switch {
	case err != nil:
	case !ok:
		err = fmt.Errorf("%w: the answer to a fill is %T", ErrCorrupt, msg)
	case !f.OK:
		err = fmt.Errorf("stage: a later stage could not fetch its layers from %s (see its log)", st.Endpoint)
	case f.Len != got:
		err = fmt.Errorf("stage: the stages' remote fills ended at different lengths (%d here, %d on a later stage)", got, f.Len)
	}
	if err != nil {
		cache.Truncate(start) // every stage back to start (or, where a layer cannot go back, an empty sequence)
		return st, fmt.Errorf("pipeline remote prefill: %w", err)
	}
	st.Bytes += f.Bytes
	return st, nil
}

// Classify implements decode.Remote.
func (rm *Remote) Classify(err error) string { return rm.Local.Classify(err) }

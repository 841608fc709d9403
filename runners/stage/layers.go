package stage

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// Layers is a stage's layers as its Ring or Node drives them: a loaded
// *engine.Model, or the stage's tensor group (runners/tensor's Model on
// the group's rank 0: each step and each cache's truncation and free run
// on every rank of the stage's group; the followers talk to their rank 0
// only). Info and Fingerprint are the whole model's.
type Layers interface {
	Info() engine.ModelInfo
	Fingerprint() engine.Fingerprint
	NewCache() engine.KVCache
	StageStep(ctx context.Context, caches []engine.KVCache, toks [][]int32, hidden []float32) (out []float32, logits [][]float32, err error)
}

// carried is Layers whose hidden states a Group's carrier can move
// (*engine.Model; a tensor group's are not: its process's one MLX group
// is the ranks' all_sum).
type carried interface {
	Layers
	StageStepCarried(ctx context.Context, caches []engine.KVCache, toks [][]int32, c engine.Carrier, ready func() error) ([][]float32, engine.CarryStats, error)
	DiscardCarried(rows int, c engine.Carrier) error
}

var _ carried = (*engine.Model)(nil)

// checkCarried refuses a Group over layers a carrier cannot move.
func checkCarried(g *Group, m Layers) error {
	if g == nil {
		return nil
	}
	if _, ok := m.(carried); !ok {
		return fmt.Errorf("stage: a Group carries hidden states of an engine model, not of %T (a stage of tensor ranks keeps them on the stage link)", m)
	}
	return nil
}

// healthPoll is how often a stage whose own condition (Health) fails
// looks at it again, and how often a linked stage checks it.
const healthPoll = 100 * time.Millisecond

// awaitHealth waits until health (nil: none) is nil or ctx ends; it logs
// why it waits, once.
func awaitHealth(ctx context.Context, health func() error, log *slog.Logger) error {
	if health == nil {
		return nil
	}
	logged := false
	for {
		err := health()
		if err == nil {
			return nil
		}
		if !logged {
			log.Warn("stage: not linking while this stage's own group is not whole", "err", err)
			logged = true
		}
		t := time.NewTimer(healthPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// watchHealth closes in and out with health's error when it fails while
// they are up (the stage's tensor group lost a rank: its sequences'
// caches are gone, so the ring is rebuilt and every request in flight
// fails, naming why).
func watchHealth(health func() error, in, out *Link) {
	if health == nil {
		return
	}
	tick := time.NewTicker(healthPoll)
	defer tick.Stop()
	for {
		select {
		case <-in.Done():
			return
		case <-out.Done():
			return
		case <-tick.C:
		}
		if err := health(); err != nil {
			err = fmt.Errorf("%w: this stage's tensor group: %w", ErrDown, err)
			out.Close(err)
			in.Close(err)
			return
		}
	}
}

// ByEndpoint is a decode.Remote that fetches from the endpoint a fill
// prefers (its first), through a client mk makes once per endpoint: a
// later stage's tensor follower given no --prefill of its own fetches its
// KV heads of the stage's layers from the prefill runner stage 0 chose.
func ByEndpoint(mk func(endpoint string) decode.Remote) decode.Remote {
	return &byEndpoint{mk: mk, rs: map[string]decode.Remote{}}
}

type byEndpoint struct {
	mk   func(string) decode.Remote
	mu   sync.Mutex
	rs   map[string]decode.Remote
	last decode.Remote
}

func (b *byEndpoint) Prefill(ctx context.Context, reqID string, prompt []int32, start int, c engine.KVCache, prefer []string) (decode.RemoteStats, error) {
	if len(prefer) == 0 || prefer[0] == "" {
		return decode.RemoteStats{}, fmt.Errorf("stage: a remote fill names no prefill endpoint, and this runner has no --prefill")
	}
	b.mu.Lock()
	r := b.rs[prefer[0]]
	if r == nil {
		r = b.mk(prefer[0])
		b.rs[prefer[0]] = r
	}
	b.last = r
	b.mu.Unlock()
	return r.Prefill(ctx, reqID, prompt, start, c, prefer[:1])
}

func (b *byEndpoint) Classify(err error) string {
	b.mu.Lock()
	last := b.last
	b.mu.Unlock()
	if last == nil {
		return metrics.OutcomeFallbackError
	}
	return last.Classify(err)
}

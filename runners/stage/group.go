package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/internal/bounded"
	"github.com/prometheus/client_golang/prometheus"
)

// Group is how a pipeline's stages carry their hidden states over the
// backend's own distributed engine (MLX's ring: send to the next stage,
// recv from the previous one) instead of in the stage link's Step frames.
// The stage link still carries everything else: the Steps' descriptors
// (DTypeGroup, no hidden states), the picked tokens back to stage 0,
// Open, Truncate, Drop, Fill, errors and keepalives.
//
// The stages agree on it through their Hellos (flag GROUP): every stage
// offers it when it has a Group, and the stages join the group, once both
// of a stage's links are up, only when both neighbours offered it too.
// A stage sees every other stage's Hello only in a pipeline of at most
// three stages, so a longer one keeps the TCP link (and says why) unless
// its Group is Whole: a hostfile that lists every stage, which the
// supervisor writes only where every stage is one MLX runner.
//
// A process joins such a group once for its life (mlx-c cannot leave one):
// once joined, a lost link, a carried transfer gone wrong or a join that
// does not finish ends the group (OnLost), and the runner must exit so that
// every stage restarts together.
type Group struct {
	// Transport labels the bytes it carries (exo_stage_link_bytes_total's
	// transport label, e.g. "mlx").
	Transport string
	// Join joins this stage's rank (blocking until its neighbours have)
	// and returns the carrier: Recv from the previous stage, Send to the
	// next one.
	Join func() (engine.Carrier, error)
	// JoinTimeout bounds Join (default 2 min): a neighbour that offered
	// the group and died before joining would leave it waiting for ever.
	JoinTimeout time.Duration
	// OnLost is told, once, why a joined group (or a join) failed; the
	// stage's requests in flight have failed by then. Required: the
	// process cannot join the group again (a runner exits).
	OnLost func(error)
	// Whole says every stage offers the group (its plan was made for all
	// of them: the supervisor's MLX_HOSTFILE lists every stage, and it
	// writes one only where every stage runs MLX alone), so a pipeline of
	// more than 3 stages may join it although a stage sees only its
	// neighbours' Hellos. The Hellos still decide: a neighbour that does
	// not offer keeps this stage on the link.
	Whole bool
}

// maxGroupStages is the longest pipeline whose stages all see each
// other's Hellos (each stage sees its two neighbours').
const maxGroupStages = 3

// ExitGroupLost is the exit status of a stage runner whose group was lost
// (it exits so that every stage restarts: a process cannot join MLX's
// group again).
const ExitGroupLost = 3

// ErrGroupLost is wrapped by the errors of a stage whose group was lost.
var ErrGroupLost = errors.New("stage: the stages' group was lost (every stage restarts)")

// carry is a stage's side of the group: whether it still offers one, and
// the carrier once joined.
type carry struct {
	g      *Group
	stages int
	log    *slog.Logger
	met    *stageMetrics
	offer  atomic.Bool
	tr     *TransportReport // where the hidden states go, and why

	mu      sync.Mutex
	decided bool
	c       engine.Carrier
	sent    prometheus.Counter
	recv    prometheus.Counter

	lostOnce sync.Once
}

// OfferGroup is how a stage with g (nil: none) among stages starts:
// whether it offers the group (g's defaults filled in), and its Transport
// until it decides: Offered, or why it does not offer (fallback where g is
// nil, NoGroup without one; LongPipeline). A decode stage (Ring, Node)
// and a prefill pipeline stage (runners/prefill/pipeline) both start so.
func OfferGroup(g *Group, stages int, fallback Transport) (offer bool, t Transport, err error) {
	if g == nil {
		if fallback.Transport == "" {
			fallback = NoGroup()
		}
		return false, fallback, nil
	}
	if g.Join == nil || g.OnLost == nil {
		return false, Transport{}, errors.New("stage: a Group needs Join and OnLost")
	}
	if g.Transport == "" {
		g.Transport = "group"
	}
	if g.JoinTimeout <= 0 {
		g.JoinTimeout = 2 * time.Minute
	}
	if stages > maxGroupStages && !g.Whole {
		return false, LongPipeline(stages), nil
	}
	return true, Offered(), nil
}

// JoinAgreed decides, once both links of a stage that offers g are up,
// where its hidden states go: over g when both neighbours offered it too
// (Hello flag GROUP on in and out: it joins, within g.JoinTimeout), or on
// the stage link for the life of the process (carrier nil, PeerDeclined).
// An error, wrapping ErrGroupLost, is a join that failed or did not
// finish: the group is lost.
func JoinAgreed(ctx context.Context, g *Group, in, out *Link, log *slog.Logger) (engine.Carrier, Transport, error) {
	if !in.Group() || !out.Group() {
		peer := in.Peer.Stage
		if in.Group() {
			peer = out.Peer.Stage
		}
		t := PeerDeclined(peer)
		log.Warn("stage: hidden states stay on the stage link (TCP)", "reason", t.Reason, "detail", t.Detail, "transport", g.Transport)
		return nil, t, nil
	}
	log.Info("stage: joining the stages' group for the hidden states", "transport", g.Transport, "timeout", g.JoinTimeout)
	c, err := bounded.Call(ctx, g.JoinTimeout, g.Join)
	switch {
	case errors.Is(err, bounded.ErrTimeout):
		err = fmt.Errorf("the join did not finish within %v (a neighbour died before joining?)", g.JoinTimeout)
	case err == nil && c == nil:
		err = errors.New("the join returned no carrier")
	}
	if err != nil {
		return nil, Offered(), fmt.Errorf("%w: join: %w", ErrGroupLost, err)
	}
	log.Info("stage: hidden states carried over the group", "transport", g.Transport)
	return c, Transport{Transport: g.Transport}, nil
}

// newCarry is a stage's side of g; without g, fallback is why (its
// Transport "tcp").
func newCarry(g *Group, fallback Transport, stages int, met *stageMetrics, log *slog.Logger) (*carry, error) {
	offer, t, err := OfferGroup(g, stages, fallback)
	if err != nil {
		return nil, err
	}
	if g != nil && !offer {
		log.Warn("stage: hidden states stay on the stage link (TCP)", "reason", t.Reason, "detail", t.Detail, "transport", g.Transport)
	}
	cs := &carry{g: g, stages: stages, log: log, met: met, tr: met.report(t)}
	cs.offer.Store(offer)
	return cs, nil
}

// transport is where the stage's hidden states go (Ring.Transport,
// Node.Transport).
func (cs *carry) transport() Transport { return cs.tr.Get() }

// offered is LinkConfig.Offer.
func (cs *carry) offered() bool { return cs.offer.Load() }

// carrier is the joined group's carrier (nil: the hidden states go in the
// Step frames).
func (cs *carry) carrier() engine.Carrier {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.c
}

// joined says whether the stage has joined its group (a lost link then
// loses the group).
func (cs *carry) joined() bool { return cs.carrier() != nil }

// decide runs when both of a stage's links are up: the first time, it
// joins the group if this stage and both neighbours offered it (Hello
// flag GROUP on both links), or settles on the stage link for the life of
// the process and stops offering. An error is a lost group.
func (cs *carry) decide(ctx context.Context, in, out *Link) (engine.Carrier, error) {
	cs.mu.Lock()
	decided, c := cs.decided, cs.c
	cs.mu.Unlock()
	if decided {
		if c != nil {
			// Unreachable while OnLost ends the process: a joined group
			// never sees a second pair of links.
			return nil, fmt.Errorf("%w: the stage links were made again after the group was joined", ErrGroupLost)
		}
		return nil, nil
	}
	if !cs.offer.Load() {
		cs.settle(nil)
		return nil, nil
	}
	c, t, err := JoinAgreed(ctx, cs.g, in, out, cs.log)
	if err != nil {
		return nil, err
	}
	if c == nil {
		cs.offer.Store(false) // for the life of the process
	}
	cs.tr.Set(t)
	cs.settle(c)
	return c, nil
}

func (cs *carry) settle(c engine.Carrier) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.decided, cs.c = true, c
	if c != nil {
		cs.sent, cs.recv = cs.met.carried(cs.g.Transport)
	}
}

// count adds a carried step's bytes to the transport's counters.
func (cs *carry) count(st engine.CarryStats) {
	cs.mu.Lock()
	sent, recv := cs.sent, cs.recv
	cs.mu.Unlock()
	if sent != nil {
		sent.Add(float64(st.Sent))
		recv.Add(float64(st.Received))
	}
}

// lose reports a lost group once (OnLost).
func (cs *carry) lose(err error) {
	if cs.g == nil {
		return
	}
	if !errors.Is(err, ErrGroupLost) {
		err = fmt.Errorf("%w: %w", ErrGroupLost, err)
	}
	cs.lostOnce.Do(func() {
		cs.log.Error("stage: the stages' group is lost; this runner must restart with every stage", "err", err)
		cs.g.OnLost(err)
	})
}

package stage_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/stage"
)

// switchable is a stage's own condition a test turns on and off.
type switchable struct{ err atomic.Pointer[error] }

func (s *switchable) health() error {
	if e := s.err.Load(); e != nil {
		return *e
	}
	return nil
}

func (s *switchable) fail(err error) { s.err.Store(&err) }
func (s *switchable) heal()          { s.err.Store(nil) }

// TestStageHealthTakesTheRingDown: a stage whose own condition (a tensor
// stage's group) fails takes its links down, so stage 0 is not healthy
// and its requests fail with the reason; while it fails the stage does
// not link again; once it holds again the ring is rebuilt and answers as
// one runner does. The same for stage 0's own condition.
func TestStageHealthTakesTheRingDown(t *testing.T) {
	dir := writeModels(t)["llama"]
	want := generate(t, single(t, dir, 1), requests()[:1], false)
	var h0, h1 switchable
	p := newPipeline(t, dir, []int{1}, pipeOpts{maxBatch: 1, health: []func() error{h0.health, h1.health}})
	for _, c := range []struct {
		name string
		sw   *switchable
	}{{"stage 1", &h1}, {"stage 0", &h0}} {
		c.sw.fail(errors.New("rank 1 lost"))
		testutil.Eventually(t, func() bool { return !p.ring.Healthy() }, 20*time.Second, "the ring down with %s's group broken", c.name)
		// It stays down while the condition fails (no relinking).
		_, err := p.ring.ForwardPick(context.Background(), p.ring.NewCache(), []int32{1, 2})
		if err == nil || !errors.Is(err, stage.ErrDown) {
			t.Fatalf("%s: a step with the ring down: %v, want ErrDown", c.name, err)
		}
		if p.ring.Healthy() {
			t.Fatalf("%s: the ring came back while the group is broken", c.name)
		}
		c.sw.heal()
		testutil.Eventually(t, p.ring.Healthy, 20*time.Second, "the ring back with %s's group whole", c.name)
		if got := generate(t, p.srv, requests()[:1], false); got[0] != want[0] {
			t.Fatalf("%s: after the ring came back %q, one runner %q", c.name, got[0], want[0])
		}
	}
	if err := stage.Health(p.ring.Healthy, h0.health)(); err != nil {
		t.Fatalf("stage.Health with the ring up: %v", err)
	}
	h0.fail(errors.New("rank 1 lost"))
	if err := stage.Health(p.ring.Healthy, h0.health)(); err == nil || !strings.Contains(err.Error(), "tensor group is not whole: rank 1 lost") {
		t.Fatalf("stage.Health with the group broken: %v", err)
	}
}

// layersOnly hides the carried steps of an engine model (as a tensor
// group's Model has none).
type layersOnly struct{ stage.Layers }

// TestGroupNeedsCarriedLayers: a Group (hidden states over the backend's
// own transport) over layers that cannot carry them is refused.
func TestGroupNeedsCarriedLayers(t *testing.T) {
	dir := writeModels(t)["llama"]
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{Layers: engine.LayerRange{Start: 0, End: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	g := &stage.Group{Transport: "x", Join: func() (engine.Carrier, error) { return nil, errors.New("unused") }, OnLost: func(error) {}}
	link := stage.LinkConfig{Stage: 0, Stages: 2, First: 0, End: 1, Layers: m.Info().Layers, Hidden: m.Config().Hidden, Fingerprint: m.Fingerprint()}
	_, err = stage.NewRing(stage.RingConfig{Name: "m", Link: link, Model: layersOnly{m}, Listen: l, Next: "127.0.0.1:1", Group: g})
	if err == nil || !strings.Contains(err.Error(), "keeps them on the stage link") {
		t.Fatalf("a Group over layers that cannot carry: %v", err)
	}
}

package stage_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// chanCarrier stands in for MLX's ring on the cpu backend (whose ops run
// at once): Send reads x and puts it on the next stage's pipe, Recv takes
// the previous stage's next array off its pipe.
type chanCarrier struct {
	b       engine.Backend
	in, out chan []float32
}

func (c *chanCarrier) Send(x engine.Array) engine.Array {
	v, err := c.b.Float32(x)
	if err != nil {
		panic(err)
	}
	c.out <- v
	return x
}

func (c *chanCarrier) Recv(shape []int, dt engine.DType) engine.Array {
	if dt != engine.F32 {
		panic(fmt.Sprintf("chanCarrier: receive of %v", dt))
	}
	select {
	case v := <-c.in:
		return c.b.FromFloat32(v, shape...)
	case <-time.After(time.Minute): // a test's bound: the sender never sent
		panic("chanCarrier: nothing to receive")
	}
}

// linkBytes sums exo_stage_link_bytes_total's series of one transport.
func linkBytes(t *testing.T, reg prometheus.Gatherer, transport, direction string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != "exo_stage_link_bytes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "transport") == transport && label(m, "direction") == direction {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// transports is exo_stage_transport's series: each stage's transport and
// reason (as "transport/reason"), once every stage has decided (none
// "pending"). A stage with other than one series, or one not 1, fails.
func transports(t *testing.T, reg prometheus.Gatherer, stages int) map[string]string {
	t.Helper()
	var got map[string]string
	testutil.Eventually(t, func() bool {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]string{}
		for _, f := range fams {
			if f.GetName() != "exo_stage_transport" {
				continue
			}
			for _, m := range f.GetMetric() {
				s := label(m, "stage")
				if _, dup := got[s]; dup || m.GetGauge().GetValue() != 1 {
					t.Fatalf("exo_stage_transport: stage %s has a second series or a value not 1: %v", s, f.GetMetric())
				}
				got[s] = label(m, "transport") + "/" + label(m, "reason")
			}
		}
		for _, v := range got {
			if v == stage.TransportPending+"/" {
				return false
			}
		}
		return len(got) == stages
	}, time.Minute, "every one of %d stages decides its transport (exo_stage_transport)", stages)
	return got
}

// each is want for every one of n stages (transports' map).
func each(n int, want string) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprint(i)] = want
	}
	return m
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestGroupCarriesHiddenStates: where every stage offers a group, the
// hidden states go over it (the stage link's Steps carry none) and the
// pipeline gives one runner's tokens, alone and four requests at once,
// for a dense and a Gated DeltaNet model over 2 and 3 stages; every byte a
// stage sent over the group is received by the next.
func TestGroupCarriesHiddenStates(t *testing.T) {
	dirs := writeModels(t)
	for _, arch := range []string{"llama", "qwen3_next"} {
		dir := dirs[arch]
		want := generate(t, single(t, dir, 4), requests(), false)
		for _, cuts := range [][]int{{1}, {1, 2}} {
			t.Run(fmt.Sprintf("%s/%d-stages", arch, len(cuts)+1), func(t *testing.T) {
				reg := prometheus.NewRegistry()
				p := newPipeline(t, dir, cuts, pipeOpts{secret: []byte("s3cret"), maxBatch: 4, group: true, metrics: stage.NewMetrics(reg)})
				got := generate(t, p.srv, requests(), false)
				got2 := generate(t, p.srv, requests(), true)
				for i := range want {
					if got[i] != want[i] || got2[i] != want[i] {
						t.Errorf("request %d: over the group %s (alone) %s (4 at once), one runner %s", i, got[i], got2[i], want[i])
					}
				}
				sent, recv := linkBytes(t, reg, "chan", "sent"), linkBytes(t, reg, "chan", "received")
				if sent <= 0 || sent != recv {
					t.Errorf("hidden-state bytes over the group: %v sent, %v received; want equal and > 0", sent, recv)
				}
				// Each Step frame without hidden states is a few dozen
				// bytes a token: the stage link carried far less than the
				// hidden states (D floats a token).
				t.Logf("group %v bytes, stage link %v", sent, linkBytes(t, reg, "tcp", "sent"))
				if tcp := linkBytes(t, reg, "tcp", "sent"); tcp >= sent {
					t.Errorf("the stage link sent %v bytes, the group %v: the hidden states went over TCP too?", tcp, sent)
				}
				if got, want := transports(t, reg, len(cuts)+1), each(len(cuts)+1, "chan/"); !maps.Equal(got, want) {
					t.Errorf("exo_stage_transport: %v, want %v", got, want)
				}
				if tr := p.ring.Transport(); tr != (stage.Transport{Transport: "chan"}) {
					t.Errorf("stage 0's Transport %+v, want the group's", tr)
				}
			})
		}
	}
}

// TestGroupFourStages: four stages join their group only when it is
// Whole (the supervisor's hostfile lists every stage: a stage sees only
// its neighbours' Hellos); without it they stay on the stage link. Both
// give one runner's tokens.
func TestGroupFourStages(t *testing.T) {
	dir := writeModels(t)["gemma3"] // 4 layers
	want := generate(t, single(t, dir, 4), requests(), false)
	for _, whole := range []bool{true, false} {
		t.Run(fmt.Sprintf("whole=%v", whole), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			p := newPipeline(t, dir, []int{1, 2, 3}, pipeOpts{maxBatch: 4, group: true, whole: whole, metrics: stage.NewMetrics(reg)})
			got := generate(t, p.srv, requests(), true)
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("request %d: %s, one runner %s", i, got[i], want[i])
				}
			}
			sent, recv := linkBytes(t, reg, "chan", "sent"), linkBytes(t, reg, "chan", "received")
			if whole && (sent <= 0 || sent != recv) {
				t.Errorf("whole group: %v bytes sent over it, %v received; want equal and > 0", sent, recv)
			}
			if !whole && sent != 0 {
				t.Errorf("4 stages without a whole plan sent %v bytes over the group", sent)
			}
			wantT := each(4, "chan/")
			if !whole {
				wantT = each(4, "tcp/"+stage.ReasonLongPipeline)
			}
			if got := transports(t, reg, 4); !maps.Equal(got, wantT) {
				t.Errorf("exo_stage_transport: %v, want %v", got, wantT)
			}
		})
	}
}

// TestGroupFallsBackToTheLink: a stage without a group (its backend is
// cpu) keeps every stage on the stage link's Steps, and the tokens are one
// runner's.
func TestGroupFallsBackToTheLink(t *testing.T) {
	dir := writeModels(t)["llama"]
	want := generate(t, single(t, dir, 4), requests(), false)
	reg := prometheus.NewRegistry()
	p := newPipeline(t, dir, []int{1}, pipeOpts{maxBatch: 4, group: true, noGroup: 1, metrics: stage.NewMetrics(reg)})
	got := generate(t, p.srv, requests(), false)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: %s, one runner %s", i, got[i], want[i])
		}
	}
	if b := linkBytes(t, reg, "chan", "sent"); b != 0 {
		t.Errorf("%v bytes over the group with a stage that has none", b)
	}
	if b := linkBytes(t, reg, "tcp", "sent"); b <= 0 {
		t.Errorf("nothing on the stage link")
	}
	// Stage 1 was given no group (and no reason); stage 0 offered one and
	// says which neighbour did not.
	wantT := map[string]string{"0": "tcp/" + stage.ReasonPeer, "1": "tcp/" + stage.ReasonNoGroup}
	if got := transports(t, reg, 2); !maps.Equal(got, wantT) {
		t.Errorf("exo_stage_transport: %v, want %v", got, wantT)
	}
	if tr := p.ring.Transport(); tr != stage.PeerDeclined(1) {
		t.Errorf("stage 0's Transport %+v, want %+v", tr, stage.PeerDeclined(1))
	}
}

// TestGroupLostEndsRequests: once the stages joined their group, a stage
// that goes away ends the request in flight with an error naming the ring
// (no hang) and tells every stage's OnLost (a runner exits: the group
// cannot be joined again).
func TestGroupLostEndsRequests(t *testing.T) {
	dir := writeModels(t)["llama"]
	lost := make(chan error, 8)
	p := newPipeline(t, dir, []int{1, 2}, pipeOpts{maxBatch: 1, group: true, lost: lost})
	req := *requests()[0]
	req.MaxTokens = 1 << 20
	em := &killer{at: 5, kill: func() { p.cancels[1](); <-p.done[1] }}
	_, err := p.srv.Generate(context.Background(), &req, em)
	if !errors.Is(err, stage.ErrDown) {
		t.Fatalf("a generation whose stage 1 was stopped: %v, want ErrDown", err)
	}
	// Stage 0 and stage 2 lose their links to stage 1 (stage 1 was
	// stopped by its context: it does not report).
	got := map[bool]int{}
	if !testutil.Until(time.Minute, func() bool {
		select {
		case e := <-lost:
			got[errors.Is(e, stage.ErrGroupLost)]++
		default:
		}
		return got[true] >= 2
	}) {
		t.Fatalf("OnLost calls: %v, want 2 wrapping ErrGroupLost", got)
	}
	if got[false] != 0 {
		t.Errorf("%d OnLost errors without ErrGroupLost", got[false])
	}
	if p.ring.Healthy() {
		t.Error("the ring reports healthy after its group was lost")
	}
}

// TestGroupJoinBound: a stage whose group's join never returns (a
// neighbour that offered the group died before joining) does not wait in
// it for ever: at its JoinTimeout the group is lost (OnLost, wrapping
// ErrGroupLost and naming the bound), and the runner would exit.
func TestGroupJoinBound(t *testing.T) {
	dir := writeModels(t)["llama"]
	lost := make(chan error, 8)
	newPipeline(t, dir, []int{1}, pipeOpts{maxBatch: 1, group: true, lost: lost, hangJoin: 1})
	want := "join: the join did not finish within 1s"
	for {
		select {
		case err := <-lost:
			if errors.Is(err, stage.ErrGroupLost) && strings.Contains(err.Error(), want) {
				return
			}
			t.Logf("another stage's loss first: %v", err)
		case <-time.After(time.Minute): // a test's bound: the fix is what ends it
			t.Fatalf("no stage lost its group at its 1 s JoinTimeout within a minute (want an error saying %q)", want)
		}
	}
}

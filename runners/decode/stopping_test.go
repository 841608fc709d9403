package decode

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// TestStoppingAnswersQueuedRequests: when the runner begins to stop, a
// request still waiting for admission is answered 503 "stopping" at once
// (it has not started: the gateway sends it elsewhere), while the one
// running goes on to its end under the drain.
func TestStoppingAnswersQueuedRequests(t *testing.T) {
	d := openai.NewDrain()
	release := make(chan struct{})
	ts := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(_ Text, o *Options) {
		o.MaxBatch, o.Stopping = 1, d.Begun()
		// The running request is held at its first step until the test
		// releases it, so it is running for as long as the test looks.
		o.NewConstraint = func(req *gen.Request, _ chat.Start) (Constraint, error) {
			if req.Messages[0].Content == "hold" {
				return holdConstraint{release}, nil
			}
			return nil, nil
		}
	})
	hs := httptest.NewUnstartedServer(d.Handler(apiMux(ts.srv)))
	hs.Config.BaseContext = func(net.Listener) context.Context { return d.Context() }
	hs.Start()
	t.Cleanup(hs.Close)

	type answer struct {
		status int
		body   string
		err    error
	}
	send := func(ctx context.Context, body string) chan answer {
		ch := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/v1/chat/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ch <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			ch <- answer{resp.StatusCode, string(b), err}
		}()
		return ch
	}
	running := send(context.Background(), `{"model":"m","messages":[{"role":"user","content":"hold"}],"max_tokens":4,"ignore_eos":true}`)
	testutil.Eventually(t, func() bool { _, r := ts.srv.Load(); return r == 1 }, 30*time.Second, "the long request never ran")
	queued := send(context.Background(), `{"model":"m","messages":[{"role":"user","content":"me next"}],"max_tokens":4}`)
	testutil.Eventually(t, func() bool { w, _ := ts.srv.Load(); return w == 1 }, 30*time.Second, "the second request never queued")

	stopped := make(chan struct{})
	go func() { d.Stop(time.Minute); close(stopped) }()
	a := <-queued
	if a.err != nil || a.status != http.StatusServiceUnavailable {
		t.Fatalf("the queued request: %d %q %v; want 503 stopping", a.status, a.body, a.err)
	}
	var eb openai.ErrorBody
	if err := json.Unmarshal([]byte(a.body), &eb); err != nil || eb.Error.Code == nil || *eb.Error.Code != "stopping" {
		t.Fatalf("the queued request's body %q: want code stopping", a.body)
	}
	if w, r := ts.srv.Load(); w != 0 || r != 1 || d.Active() != 1 {
		t.Fatalf("after the queued request's 503: waiting %d, running %d, in hand %d; want the running one alone, still going", w, r, d.Active())
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned while a request was in hand")
	default:
	}
	close(release)
	if a := <-running; a.err != nil || a.status != http.StatusOK {
		t.Fatalf("the running request: %d %q %v; want it finished under the drain", a.status, a.body, a.err)
	}
	<-stopped
}

// holdConstraint allows every token once release is closed.
type holdConstraint struct{ release chan struct{} }

func (h holdConstraint) Mask([]float32) error { <-h.release; return nil }
func (h holdConstraint) Accept(int32) error   { return nil }
func (h holdConstraint) Done() bool           { return false }

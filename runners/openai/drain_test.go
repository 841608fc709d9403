package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// holdGen starts the answer (when start is set), says it is in hand on
// entered and then waits for release or for its context to end.
type holdGen struct {
	scriptGen
	start   bool
	entered chan struct{}
	release chan struct{}
}

func (g *holdGen) Generate(ctx context.Context, req *gen.Request, em gen.Emitter) (gen.Result, error) {
	if g.start {
		if err := em.Start(3); err != nil {
			return gen.Result{}, err
		}
		if err := em.Text("partial", nil); err != nil {
			return gen.Result{}, err
		}
	}
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return gen.Result{}, fmt.Errorf("decoding: %w", ctx.Err())
	}
	if !g.start {
		if err := em.Start(3); err != nil {
			return gen.Result{}, err
		}
		if err := em.Text("whole", nil); err != nil {
			return gen.Result{}, err
		}
	}
	return gen.Result{PromptTokens: 3, CompletionTokens: 1, FinishReason: "stop"}, nil
}

func drainServer(t *testing.T, g gen.Generator) (*httptest.Server, *Drain) {
	t.Helper()
	d := NewDrain()
	h := &Handler{Gen: g, Served: []string{"tiny"}}
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewUnstartedServer(d.Handler(mux))
	srv.Config.BaseContext = func(net.Listener) context.Context { return d.Context() }
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, d
}

type answer struct {
	status     int
	retryAfter string
	body       string
	err        error
}

func postAsync(url, body string) chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), err: err}
	}()
	return ch
}

func stoppingCode(t *testing.T, body string) {
	t.Helper()
	var eb ErrorBody
	if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Error.Code == nil || *eb.Error.Code != "stopping" {
		t.Fatalf("want the stopping error, got %q (%v)", body, err)
	}
}

// TestDrainFinishesInHand: a request in hand when the runner begins to
// stop is answered in full; one that arrives after is refused with a 503
// (Retry-After, code "stopping"), never served and never a 500.
func TestDrainFinishesInHand(t *testing.T) {
	g := &holdGen{entered: make(chan struct{}), release: make(chan struct{})}
	srv, d := drainServer(t, g)
	url := srv.URL + "/v1/chat/completions"
	const body = `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`
	first := postAsync(url, body)
	<-g.entered
	stopped := make(chan struct{})
	go func() { d.Stop(time.Minute); close(stopped) }()
	testutil.Eventually(t, d.Stopping, 10*time.Second, "Stop has not begun")
	select {
	case <-stopped:
		t.Fatal("Stop returned with a request in hand")
	default:
	}
	late := <-postAsync(url, body)
	if late.err != nil || late.status != http.StatusServiceUnavailable || late.retryAfter == "" {
		t.Fatalf("a request after Stop: %+v; want 503 with Retry-After", late)
	}
	stoppingCode(t, late.body)
	if d.Active() != 1 {
		t.Fatalf("%d requests in hand, want the first one only", d.Active())
	}
	close(g.release)
	a := <-first
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, "whole") {
		t.Fatalf("the request in hand: %+v; want its whole answer", a)
	}
	<-stopped
	if !Stopped(d.Context()) {
		t.Fatal("after Stop the request context is not ended with ErrStopping")
	}
}

// TestDrainCutsAfterGrace: a request still in hand when the grace period
// ends is cut and answered as a restart, not a failure: a 503 "stopping"
// when nothing was sent yet (the gateway retries it elsewhere), the
// stream's error event when the answer had started.
func TestDrainCutsAfterGrace(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		stream     bool
	}{
		{"chat", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, false},
		{"chat-stream", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}`, true},
		{"completion", `{"model":"tiny","prompt":"hi"}`, false},
		{"completion-stream", `{"model":"tiny","prompt":"hi","stream":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &holdGen{start: tc.stream, entered: make(chan struct{}, 1), release: make(chan struct{})}
			srv, d := drainServer(t, g)
			path := "/v1/chat/completions"
			if !strings.Contains(tc.body, "messages") {
				path = "/v1/completions"
			}
			ch := postAsync(srv.URL+path, tc.body)
			<-g.entered
			d.Stop(time.Millisecond) // the generator only ends when cut
			a := <-ch
			if a.err != nil {
				t.Fatal(a.err)
			}
			if !tc.stream {
				if a.status != http.StatusServiceUnavailable || a.retryAfter == "" {
					t.Fatalf("cut before the answer started: %d (Retry-After %q) %s; want 503 with Retry-After", a.status, a.retryAfter, a.body)
				}
				stoppingCode(t, a.body)
				return
			}
			if a.status != http.StatusOK {
				t.Fatalf("stream status %d", a.status)
			}
			var last string
			for _, line := range strings.Split(a.body, "\n") {
				if data, ok := strings.CutPrefix(line, "data: "); ok {
					last = data
				}
			}
			if !strings.Contains(a.body, "partial") || strings.Contains(a.body, "[DONE]") {
				t.Fatalf("stream cut mid-answer: %q; want the partial text and no [DONE]", a.body)
			}
			stoppingCode(t, last)
		})
	}
}

// TestDrainPassesReads: GET requests (/v1/models, a metrics scrape) are
// answered while stopping; they are not work in hand.
func TestDrainPassesReads(t *testing.T) {
	srv, d := drainServer(t, &scriptGen{})
	d.Stop(time.Millisecond)
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models while stopping: %d", resp.StatusCode)
	}
}

// TestDrainGraceFor: a runner drains for the supervisor's grace less a
// margin to answer and exit before SIGKILL; unknown (0) is the default.
func TestDrainGraceFor(t *testing.T) {
	for _, tt := range []struct{ stop, want time.Duration }{
		{0, DefaultDrainGrace},
		{10 * time.Second, 7 * time.Second},
		{60 * time.Second, 57 * time.Second},
		{4 * time.Second, 2 * time.Second},
		{time.Second, 500 * time.Millisecond},
	} {
		if got := DrainGraceFor(tt.stop); got != tt.want {
			t.Errorf("DrainGraceFor(%v) = %v, want %v", tt.stop, got, tt.want)
		}
	}
}

package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/sse"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// stopping answers as a runner that has begun to shut down.
func stopping(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprint(w, `{"error":{"message":"the runner is shutting down","type":"server_error","param":null,"code":"stopping"}}`)
}

// breakAfter writes head (raw bytes after the status line and headers of
// a chunked event stream) and then drops the connection, as a runner that
// is killed does.
func breakAfter(t *testing.T, chunks ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, c := range chunks {
			fmt.Fprintf(bw, "%x\r\n%s\r\n", len(c), c)
		}
		bw.Flush()
	}
}

// TestRetriesWhatHadNotStarted: a request whose runner refuses it (503:
// stopping) or whose answer breaks before its first body byte is served by
// the model's other runner; the client sees only that runner's answer.
func TestRetriesWhatHadNotStarted(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(t *testing.T) http.HandlerFunc
	}{
		{"503 stopping", func(*testing.T) http.HandlerFunc { return stopping }},
		{"broke before the first byte", func(t *testing.T) http.HandlerFunc { return breakAfter(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, srv, a, _ := cluster(t, "a")
			a.chat = tc.fail(t)
			resp, v := post(t, srv.URL, `{"model":"m","messages":[]}`)
			if resp.StatusCode != 200 || v["served_by"] != "b" {
				t.Fatalf("status %d body %v: want b's answer after a failed", resp.StatusCode, v)
			}
			if h := g.Health()[a.srv.Listener.Addr().String()]; h.OK {
				t.Errorf("a is still in rotation after failing a request: %+v", h)
			}
		})
	}
}

// TestAllRunnersRefuse: when every runner of the model refuses, the
// client gets the gateway's 503 with Retry-After and each runner's reason.
func TestAllRunnersRefuse(t *testing.T) {
	_, srv, a, b := cluster(t, "a")
	a.chat, b.chat = stopping, stopping
	resp, v := post(t, srv.URL, `{"model":"m"}`)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q: want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	e := v["error"].(map[string]any)
	if msg := e["message"].(string); e["code"] != "no_healthy_runner" || strings.Count(msg, "answered 503: the runner is shutting down") != 2 {
		t.Errorf("error = %v", e)
	}
}

// TestStreamThatBreaksEndsWithErrorEvent: a stream whose runner goes away
// mid-answer is not retried (the client has part of it); it ends with one
// well-formed error event in the client's API's form — the torn event the
// runner was writing is dropped — and nothing after it.
func TestStreamThatBreaksEndsWithErrorEvent(t *testing.T) {
	for _, tc := range []struct {
		path  string
		event string // the error event's name ("": a bare data event)
		check func(v map[string]any) bool
	}{
		{"/v1/chat/completions", "", func(v map[string]any) bool {
			e, ok := v["error"].(map[string]any)
			return ok && e["code"] == "runner_lost" && e["type"] == "server_error"
		}},
		{"/v1/messages", "error", func(v map[string]any) bool {
			e, ok := v["error"].(map[string]any)
			return v["type"] == "error" && ok && e["type"] == "api_error" && e["message"] != ""
		}},
		{"/v1/responses", "error", func(v map[string]any) bool {
			e, ok := v["error"].(map[string]any)
			return v["type"] == "error" && v["code"] == "runner_lost" && ok && e["message"] != ""
		}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			_, srv, a, b := cluster(t, "a")
			var bServed atomic.Bool
			b.chat = func(w http.ResponseWriter, r *http.Request) { bServed.Store(true) }
			a.chat = breakAfter(t, "data: {\"n\":1}\n\n", "event: x\ndata: {\"n\":2}\n\n", "data: {\"torn")
			resp, err := http.Post(srv.URL+tc.path, "application/json", strings.NewReader(`{"model":"m","stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("reading the stream: %v (want it ended cleanly by the gateway)", err)
			}
			events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
			if resp.StatusCode != 200 || len(events) != 3 || events[0] != `data: {"n":1}` || events[1] != "event: x\ndata: {\"n\":2}" {
				t.Fatalf("status %d, stream %q: want the two whole events, then the error", resp.StatusCode, body)
			}
			last, err := sse.NewReader(strings.NewReader(events[2] + "\n\n")).Next()
			var v map[string]any
			if err != nil || last.Type != tc.event || json.Unmarshal([]byte(last.Data), &v) != nil || !tc.check(v) {
				t.Fatalf("last event %q: want the %s error event", events[2], tc.path)
			}
			if bServed.Load() {
				t.Error("a stream that had started was sent to another runner")
			}
		})
	}
}

// TestGroupFailureGoesToTheNextGroup: two pipeline groups (decode.groups)
// whose stage 0s are a and b: a group that fails a request with a 5xx
// before answering (its stage link is down) is taken out of rotation and
// the request is served by the other group; a whole copy's 500 is still
// the client's answer.
func TestGroupFailureGoesToTheNextGroup(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	a := newFake(t, "a", fmt.Sprintf("127.0.0.1:%d", port))
	b := newFake(t, "b", fmt.Sprintf("127.0.0.2:%d", port))
	c, err := config.Parse("t.toml", []byte(fmt.Sprintf(`[cluster]
insecure = true
[hosts.a]
address = "127.0.0.1"
backend = "cpu"
[hosts.b]
address = "127.0.0.2"
backend = "cpu"
[hosts.c]
address = "127.0.0.3"
backend = "cpu"
[hosts.d]
address = "127.0.0.4"
backend = "cpu"
[[models]]
name = "m"
source = "s"
decode = { groups = [["a", "c"], ["b", "d"]], shard = "pipeline", layers = [1, 1], port = %d }
`, port)))
	if err != nil {
		t.Fatal(err)
	}
	g := New(Options{HealthEvery: time.Hour})
	g.SetConfig(c, "a")
	g.pollAll(context.Background())
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	ringDown := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"message":"local prefill: stage link: ring down: stage link with stage 1: read: EOF","type":"server_error","param":null,"code":null}}`)
	}
	a.chat = ringDown
	resp, v := post(t, srv.URL, `{"model":"m","messages":[]}`)
	if resp.StatusCode != 200 || v["served_by"] != "b" || resp.Header.Get("X-Exo-Runner") != "b/m-decode-group1-stage0" {
		t.Fatalf("status %d body %v runner %q: want group 1's answer", resp.StatusCode, v, resp.Header.Get("X-Exo-Runner"))
	}
	if h := g.Health()[a.srv.Listener.Addr().String()]; h.OK || !strings.Contains(h.Status, "ring down") {
		t.Errorf("group 0 still in rotation: %+v", h)
	}
	// Both groups down: a 503 naming each, not a 500.
	b.chat = ringDown
	g.pollAll(context.Background())
	resp, v = post(t, srv.URL, `{"model":"m","messages":[]}`)
	if e, _ := v["error"].(map[string]any); resp.StatusCode != 503 || e == nil || strings.Count(e["message"].(string), "answered 500") != 2 {
		t.Errorf("both groups failing: %d %v, want 503 naming both", resp.StatusCode, v)
	}
	// A whole copy's 500 is its answer.
	_, srv2, a2, _ := cluster(t, "a")
	a2.chat = ringDown
	if resp, _ := post(t, srv2.URL, `{"model":"m","messages":[]}`); resp.StatusCode != 500 {
		t.Errorf("a replica's 500: got %d", resp.StatusCode)
	}
}

package runner

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/stage"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

func TestLoadGate(t *testing.T) {
	g := &loadGate{role: "decode", name: "m"}
	g.setProgress(0.25)
	get := func(path string) (int, map[string]any) {
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		var body map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		return rec.Code, body
	}
	code, body := get("/health")
	if code != 503 || body["status"] != "loading" || body["progress"] != 0.25 {
		t.Fatalf("loading health: %d %v", code, body)
	}
	if code, body := get("/v1/models"); code != 503 || body["error"] == nil {
		t.Fatalf("API while loading: %d %v", code, body)
	}
	if body["phase"] != nil {
		t.Fatalf("phase before any bytes: %v", body)
	}
	g.setBytes("download", 1<<20, 4<<20)
	if _, body := get("/health"); body["phase"] != "download" || body["done_bytes"] != float64(1<<20) || body["total_bytes"] != float64(4<<20) {
		t.Fatalf("downloading health: %v", body)
	}
	g.setBytes("load", 5, 10)
	if _, body := get("/health"); body["phase"] != "load" || body["done_bytes"] != 5.0 || body["total_bytes"] != 10.0 {
		t.Fatalf("loading health: %v", body)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"ok":true}`)) })
	var h http.Handler = mux
	g.load = func() (int, int) { return 3, 1 }
	g.ready.Store(&h)
	code, body = get("/health")
	if code != 200 || body["status"] != "ok" || body["role"] != "decode" || body["model"] != "m" || body["waiting"] != 3.0 || body["running"] != 1.0 {
		t.Fatalf("ready health: %d %v", code, body)
	}
	if code, body := get("/v1/models"); code != 200 || body["ok"] != true {
		t.Fatalf("API when ready: %d %v", code, body)
	}
	// Stopping: out of rotation at once, whatever the load.
	g.drain = openai.NewDrain()
	g.drain.Stop(0)
	if code, body = get("/health"); code != 503 || body["status"] != "stopping" {
		t.Fatalf("stopping health: %d %v", code, body)
	}
}

// TestLoadGateStageTransport: a pipeline stage's /health carries its
// stage.Transport ("stage_transport") when ready and when degraded (its
// links down), and a runner that is no stage has none; a tensor rank's
// carries its tensor.Sums ("tensor_group").
func TestLoadGateStageTransport(t *testing.T) {
	var h http.Handler = http.NewServeMux()
	g := &loadGate{role: "decode", name: "m", load: func() (int, int) { return 0, 0 }}
	g.ready.Store(&h)
	get := func() (int, map[string]any) {
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, httptest.NewRequest("GET", "/health", nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		return rec.Code, body
	}
	if _, body := get(); body["stage_transport"] != nil {
		t.Fatalf("not a stage: %v", body)
	}
	tr := stage.PeerDeclined(1)
	g.transport = func() any { return tr }
	want := map[string]any{"transport": "tcp", "reason": stage.ReasonPeer, "detail": tr.Detail}
	if code, body := get(); code != 200 || !reflect.DeepEqual(body["stage_transport"], want) {
		t.Fatalf("ready stage: %d %v, want stage_transport %v", code, body, want)
	}
	g.tensor = func() any { return tensor.Sums{Group: "ring", Reason: tensor.ReasonNoJACCL, Detail: "no JACCL"} }
	if _, body := get(); !reflect.DeepEqual(body["tensor_group"], map[string]any{"group": "ring", "reason": "jaccl_unavailable", "detail": "no JACCL"}) {
		t.Fatalf("tensor rank: %v", body)
	}
	g.health = func() error { return errors.New("stage link down") }
	tr = stage.Transport{Transport: "mlx"}
	if code, body := get(); code != 503 || body["status"] != "degraded" || !reflect.DeepEqual(body["stage_transport"], map[string]any{"transport": "mlx"}) {
		t.Fatalf("degraded stage: %d %v", code, body)
	}
}

// TestRunnerHeaderBound: a runner's HTTP server (serveHTTP, as both roles
// serve) answers a request whose headers pass openai.MaxHeaderBytes with
// 431 before the handler runs, and serves one with large but bounded
// headers; 1 MB of headers (which Go's 1 MiB default let through) is 431.
func TestRunnerHeaderBound(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1); w.WriteHeader(204) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveHTTP(ctx, l, h, openai.NewDrain(), openai.DefaultDrainGrace, 10*time.Second, slog.New(slog.DiscardHandler))
	}()
	defer func() { cancel(); <-done }()
	for _, tc := range []struct {
		name  string
		bytes int
		want  int
	}{
		{"32 KiB", 32 << 10, 204},
		{"just under the bound", openai.MaxHeaderBytes - 1024, 204},
		{"past the bound and its slack", openai.MaxHeaderBytes + 8<<10, 431},
		{"1 MB", 1 << 20, 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := served.Load()
			req, _ := http.NewRequest("GET", "http://"+l.Addr().String()+"/v1/models", nil)
			req.Header.Set("X-Big", strings.Repeat("a", tc.bytes))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d bytes of header: %s, want %d", tc.bytes, resp.Status, tc.want)
			}
			if ran := served.Load() != before; ran != (tc.want == 204) {
				t.Fatalf("handler ran: %v with %s", ran, resp.Status)
			}
		})
	}
}

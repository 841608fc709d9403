package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/openai"
)

func TestRunnerFlags(t *testing.T) {
	bad := [][]string{
		nil,
		{"sideways"},
		{"decode", "--served-name", "m", "--listen", ":0"},
		{"decode", "--model", "x", "--listen", ":0"},
		{"decode", "--model", "x", "--served-name", "m"},
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0"}, // no --metrics
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "extra"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--remote-prefill-route", "fastest"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--kv-wire-dtype", "fp4"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--kv-streams", "0"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--kv-streams", "17"},
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--kv-streams", "4"},      // asked by decode runners
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--kv-wire-dtype", "fp8"}, // asked by decode runners
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--test-slow-prefill-tokens-per-sec", "-1"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill", "a:1,b:2", "--prefill-health", "a:9"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill-health", "a:9"},
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--test-slow-prefill-tokens-per-sec", "NaN"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative", "draft"},                         // no --draft
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--draft", "y"},                                   // --draft without mode draft
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative", "prompt-lookup", "--draft", "y"}, // likewise
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative", "ngram"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative-tokens", "65"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative-tokens", "-1"},
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--speculative", "prompt-lookup"},                            // decode only
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--layers", "0:2", "--stage", "0/2", "--stage-listen", ":5"}, // no --stage-next
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--layers", "2:4"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill", "a:1@0:2,b:1"},                                                                            // mixed
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill", "a:1@0:2,b:1@1:3"},                                                                        // overlap                                                                 // no --stage
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--layers", "1:2", "--stage", "0/2", "--stage-listen", ":5", "--stage-next", ":6"}, // stage 0 from 1
	}
	for _, args := range bad {
		_, err := parseRunnerFlags(args)
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	f, err := parseRunnerFlags(strings.Fields("decode --model builtin:smollm2 --served-name s --listen 127.0.0.1:9 --prefill a:1,b:2 --remote-prefill-min-tokens 100 --max-queue 5 --backend cpu"))
	if err != nil || f.prefill != "a:1,b:2" || f.minRemote != 100 || f.maxQueue != 5 || f.backend != "cpu" {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("prefill --model x --served-name s --listen :1 --metrics :2 --layers 2:4 --stage 1/2 --stage-listen :5 --stage-next :6"))
	if err != nil || f.stage != 1 || f.stages != 2 || f.layers.Start != 2 || f.layers.End != 4 || f.stageListen != ":5" || f.stageNext != ":6" {
		t.Fatalf("prefill stage flags: %+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --remote-prefill-route cost"))
	if err != nil || f.route != "cost" || f.kvWireDType != "native" {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --prefill a:1,b:2 --prefill-health a:9,b:9"))
	if err != nil || !slices.Equal(splitList(f.prefillHealth), []string{"a:9", "b:9"}) {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --kv-wire-dtype fp8"))
	if err != nil || f.kvWireDType != "fp8" || f.kvStreams != 1 {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --kv-streams 4"))
	if err != nil || f.kvStreams != 4 {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --speculative draft --draft org/small"))
	if err != nil || f.speculative != "draft" || f.draft != "org/small" {
		t.Fatalf("draft flags: %+v, %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --speculative prompt-lookup --speculative-tokens 6"))
	if err != nil || f.speculative != "prompt-lookup" || f.specTokens != 6 {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9"))
	if err != nil || f.speculative != "off" {
		t.Fatalf("speculation by default: %+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("prefill --model x --served-name s --listen 127.0.0.1:9 --metrics 127.0.0.1:10 --test-slow-prefill-tokens-per-sec 500"))
	if err != nil || f.testPrefillRate != 500 {
		t.Fatalf("%+v %v", f, err)
	}
	if strings.Contains(runnerUsage, "test-slow") {
		t.Fatal("the test-only prefill cap is in the usage text")
	}
	f, err = parseRunnerFlags(strings.Fields("prefill --model m.gguf --served-name s --listen 127.0.0.1:9 --metrics 127.0.0.1:10 --secret-file /s"))
	if err != nil || f.metricsAddr != "127.0.0.1:10" || f.secretFile != "/s" || f.minRemote != 0 {
		t.Fatalf("%+v %v", f, err)
	}
}

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
	go func() { done <- serveHTTP(ctx, l, h, openai.NewDrain(), 10*time.Second, slog.New(slog.DiscardHandler)) }()
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

// TestRunnerStageFlags: contract C1's flags are taken together, and the
// combinations a pipeline stage cannot honour are refused naming the flag.
func TestRunnerStageFlags(t *testing.T) {
	base := "decode --model x --served-name m --listen :0 "
	st := "--layers 0:4 --stage 0/2 --stage-listen 127.0.0.1:1 --stage-next 127.0.0.1:2"
	for _, c := range []struct{ args, names string }{
		{"--layers 0:4", "--layers"},
		{"--stage-listen :1", "--stage-listen"},
		{"--stage-next :1", "--stage-next"},
		{"--stage 0/2 --stage-listen :1 --stage-next :2", "--layers"},
		{"--stage 0/2 --layers 0:4 --stage-next :2", "--stage-listen"},
		{"--stage 0/2 --layers 0:4 --stage-listen :1", "--stage-next"},
		{"--layers 2:4 --stage 0/2 --stage-listen :1 --stage-next :2", "--layers"},
		{st + " --test-slow-prefill-tokens-per-sec 5", "--test-slow-prefill-tokens-per-sec"},
		{"--layers 4:2 --stage 1/2 --stage-listen :1 --stage-next :2", "layers"},
		{"--layers 0:4 --stage 2/2 --stage-listen :1 --stage-next :2", "stage"},
		{"--layers 0:4 --stage 0/1 --stage-listen :1 --stage-next :2", "stage"},
		{"--layers 0:4 --stage x --stage-listen :1 --stage-next :2", "stage"},
	} {
		_, err := parseRunnerFlags(strings.Fields(base + c.args))
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), c.names) {
			t.Errorf("%q: %v, want a usage error naming %s", c.args, err, c.names)
		}
	}
	f, err := parseRunnerFlags(strings.Fields(base + "--layers 4:8 --stage 1/3 --stage-listen 127.0.0.1:1 --stage-next 127.0.0.1:2"))
	if err != nil || f.layers.Start != 4 || f.layers.End != 8 || f.stage != 1 || f.stages != 3 || f.stageListen != "127.0.0.1:1" || f.stageNext != "127.0.0.1:2" {
		t.Fatalf("%+v %v", f, err)
	}
}

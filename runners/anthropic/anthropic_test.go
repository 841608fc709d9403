package anthropic

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/openai"
)

var update = flag.Bool("update", false, "rewrite golden files")

// scriptGen replays fixed text pieces (the model is exercised by the decode
// package's tests over the same handler).
type scriptGen struct {
	pieces []string
	res    openai.Result
	got    *openai.GenRequest
}

func (g *scriptGen) Generate(ctx context.Context, req *openai.GenRequest, em openai.Emitter) (openai.Result, error) {
	g.got = req
	if err := em.Start(g.res.PromptTokens); err != nil {
		return openai.Result{}, err
	}
	for _, p := range g.pieces {
		if err := em.Text(p, nil); err != nil {
			return openai.Result{}, err
		}
	}
	return g.res, nil
}

func (g *scriptGen) Tokenize(context.Context, *openai.GenRequest) ([]int32, int, error) {
	return nil, 0, nil
}
func (g *scriptGen) Detokenize(context.Context, []int32) (string, error) { return "", nil }

func serve(t *testing.T, g *scriptGen) string {
	h := &Handler{Gen: g, Served: []string{"tiny"}, NewID: func(p string) string { return p + "test" }}
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(body))
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if string(want) != got {
		t.Errorf("%s:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestMessagesGolden(t *testing.T) {
	res := openai.Result{PromptTokens: 12, CachedTokens: 4, CompletionTokens: 3, FinishReason: "stop", StopSequence: "END"}
	for _, c := range []struct{ name, body string }{
		{"message", `{"model":"tiny","max_tokens":50,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`},
		{"message_stream", `{"model":"tiny","max_tokens":50,"stream":true,"stop_sequences":["END"],"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &scriptGen{pieces: []string{"Hel", "lo", "!"}, res: res}
			code, body := post(t, serve(t, g), c.body)
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			golden(t, c.name, body)
		})
	}
}

func TestConversion(t *testing.T) {
	g := &scriptGen{res: openai.Result{FinishReason: "length"}}
	code, body := post(t, serve(t, g), `{"model":"tiny","max_tokens":7,"temperature":0.5,"top_k":3,"metadata":{"user_id":"u"},
		"system":[{"type":"text","text":"Be "},{"type":"text","text":"brief."}],
		"messages":[{"role":"user","content":"Name a colour."},{"role":"assistant","content":"The colour is"}]}`)
	if code != 200 || !strings.Contains(body, `"stop_reason":"max_tokens"`) {
		t.Fatalf("%d %s", code, body)
	}
	r := g.got
	if len(r.Messages) != 3 || r.Messages[0].Role != "system" || r.Messages[0].Content != "Be brief." || !r.ContinueFinal || r.AddGenerationPrompt ||
		r.MaxTokens != 7 || r.Sampling.Temperature != 0.5 || r.Sampling.TopK != 3 || r.Sampling.SeedSet {
		t.Fatalf("%+v", r)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		name, body string
		code       int
		typ, has   string
	}{
		{"no max_tokens", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens"},
		{"unknown model", `{"model":"claude-9","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error", "claude-9"},
		{"unknown field", `{"model":"tiny","max_tokens":5,"thinking":{"type":"enabled"},"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "thinking"},
		{"tools", `{"model":"tiny","max_tokens":5,"tools":[{"name":"f","input_schema":{}}],"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "tools"},
		{"tool_use block", `{"model":"tiny","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`, 400, "invalid_request_error", "messages[0].content[0].type"},
		{"temperature over 1", `{"model":"tiny","max_tokens":5,"temperature":1.5,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "temperature"},
		{"system role in messages", `{"model":"tiny","max_tokens":5,"messages":[{"role":"system","content":"hi"}]}`, 400, "invalid_request_error", "messages[0].role"},
		{"empty stop sequence", `{"model":"tiny","max_tokens":5,"stop_sequences":[""],"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "stop_sequences"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := &scriptGen{}
			code, body := post(t, serve(t, g), c.body)
			var eb ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil || code != c.code || eb.Type != "error" || eb.Error.Type != c.typ || !strings.Contains(eb.Error.Message, c.has) {
				t.Fatalf("%d %s", code, body)
			}
			if g.got != nil {
				t.Fatal("reached the generator")
			}
		})
	}
}

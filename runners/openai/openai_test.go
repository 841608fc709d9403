package openai

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite golden files")

// scriptGen is a gen.Generator that replays a fixed script of text pieces; it
// stands in for the model so the HTTP layer can be tested on its own (the
// real model is exercised by the e2e tests in runners/e2e).
type scriptGen struct {
	pieces   []string
	calls    []scriptCall // reported after pieces, through gen.ToolCallEmitter
	after    []string     // text reported after the calls
	finish   string
	failPre  error // returned before Start
	failPost error // returned after the pieces
	got      *gen.Request
}

func (g *scriptGen) Generate(ctx context.Context, req *gen.Request, em gen.Emitter) (gen.Result, error) {
	g.got = req
	if g.failPre != nil {
		return gen.Result{}, g.failPre
	}
	if err := em.Start(7); err != nil {
		return gen.Result{}, err
	}
	for _, p := range g.pieces {
		if err := em.Text(p, nil); err != nil {
			return gen.Result{}, err
		}
	}
	for i, c := range g.calls {
		te := em.(gen.ToolCallEmitter)
		if err := te.ToolCall(i, fmt.Sprintf("call_%d", i), c.name, ""); err != nil {
			return gen.Result{}, err
		}
		for _, a := range c.args {
			if err := te.ToolCall(i, "", "", a); err != nil {
				return gen.Result{}, err
			}
		}
	}
	for _, p := range g.after {
		if err := em.Text(p, nil); err != nil {
			return gen.Result{}, err
		}
	}
	if g.failPost != nil {
		return gen.Result{}, g.failPost
	}
	return gen.Result{PromptTokens: 7, CachedTokens: 3, CompletionTokens: len(g.pieces), FinishReason: g.finish}, nil
}

// scriptCall is one tool call a scriptGen reports, its arguments in pieces.
type scriptCall struct {
	name string
	args []string
}

func (g *scriptGen) Detokenize(ctx context.Context, ids []int32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		if id >= 1000 {
			return "", Errorf("tokens", "tokens: %d is outside the vocabulary", id)
		}
		fmt.Fprintf(&b, "<%d>", id)
	}
	return b.String(), nil
}

func (g *scriptGen) Tokenize(ctx context.Context, req *gen.Request) ([]int32, int, error) {
	n := len(req.Prompt)
	for _, m := range req.Messages {
		n += len(m.Content)
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)
	}
	return out, 2048, nil
}

func newTestServer(t *testing.T, g gen.Generator) (*httptest.Server, *[]int) {
	t.Helper()
	return newTestServerWith(t, g, false)
}

// newTestServerWith is newTestServer with Handler.AcceptTools set to tools.
func newTestServerWith(t *testing.T, g gen.Generator, tools bool) (*httptest.Server, *[]int) {
	t.Helper()
	var codes []int
	h := &Handler{Gen: g, Served: []string{"tiny"}, AcceptTools: tools,
		Now:      func() time.Time { return time.Unix(1700000000, 0) },
		NewID:    func(p string) string { return p + "test" },
		OnResult: func(_ string, code int) { codes = append(codes, code) },
	}
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &codes
}

func post(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	testenv.Golden(t, name, got, *update)
}

func TestSSEGolden(t *testing.T) {
	cases := []struct {
		name, path, body string
		gen              *scriptGen
		status           int
	}{
		{"chat_stream", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			&scriptGen{pieces: []string{"Hel", "lo", " wörld"}, finish: "stop"}, 200},
		{"chat_stream_no_usage", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":false}}`,
			&scriptGen{pieces: []string{"a", "b"}, finish: "length"}, 200},
		{"completion_stream", "/v1/completions", `{"model":"tiny","prompt":[1,2,3],"stream":true,"max_tokens":2}`,
			&scriptGen{pieces: []string{"x", "y"}, finish: "length"}, 200},
		{"chat_stream_queue_full", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			&scriptGen{failPre: ErrQueueFull}, 429},
		{"chat_stream_fail_midway", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			&scriptGen{pieces: []string{"par"}, failPost: errors.New("engine exploded")}, 200},
		{"chat_nonstream", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			&scriptGen{pieces: []string{"Hel", "lo"}, finish: "stop"}, 200},
		{"completion_nonstream", "/v1/completions", `{"model":"tiny","prompt":"once upon"}`,
			&scriptGen{pieces: []string{" a", " time"}, finish: "stop"}, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, _ := newTestServer(t, c.gen)
			resp, body := post(t, srv.URL+c.path, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			ct := resp.Header.Get("Content-Type")
			transcript := fmt.Sprintf("status: %d\ncontent-type: %s\n\n%s", resp.StatusCode, ct, body)
			golden(t, c.name, transcript)
			if c.status == 200 && strings.Contains(c.body, `"stream":true`) {
				checkSSEShape(t, body, c.gen.failPost == nil)
			}
		})
	}
}

// checkSSEShape asserts the framing independently of the golden bytes:
// every event is "data: <json>\n\n", and a successful stream ends in [DONE].
func checkSSEShape(t *testing.T, body string, wantDone bool) {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", body)
	}
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	for i, ev := range events {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("event %d lacks the data: prefix: %q", i, ev)
		}
		if data == "[DONE]" {
			if i != len(events)-1 {
				t.Fatalf("[DONE] is not last")
			}
			continue
		}
		if !json.Valid([]byte(data)) {
			t.Fatalf("event %d is not JSON: %q", i, data)
		}
	}
	if got := events[len(events)-1] == "data: [DONE]"; got != wantDone {
		t.Fatalf("ends with [DONE] = %v, want %v", got, wantDone)
	}
}

func TestValidationErrors(t *testing.T) {
	cases := []struct {
		name, path, body string
		status           int
		param, contains  string
	}{
		{"malformed json", "/v1/chat/completions", `{"model":"tiny","messages":[`, 400, "", "invalid JSON"},
		{"empty body", "/v1/chat/completions", ``, 400, "", "empty"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, 404, "model", "gpt-9"},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model", "required"},
		{"missing messages", "/v1/chat/completions", `{"model":"tiny"}`, 400, "messages", "messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"tiny","messages":[]}`, 400, "messages", "messages"},
		{"bad role", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"wizard","content":"hi"}]}`, 400, "messages[0].role", "wizard"},
		{"missing content", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user"}]}`, 400, "messages[0].content", "content"},
		{"image part", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "", "image_url"},
		{"negative max_tokens", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":-5}`, 400, "max_tokens", "at least 1"},
		{"zero max_completion_tokens", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`, 400, "max_completion_tokens", "at least 1"},
		{"max_tokens disagrees with max_completion_tokens", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":7,"max_completion_tokens":5}`, 400, "max_tokens", "max_completion_tokens"},
		{"temperature too high", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"temperature":3}`, 400, "temperature", "between 0 and 2"},
		{"temperature negative", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"temperature":-0.1}`, 400, "temperature", "between 0 and 2"},
		{"temperature string", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"temperature":"hot"}`, 400, "temperature", "temperature must be a number, got string"},
		{"top_p zero", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"top_p":0}`, 400, "top_p", "top_p"},
		{"json_schema beside type text", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"text","json_schema":{"name":"p","schema":{}}}}`, 400, "response_format.json_schema", "only with type json_schema"},
		{"json_schema with a null schema", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":null}}}`, 400, "response_format.json_schema", "needs json_schema.schema"},
		{"tool parameters not an object", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]}`, 400, "tools[0].function.parameters", "tools[0].function.parameters must be a JSON Schema object"},
		{"n=2", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"n":2}`, 400, "n", "n=1"},
		{"completion no prompt", "/v1/completions", `{"model":"tiny"}`, 400, "prompt", "prompt"},
		{"completion batched prompt", "/v1/completions", `{"model":"tiny","prompt":[[1,2],[3]]}`, 400, "", "batched"},
		{"completion negative id", "/v1/completions", `{"model":"tiny","prompt":[1,-2]}`, 400, "", "out of range"},
		{"completion negative max_tokens", "/v1/completions", `{"model":"tiny","prompt":"x","max_tokens":-1}`, 400, "max_tokens", "at least 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gen := &scriptGen{pieces: []string{"never"}, finish: "stop"}
			srv, codes := newTestServer(t, gen)
			resp, body := post(t, srv.URL+c.path, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if gen.got != nil {
				t.Fatalf("an invalid request reached the generator")
			}
			var eb ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil {
				t.Fatalf("error body is not OpenAI-shaped JSON: %v: %s", err, body)
			}
			if eb.Error.Type == "" || !strings.Contains(eb.Error.Message, c.contains) {
				t.Fatalf("error %+v does not mention %q", eb.Error, c.contains)
			}
			if c.param != "" && (eb.Error.Param == nil || *eb.Error.Param != c.param) {
				t.Fatalf("param = %v, want %q", eb.Error.Param, c.param)
			}
			if len(*codes) != 1 || (*codes)[0] != c.status {
				t.Fatalf("OnResult codes %v, want [%d]", *codes, c.status)
			}
		})
	}
}

func TestRequestConversion(t *testing.T) {
	gen := &scriptGen{finish: "stop"}
	srv, _ := newTestServer(t, gen)
	resp, body := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny","messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"}],
		"temperature":0,"top_k":-1,"top_p":0.5,"seed":42,"stop":"END","max_tokens":9,"ignore_eos":true,"x_exo_disable_remote_prefill":true,"tools":[]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	g := gen.got
	if g.Messages[0].Role != "system" || g.Messages[1].Content != "hi" || g.Sampling.Temperature != 0 || g.Sampling.TopK != 0 ||
		g.Sampling.TopP != 0.5 || !g.Sampling.SeedSet || g.Sampling.Seed != 42 || len(g.Stop) != 1 || g.Stop[0] != "END" ||
		g.MaxTokens != 9 || !g.IgnoreEOS || !g.DisableRemotePrefill || g.Stream {
		t.Fatalf("converted request wrong: %+v", g)
	}
}

func TestModelsAndTokenize(t *testing.T) {
	srv, _ := newTestServer(t, &scriptGen{})
	resp, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml ModelList
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ml.Object != "list" || len(ml.Data) != 1 || ml.Data[0].ID != "tiny" {
		t.Fatalf("models = %+v", ml)
	}
	resp, body := post(t, srv.URL+"/tokenize", `{"model":"tiny","messages":[{"role":"user","content":"abcd"}]}`)
	var tr TokenizeResponse
	if err := json.Unmarshal([]byte(body), &tr); err != nil || resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, body)
	}
	if tr.Count != 4 || len(tr.Tokens) != 4 || tr.MaxModelLen != 2048 {
		t.Fatalf("tokenize = %+v", tr)
	}
}

func FuzzDecodeChatRequest(f *testing.F) {
	f.Add(`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stop":["a"],"max_tokens":3}`)
	f.Add(`{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`)
	f.Add(`{"model":"tiny","prompt":[1,2,3]}`)
	f.Fuzz(func(t *testing.T, s string) {
		v := Validator{Served: func(string) bool { return true }}
		var r ChatRequest
		if decodeJSON([]byte(s), &r, chatShape) == nil {
			_, _ = v.ValidateChat(&r)
		}
		var c CompletionRequest
		if decodeJSON([]byte(s), &c, completionShape) == nil {
			_, _ = v.ValidateCompletion(&c)
		}
	})
}

// TestCompletionPromptForms: the prompt forms OpenAI's legacy completions
// take for one prompt: a string, a list of one string, token ids, and a
// list of one token-id list (a batch of one, as the SDK's types allow).
func TestCompletionPromptForms(t *testing.T) {
	for _, c := range []struct {
		prompt string
		text   string
		ids    []int32
	}{
		{`"hi"`, "hi", nil},
		{`["hi"]`, "hi", nil},
		{`[5,6]`, "", []int32{5, 6}},
		{`[[5,6]]`, "", []int32{5, 6}},
	} {
		gen := &scriptGen{finish: "stop"}
		srv, _ := newTestServer(t, gen)
		resp, body := post(t, srv.URL+"/v1/completions", `{"model":"tiny","max_tokens":2,"prompt":`+c.prompt+`}`)
		if resp.StatusCode != 200 {
			t.Errorf("prompt %s: %d %s", c.prompt, resp.StatusCode, body)
			continue
		}
		if gen.got.Prompt != c.text || fmt.Sprint(gen.got.PromptIDs) != fmt.Sprint(c.ids) {
			t.Errorf("prompt %s: text %q ids %v", c.prompt, gen.got.Prompt, gen.got.PromptIDs)
		}
	}
}

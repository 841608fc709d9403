package localrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/httpapi"
)

// TestRunEqualsAPI: a three-turn conversation through exo run's chat loop
// (the entry point cmd uses, prefix cache reused between turns) gives,
// turn by turn at temperature 0, the same generated tokens (each one's
// bytes and log-probability, bit for bit, from logprobs: Reply.Tokens and
// the API's logprobs content), prompt tokens, answer, reasoning,
// completion tokens, finish and reused tokens as the same conversation through the decode runner's
// HTTP API (its own prefix cache), and as a fresh prefill of the whole
// conversation (a server with no prefix cache); every later turn reuses
// KV of the earlier ones. On a hybrid model with recurrent layers and
// <think> reasoning (qwen3_next, Qwen3's template: a turn resumes from the
// state kept at the end of the previous prompt's prefill), a
// sliding-window one whose ring cache cannot go back (gemma3, window 8,
// shorter than the conversation) and a harmony one (gpt-oss: channels,
// its own template). Random weights write no <think> or channel header,
// so the splitting runs but the reasoning is empty (and gpt-oss's answer
// too: text outside a channel is dropped alike on every path; its tokens
// are still compared, one per completion token).
func TestRunEqualsAPI(t *testing.T) {
	for _, tc := range []struct {
		arch string
		dir  func(t *testing.T) string
	}{
		{"qwen3_next", qwen3Next},
		{"gemma3", func(t *testing.T) string {
			return writeModel(t, testmodel.Spec{Arch: "gemma3", Seed: 7, Layers: 4, MaxPositions: 4096, SlidingWindow: 8, SlidingPattern: 3},
				"../../runners/chat/testdata/gemma3_chat_template.jinja")
		}},
		{"gpt_oss", harmonyGptOss},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			dir := tc.dir(t)
			const maxTokens = 12
			zero := 0.0
			ctx := context.Background()
			s, err := Open(ctx, Options{Model: dir, Backend: "cpu", Threads: 1, MaxTokens: maxTokens, Offline: true,
				Flags: gen.Defaults{Temperature: &zero}, Logprobs: true}, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			users := []string{"Hello there, who are you?", "Tell me about rivers and bridges.", "And what of the old stone bridge?"}
			var stdout, stderr bytes.Buffer
			if err := s.Chat(ctx, strings.NewReader(strings.Join(users, "\n")+"\n"), &stdout, &stderr); err != nil {
				t.Fatal(err)
			}
			run := s.Replies()
			if len(run) != len(users) {
				t.Fatalf("%d replies to %d turns\nstderr %s", len(run), len(users), stderr.String())
			}

			api := newAPI(t, dir, 0)    // a runner's prefix cache
			fresh := newAPI(t, dir, -1) // none: every turn prefills the whole conversation
			var msgs []map[string]string
			for i, u := range users {
				msgs = append(msgs, map[string]string{"role": "user", "content": u})
				a, atoks, acached := api.chat(t, msgs, maxTokens)
				f, ftoks, fcached := fresh.chat(t, msgs, maxTokens)
				r := run[i]
				got := answer{r.Content, r.Reasoning, r.Result.PromptTokens, r.Result.CompletionTokens, r.Result.FinishReason}
				if got != a || got != f {
					t.Errorf("turn %d:\nexo run %+v\nAPI     %+v\nfresh   %+v", i+1, got, a, f)
				}
				// The tokens themselves, each with its log-probability,
				// reasoning and text the parser dropped included (gpt-oss's
				// whole answer here): one per completion token on every
				// path, the same bytes, and the same values bit for bit
				// (one cpu backend, greedy, the same prompt).
				toks := make([]token, len(r.Tokens))
				for j, lp := range r.Tokens {
					toks[j] = token{string(lp.Bytes), clampLogprob(lp.Logprob)}
				}
				for _, p := range []struct {
					name string
					toks []token
				}{{"exo run", toks}, {"API", atoks}, {"fresh", ftoks}} {
					if len(p.toks) != got.Tokens {
						t.Errorf("turn %d: %s gave %d tokens' logprobs for %d completion tokens", i+1, p.name, len(p.toks), got.Tokens)
					}
				}
				if !slices.Equal(toks, atoks) || !slices.Equal(toks, ftoks) {
					t.Errorf("turn %d tokens:\nexo run %v\nAPI     %v\nfresh   %v", i+1, toks, atoks, ftoks)
				}
				if got.Tokens == 0 {
					t.Errorf("turn %d generated nothing", i+1)
				}
				if fcached != 0 {
					t.Errorf("turn %d: the fresh server reused %d tokens", i+1, fcached)
				}
				if r.Result.CachedTokens != acached {
					t.Errorf("turn %d: exo run reused %d tokens, the API %d", i+1, r.Result.CachedTokens, acached)
				}
				if i > 0 && r.Result.CachedTokens == 0 {
					t.Errorf("turn %d reused none of the previous turns' KV", i+1)
				}
				t.Logf("turn %d: %d prompt tokens, %d reused; %d generated (%s): %d bytes of answer, %d of reasoning; tokens %v", i+1, r.Result.PromptTokens, r.Result.CachedTokens, got.Tokens, got.Finish, len(got.Content), len(got.Reasoning), toks)
				msgs = append(msgs, map[string]string{"role": "assistant", "content": r.Content})
			}
			if stdout.Len() == 0 {
				t.Error("nothing streamed to stdout")
			}
		})
	}
}

// answer is what a turn produced.
type answer struct {
	Content, Reasoning string
	Prompt, Tokens     int
	Finish             string
}

// token is one generated token as the API's logprobs content gives it:
// its bytes and log-probability.
type token struct {
	Bytes   string
	Logprob float64
}

func (t token) String() string { return fmt.Sprintf("%q %v", t.Bytes, t.Logprob) }

// clampLogprob is what the API writes for lp (JSON has no -Inf: OpenAI's
// -9999 stands for it).
func clampLogprob(lp float64) float64 {
	if math.IsNaN(lp) || lp < -9999 {
		return -9999
	}
	return lp
}

type apiServer struct{ url string }

// newAPI serves the decode runner's API over the model in dir (its own
// load: a backend serves one goroutine) with cacheEntries (0: the
// default; -1: no prefix cache).
func newAPI(t *testing.T, dir string, cacheEntries int) *apiServer {
	t.Helper()
	m, err := engine.Load(context.Background(), dir, cpu.New(1), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := decode.NewSetup("m", m, dir, gen.Defaults{})
	if err != nil || st.NoTemplate != nil {
		t.Fatal(err, st.NoTemplate)
	}
	o := st.Options
	o.CacheEntries = cacheEntries
	o.Logger = slog.New(slog.DiscardHandler)
	srv := decode.New(o)
	mux := http.NewServeMux()
	httpapi.Mount(mux, httpapi.Options{Gen: srv, Name: o.Name, Defaults: o.Defaults, AcceptTools: o.AcceptTools, Logger: o.Logger})
	srv.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() { hs.Close(); srv.Close(); m.Close() })
	return &apiServer{url: hs.URL}
}

// chat answers msgs at temperature 0 with logprobs: the answer, its
// tokens and the prompt tokens reused.
func (a *apiServer) chat(t *testing.T, msgs []map[string]string, maxTokens int) (answer, []token, int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "temperature": 0, "max_tokens": maxTokens, "logprobs": true})
	resp, err := http.Post(a.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cr struct {
		Choices []struct {
			Message struct {
				Content          *string `json:"content"`
				ReasoningContent string  `json:"reasoning_content"`
			} `json:"message"`
			Logprobs *struct {
				Content []struct {
					Logprob float64 `json:"logprob"`
					Bytes   []int   `json:"bytes"` // OpenAI's: ints, not base64
				} `json:"content"`
			} `json:"logprobs"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cr); err != nil || resp.StatusCode != 200 || len(cr.Choices) != 1 {
		t.Fatalf("chat: HTTP %d, %v, %+v", resp.StatusCode, err, cr)
	}
	c := cr.Choices[0]
	a2 := answer{Reasoning: c.Message.ReasoningContent, Prompt: cr.Usage.PromptTokens, Tokens: cr.Usage.CompletionTokens, Finish: c.FinishReason}
	if c.Message.Content != nil {
		a2.Content = *c.Message.Content
	}
	cached := 0
	if d := cr.Usage.PromptTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	if c.Logprobs == nil {
		t.Fatalf("chat: no logprobs in %+v", cr)
	}
	toks := []token{}
	for _, lp := range c.Logprobs.Content {
		b := make([]byte, len(lp.Bytes))
		for i, c := range lp.Bytes {
			b[i] = byte(c)
		}
		toks = append(toks, token{string(b), lp.Logprob})
	}
	return a2, toks, cached
}

// qwen3Next is the tiny random Qwen3-Next fixture (Gated DeltaNet layers
// between attention) with Qwen3's real chat template (<think> reasoning).
func qwen3Next(t *testing.T) string {
	t.Helper()
	src := filepath.Join("..", "..", "runners", "engine", "testdata", "reference", "qwen3_next")
	dir := filepath.Join(t.TempDir(), "qwen3_next")
	os.MkdirAll(dir, 0o755)
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644)
	}
	setTemplate(t, dir, "../../runners/chat/testdata/qwen3_real_chat_template.jinja")
	return dir
}

func writeModel(t *testing.T, spec testmodel.Spec, template string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), spec.Arch)
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	setTemplate(t, dir, template)
	return dir
}

func setTemplate(t *testing.T, dir, template string) {
	t.Helper()
	tmpl, err := os.ReadFile(template)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	readJSON(t, filepath.Join(dir, "tokenizer_config.json"), &cfg)
	cfg["chat_template"] = string(tmpl)
	writeJSON(t, filepath.Join(dir, "tokenizer_config.json"), cfg)
}

// harmonyGptOss writes the tiny random gpt-oss model with a harmony
// tokenizer and gpt-oss's own chat template, as runners/decode's tests do
// (testmodel.WriteHarmony).
func harmonyGptOss(t *testing.T) string {
	t.Helper()
	tmpl, err := os.ReadFile("../../runners/chat/testdata/gptoss_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "gptoss")
	if err := testmodel.WriteHarmony(dir, testmodel.Spec{Arch: "gptoss", Seed: 11, Layers: 2, MaxPositions: 4096}, tmpl); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

package decode

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/httpapi"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// tinyServer is a decode Server on a real tiny model (random weights, so
// its distributions are wide: good for telling samples apart), served over
// HTTP by the real handler.
type tinyServer struct {
	srv   *Server
	url   string
	model *engine.Model
	tok   *tokenizer.Tokenizer
	dir   string
}

func newTinyServer(t *testing.T, defaults gen.Defaults) *tinyServer {
	t.Helper()
	return startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(_ Text, o *Options) {
		o.Defaults = defaults
	})
}

// apiMux serves srv as the runner does: the OpenAI and Anthropic adapters
// over it (runners/httpapi) and its own routes.
func apiMux(srv *Server) *http.ServeMux {
	mux := http.NewServeMux()
	httpapi.Mount(mux, httpapi.Options{Gen: srv, Name: srv.o.Name, Defaults: srv.o.Defaults, AcceptTools: srv.o.AcceptTools,
		Metrics: srv.m, Logger: srv.log})
	srv.Register(mux)
	return mux
}

// startTinyServer writes spec's model, loads it on the cpu backend and
// serves it over HTTP by a decode Server whose Options configure may adjust
// (text is the Server's Text).
func startTinyServer(t *testing.T, spec testmodel.Spec, configure func(text Text, o *Options)) *tinyServer {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	return serveTinyDir(t, dir, configure)
}

// serveTinyDir is startTinyServer for a model directory already written.
func serveTinyDir(t *testing.T, dir string, configure func(text Text, o *Options)) *tinyServer {
	t.Helper()
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	return serveTinyOn(t, b, dir, configure)
}

// serveTinyOn is serveTinyDir on backend b.
// loadText loads the tokenizer and chat template of the model in dir.
func loadText(t *testing.T, dir string) (*tokenizer.Tokenizer, Text) {
	t.Helper()
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok, NewText(tok, tmpl)
}

func serveTinyOn(t *testing.T, b engine.Backend, dir string, configure func(text Text, o *Options)) *tinyServer {
	t.Helper()
	m, err := engine.Load(context.Background(), dir, b, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	tok, text := loadText(t, dir)
	o := Options{Name: "m", Model: m, Text: text, NewSampler: NewSampler, NewStopMatcher: NewStopMatcher,
		MaxBatch: 2, CacheEntries: -1}
	configure(text, &o)
	srv := New(o)
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(apiMux(srv))
	t.Cleanup(hs.Close)
	return &tinyServer{srv: srv, url: hs.URL, model: m, tok: tok, dir: dir}
}

func (s *tinyServer) post(t *testing.T, path string, body any, out any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(s.url+path, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %v: %s", path, err, raw)
		}
	}
	if resp.StatusCode != 200 {
		t.Logf("%s: %d %s", path, resp.StatusCode, raw)
	}
	return resp.StatusCode
}

type chatOut struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Logprobs *openai.ChatLogprobs `json:"logprobs"`
	} `json:"choices"`
}

func (s *tinyServer) chat(t *testing.T, extra map[string]any) chatOut {
	t.Helper()
	body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "tell me something"}},
		"max_tokens": 8, "ignore_eos": true}
	for k, v := range extra {
		body[k] = v
	}
	var out chatOut
	if code := s.post(t, "/v1/chat/completions", body, &out); code != 200 || len(out.Choices) != 1 {
		t.Fatalf("status %d: %+v", code, out)
	}
	return out
}

// TestSeedlessRequestsDiffer: five temperature-1 requests without a seed
// give at least 4 distinct texts; with a seed, the same text every time.
func TestSeedlessRequestsDiffer(t *testing.T) {
	s := newTinyServer(t, gen.Defaults{})
	unseeded, seeded := map[string]bool{}, map[string]bool{}
	for range 5 {
		unseeded[s.chat(t, map[string]any{"temperature": 1}).Choices[0].Message.Content] = true
		seeded[s.chat(t, map[string]any{"temperature": 1, "seed": 1234}).Choices[0].Message.Content] = true
	}
	if len(unseeded) < 4 {
		t.Fatalf("5 unseeded requests gave %d distinct texts: %v", len(unseeded), unseeded)
	}
	if len(seeded) != 1 {
		t.Fatalf("5 seeded requests gave %d texts: %v", len(seeded), seeded)
	}
}

// TestModelDefaultsApply: a model default of temperature 0 makes seedless
// requests greedy (identical), and a request's temperature overrides it.
func TestModelDefaultsApply(t *testing.T) {
	zero := 0.0
	s := newTinyServer(t, gen.Defaults{Temperature: &zero})
	texts := map[string]bool{}
	for range 3 {
		texts[s.chat(t, nil).Choices[0].Message.Content] = true
	}
	if len(texts) != 1 {
		t.Fatalf("greedy default: %d texts", len(texts))
	}
	texts = map[string]bool{}
	for range 5 {
		texts[s.chat(t, map[string]any{"temperature": 1.5}).Choices[0].Message.Content] = true
	}
	if len(texts) < 4 {
		t.Fatalf("request temperature did not override the default: %d texts", len(texts))
	}
}

// TestLogprobsEqualEngine: for greedy decoding, each token's logprob equals
// the largest of its top_logprobs and log-softmax of the engine's own
// logits at that position, computed here independently.
func TestLogprobsEqualEngine(t *testing.T) {
	s := newTinyServer(t, gen.Defaults{})
	out := s.chat(t, map[string]any{"temperature": 0, "logprobs": true, "top_logprobs": 5, "max_tokens": 6})
	lps := out.Choices[0].Logprobs
	if lps == nil || len(lps.Content) != 6 {
		t.Fatalf("logprobs: %+v", lps)
	}
	// the engine's logits for the same prompt
	var tk struct{ Tokens []int32 }
	if s.post(t, "/tokenize", map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "tell me something"}}}, &tk) != 200 {
		t.Fatal("tokenize")
	}
	cache := s.model.NewCache()
	defer cache.Free()
	logits, err := s.model.Forward(context.Background(), cache, tk.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for i, c := range lps.Content {
		maxL, sum := math.Inf(-1), 0.0
		for _, v := range logits {
			maxL = max(maxL, float64(v))
		}
		for _, v := range logits {
			sum += math.Exp(float64(v) - maxL)
		}
		greedy := int32(slices.Index(logits, slices.Max(logits)))
		want := float64(logits[greedy]) - maxL - math.Log(sum)
		if math.Abs(c.Logprob-want) > 1e-9 {
			t.Fatalf("token %d: logprob %v, log-softmax of the engine's logits %v", i, c.Logprob, want)
		}
		if len(c.TopLogprobs) != 5 || c.TopLogprobs[0].Logprob != c.Logprob {
			t.Fatalf("token %d: top_logprobs %+v, logprob %v", i, c.TopLogprobs, c.Logprob)
		}
		for j := 1; j < 5; j++ {
			if c.TopLogprobs[j].Logprob > c.TopLogprobs[j-1].Logprob {
				t.Fatalf("token %d: top_logprobs not descending", i)
			}
		}
		wantBytes := s.tok.TokenBytes(greedy)
		if len(c.Bytes) != len(wantBytes) {
			t.Fatalf("token %d: bytes %v, want %v", i, c.Bytes, wantBytes)
		}
		for j := range wantBytes {
			if c.Bytes[j] != int(wantBytes[j]) {
				t.Fatalf("token %d: bytes %v, want %v", i, c.Bytes, wantBytes)
			}
		}
		text.Write(wantBytes)
		if logits, err = s.model.Forward(context.Background(), cache, []int32{greedy}); err != nil {
			t.Fatal(err)
		}
	}
	// (random weights produce stray bytes; the content shows them as U+FFFD)
	if strings.ToValidUTF8(text.String(), "") != strings.ReplaceAll(out.Choices[0].Message.Content, "\uFFFD", "") {
		t.Fatalf("logprob tokens spell %q, content %q", text.String(), out.Choices[0].Message.Content)
	}
}

// TestLogitBiasAndPenaltiesReachTheSampler: banning the greedy first token
// changes it; a bias on an id outside the vocabulary is a 400.
func TestLogitBiasAndPenaltiesReachTheSampler(t *testing.T) {
	s := newTinyServer(t, gen.Defaults{})
	base := s.chat(t, map[string]any{"temperature": 0, "logprobs": true, "max_tokens": 1})
	first := base.Choices[0].Logprobs.Content[0].Bytes
	ids := s.tok.Encode(base.Choices[0].Message.Content)
	if len(ids) != 1 || len(first) == 0 {
		t.Skipf("first token %q does not re-encode to one id", base.Choices[0].Message.Content)
	}
	banned := s.chat(t, map[string]any{"temperature": 0, "max_tokens": 1, "logit_bias": map[string]float64{itoa(ids[0]): -100}})
	if banned.Choices[0].Message.Content == base.Choices[0].Message.Content {
		t.Fatalf("banned token %d still generated", ids[0])
	}
	if code := s.post(t, "/v1/chat/completions", map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "x"}},
		"logit_bias": map[string]float64{"99999": 1}}, nil); code != 400 {
		t.Fatalf("logit_bias outside the vocabulary: status %d", code)
	}
	// a strong frequency penalty forbids repeats under greedy decoding
	out := s.chat(t, map[string]any{"temperature": 0, "frequency_penalty": 2, "logit_bias": map[string]float64{}, "max_tokens": 12, "logprobs": true})
	seen := map[string]bool{}
	rep := 0
	for _, c := range out.Choices[0].Logprobs.Content {
		if seen[c.Token] {
			rep++
		}
		seen[c.Token] = true
	}
	plain := s.chat(t, map[string]any{"temperature": 0, "max_tokens": 12, "logprobs": true})
	prep := 0
	seen = map[string]bool{}
	for _, c := range plain.Choices[0].Logprobs.Content {
		if seen[c.Token] {
			prep++
		}
		seen[c.Token] = true
	}
	t.Logf("repeated tokens: %d with frequency_penalty 2, %d without", rep, prep)
	if prep > 0 && rep >= prep {
		t.Fatalf("frequency_penalty did not reduce repeats (%d vs %d)", rep, prep)
	}
}

func itoa(v int32) string { return strconv.Itoa(int(v)) }

// TestAssistantPrefill: a final assistant message is continued: the prompt
// ends with its content (no end of turn, no new turn), and the generated
// text equals what a completion of that exact prompt gives.
func TestAssistantPrefill(t *testing.T) {
	s := newTinyServer(t, gen.Defaults{})
	msgs := []map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}}
	var tk struct{ Tokens []int32 }
	if s.post(t, "/tokenize", map[string]any{"model": "m", "messages": msgs}, &tk) != 200 {
		t.Fatal("tokenize")
	}
	var dt struct{ Prompt string }
	if s.post(t, "/detokenize", map[string]any{"model": "m", "tokens": tk.Tokens}, &dt) != 200 {
		t.Fatal("detokenize")
	}
	want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nOnce upon"
	if dt.Prompt != want {
		t.Fatalf("continued prompt %q, want %q", dt.Prompt, want)
	}
	got := s.chat(t, map[string]any{"messages": msgs, "temperature": 0})
	var cmp struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if s.post(t, "/v1/completions", map[string]any{"model": "m", "prompt": tk.Tokens, "temperature": 0, "max_tokens": 8, "ignore_eos": true}, &cmp) != 200 {
		t.Fatal("completion")
	}
	if got.Choices[0].Message.Content != cmp.Choices[0].Text {
		t.Fatalf("continued chat %q, completion of the same prompt %q", got.Choices[0].Message.Content, cmp.Choices[0].Text)
	}
	// add_generation_prompt true: a new assistant turn after it instead
	if s.post(t, "/tokenize", map[string]any{"model": "m", "messages": msgs, "add_generation_prompt": true}, &tk) != 200 {
		t.Fatal("tokenize")
	}
	s.post(t, "/detokenize", map[string]any{"model": "m", "tokens": tk.Tokens}, &dt)
	if !strings.HasSuffix(dt.Prompt, "Once upon<|im_end|>\n<|im_start|>assistant\n") {
		t.Fatalf("new turn prompt %q", dt.Prompt)
	}
}

func TestModelDefaultsFromFiles(t *testing.T) {
	dir := t.TempDir()
	if d, err := ModelDefaults(dir); err != nil || DescribeDefaults(d) != "none" {
		t.Fatalf("no file: %v %v", d, err)
	}
	os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"do_sample":true,"temperature":0.6,"top_p":0.95,"top_k":20,"eos_token_id":[1,2]}`), 0o644)
	d, err := ModelDefaults(dir)
	if err != nil || DescribeDefaults(d) != "temperature=0.6 top_p=0.95 top_k=20" {
		t.Fatalf("%v %q", err, DescribeDefaults(d))
	}
	os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"temperature":7}`), 0o644)
	if _, err := ModelDefaults(dir); err == nil || !strings.Contains(err.Error(), "temperature") {
		t.Fatalf("invalid default accepted: %v", err)
	}
}

// TestSeededBatchedEqualsAlone: seeded temperature-1 requests decoded
// together (batched) give the texts they give alone.
func TestSeededBatchedEqualsAlone(t *testing.T) {
	s := newTinyServer(t, gen.Defaults{})
	const n = 2
	alone := make([]string, n)
	for i := range alone {
		alone[i] = s.chat(t, map[string]any{"temperature": 1, "seed": 100 + i, "max_tokens": 24}).Choices[0].Message.Content
	}
	together := make([]string, n)
	var wg sync.WaitGroup
	for i := range together {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "tell me something"}},
				"ignore_eos": true, "temperature": 1, "seed": 100 + i, "max_tokens": 24})
			resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", strings.NewReader(string(b)))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var out chatOut
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
				t.Errorf("batched request %d: %v", i, err)
				return
			}
			together[i] = out.Choices[0].Message.Content
		}()
	}
	wg.Wait()
	for i := range alone {
		if alone[i] != together[i] {
			t.Fatalf("seed %d: alone %q, batched %q", 100+i, alone[i], together[i])
		}
	}
}

// TestPenaltiesAndBiasMatchReference: greedy generations on the tiny model
// with logit_bias, presence/frequency and repetition penalties equal a
// reference computed here from the engine's own logits by the definitions
// (OpenAI: l[id] += bias, -100 bans; l[id] -= count·frequency +
// [count>0]·presence over generated tokens; HF: l[id] /= rp when positive,
// *= rp when negative, over prompt and generated tokens).
func TestPenaltiesAndBiasMatchReference(t *testing.T) {
	s := newTinyServer(t, gen.Defaults{})
	msgs := []map[string]any{{"role": "user", "content": "tell me something"}}
	var tk struct{ Tokens []int32 }
	if s.post(t, "/tokenize", map[string]any{"model": "m", "messages": msgs}, &tk) != 200 {
		t.Fatal("tokenize")
	}
	const steps = 10
	cases := []struct {
		name           string
		bias           map[int32]float64
		presence, freq float64
		rep            float64
	}{
		{"frequency", nil, 0, 1.5, 1},
		{"presence", nil, 1.2, 0, 1},
		{"both, negative presence", nil, -0.5, 0.8, 1},
		{"repetition", nil, 0, 0, 1.8},
		{"bias", map[int32]float64{5: 3, 99: 1.5}, 0, 0, 1}, // and the plain greedy first token banned
		{"all", map[int32]float64{42: 2}, 0.4, 0.6, 1.3},
	}
	first := func() int32 {
		cache := s.model.NewCache()
		defer cache.Free()
		l, err := s.model.Forward(context.Background(), cache, tk.Tokens)
		if err != nil {
			t.Fatal(err)
		}
		return int32(slices.Index(l, slices.Max(l)))
	}()
	for _, c := range cases {
		if c.bias != nil {
			c.bias[first] = -100
		}
		t.Run(c.name, func(t *testing.T) {
			// the reference
			cache := s.model.NewCache()
			defer cache.Free()
			logits, err := s.model.Forward(context.Background(), cache, tk.Tokens)
			if err != nil {
				t.Fatal(err)
			}
			history := slices.Clone(tk.Tokens)
			counts := map[int32]int{}
			var want []int32
			for range steps {
				adj := slices.Clone(logits)
				for id, b := range c.bias {
					if b <= -100 {
						adj[id] = float32(math.Inf(-1))
					} else {
						adj[id] += float32(b)
					}
				}
				if c.rep != 1 {
					seen := map[int32]bool{}
					for _, id := range history {
						if seen[id] {
							continue
						}
						seen[id] = true
						if adj[id] < 0 {
							adj[id] *= float32(c.rep)
						} else {
							adj[id] /= float32(c.rep)
						}
					}
				}
				for id, n := range counts {
					adj[id] -= float32(float64(n)*c.freq + c.presence)
				}
				best := int32(0)
				for i, v := range adj {
					if v > adj[best] {
						best = int32(i)
					}
				}
				want = append(want, best)
				history = append(history, best)
				counts[best]++
				if logits, err = s.model.Forward(context.Background(), cache, []int32{best}); err != nil {
					t.Fatal(err)
				}
			}
			// the server
			bias := map[string]float64{}
			for id, b := range c.bias {
				bias[strconv.Itoa(int(id))] = b
			}
			out := s.chat(t, map[string]any{"temperature": 0, "max_tokens": steps, "logprobs": true, "logit_bias": bias,
				"presence_penalty": c.presence, "frequency_penalty": c.freq, "repetition_penalty": c.rep})
			var got []int32
			for _, lp := range out.Choices[0].Logprobs.Content {
				b := make([]byte, len(lp.Bytes))
				for i, x := range lp.Bytes {
					b[i] = byte(x)
				}
				got = append(got, tokenOf(t, s.tok, b, want[len(got)]))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("server %v, reference %v", got, want)
			}
			// and the knobs did something: plain greedy differs
			plain := s.chat(t, map[string]any{"temperature": 0, "max_tokens": steps})
			if plain.Choices[0].Message.Content == out.Choices[0].Message.Content {
				t.Fatalf("same text as plain greedy: %q", plain.Choices[0].Message.Content)
			}
		})
	}
}

// tokenOf returns want when its bytes are b (the server reports bytes, not
// ids), else the first id with bytes b.
func tokenOf(t *testing.T, tok *tokenizer.Tokenizer, b []byte, want int32) int32 {
	if slices.Equal(tok.TokenBytes(want), b) {
		return want
	}
	for id := range int32(tok.VocabSize()) {
		if slices.Equal(tok.TokenBytes(id), b) {
			return id
		}
	}
	t.Fatalf("no token has bytes %v", b)
	return -1
}

// TestModelDefaultsFromGGUF reads general.sampling.* from a GGUF written
// here byte by byte (v3: magic, version, counts, then key/type/value).
func TestModelDefaultsFromGGUF(t *testing.T) {
	var b []byte
	u32 := func(v uint32) { b = binary.LittleEndian.AppendUint32(b, v) }
	u64 := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	str := func(s string) { u64(uint64(len(s))); b = append(b, s...) }
	b = append(b, "GGUF"...)
	u32(3)
	u64(0) // tensors
	u64(4) // key/values
	str("general.architecture")
	u32(8)
	str("llama")
	str("general.sampling.temp")
	u32(6)
	u32(math.Float32bits(0.6))
	str("general.sampling.top_k")
	u32(4)
	u32(20)
	str("general.sampling.penalty_repeat")
	u32(6)
	u32(math.Float32bits(1.25))
	p := filepath.Join(t.TempDir(), "m.gguf")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := ModelDefaults(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := DescribeDefaults(d); got != "temperature=0.6 top_k=20 repetition_penalty=1.25" {
		t.Fatalf("%q", got)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

var (
	tinyOnce sync.Once
	tinyDir  string
	tinyErr  error
)

// tinyModel writes the tiny test models once: "main" and "other" (another
// shape, for fingerprint mismatch), "bf16" (main in bf16) and "moe" (a
// Qwen3-MoE).
func tinyModel(t *testing.T, which string) string {
	t.Helper()
	tinyOnce.Do(func() {
		tinyDir, tinyErr = os.MkdirTemp("", "exo-e2e-models-")
		if tinyErr != nil {
			return
		}
		tinyErr = testmodel.Write(filepath.Join(tinyDir, "main"), testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2, MaxPositions: 4096})
		if tinyErr == nil {
			tinyErr = testmodel.Write(filepath.Join(tinyDir, "other"), testmodel.Spec{Arch: "llama", Seed: 8, Layers: 3, MaxPositions: 4096})
		}
		if tinyErr == nil {
			tinyErr = testmodel.Write(filepath.Join(tinyDir, "bf16"), testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2, MaxPositions: 4096, DType: engine.BF16})
		}
		if tinyErr == nil {
			tinyErr = testmodel.Write(filepath.Join(tinyDir, "moe"), testmodel.Spec{Arch: "qwen3moe", Seed: 7, Layers: 3, MaxPositions: 4096})
		}
		// The same two with room for a generation that outlasts anything
		// a test runs beside it (TestTinyConcurrentRemotePrefillWhileBatching).
		if tinyErr == nil {
			tinyErr = testmodel.Write(filepath.Join(tinyDir, "main-long"), testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2, MaxPositions: 32768})
		}
		if tinyErr == nil {
			tinyErr = testmodel.Write(filepath.Join(tinyDir, "moe-long"), testmodel.Spec{Arch: "qwen3moe", Seed: 7, Layers: 3, MaxPositions: 32768})
		}
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return filepath.Join(tinyDir, which)
}

func user(s string) []msg { return []msg{{Role: "user", Content: s}} }

// expectSame checks that two results are complete and their texts equal.
func expectSame(t *testing.T, what string, got, want chatResult) {
	t.Helper()
	for _, r := range []chatResult{got, want} {
		if r.Status != 200 || !r.Done || r.ErrorBody != "" {
			t.Fatalf("%s: request failed: %+v", what, r)
		}
	}
	if got.Text != want.Text {
		t.Fatalf("%s: remote-prefill text differs from local:\nremote: %q\nlocal:  %q", what, got.Text, want.Text)
	}
	if got.Completion != want.Completion || got.Prompt != want.Prompt {
		t.Fatalf("%s: usage differs: remote %d+%d, local %d+%d", what, got.Prompt, got.Completion, want.Prompt, want.Completion)
	}
}

const genTokens = 24

var ignoreEOS = map[string]any{"ignore_eos": true}

func TestTinyRemoteEqualsLocal(t *testing.T) {
	dir := tinyModel(t, "main")
	pre := start(t, "prefill", "prefill", "--model", dir, "--prefill-chunk", "128")
	dec := start(t, "decode-remote", "decode", "--model", dir, "--prefill", pre.listen)
	ref := start(t, "decode-local", "decode", "--model", dir)

	cases := []struct {
		name    string
		words   int
		minTok  int
		maxTok  int
		outcome string
	}{
		{"~50 tokens (skips remote)", 12, 30, 120, "skipped_short"},
		{"~300 tokens", 125, 260, 420, "ok"},
		{"~2000 tokens", 830, 1700, 2600, "ok"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := user(words(100+i, c.words))
			before := dec.metric(t, outcome(c.outcome))
			got := chatStream(t, dec.listen, m, genTokens, ignoreEOS)
			want := chatStream(t, ref.listen, m, genTokens, ignoreEOS)
			expectSame(t, c.name, got, want)
			if got.Prompt < c.minTok || got.Prompt > c.maxTok {
				t.Fatalf("prompt has %d tokens, want %d..%d (adjust the word count)", got.Prompt, c.minTok, c.maxTok)
			}
			if after := dec.metric(t, outcome(c.outcome)); after != before+1 {
				t.Fatalf("outcome %s counter %v → %v; last logged outcome %q", c.outcome, before, after, dec.lastOutcome())
			}
			if got.Completion != genTokens || got.Text == "" {
				t.Fatalf("generated %d tokens %q", got.Completion, got.Text)
			}
		})
	}

	t.Run("second turn reuses cached KV on both sides", func(t *testing.T) {
		first := user(words(7, 150))
		r1 := chatStream(t, dec.listen, first, genTokens, ignoreEOS)
		l1 := chatStream(t, ref.listen, first, genTokens, ignoreEOS)
		expectSame(t, "turn 1", r1, l1)
		second := append(first, msg{Role: "assistant", Content: r1.Text}, msg{Role: "user", Content: words(8, 120)})
		decHit := dec.metric(t, `exo_prefix_cache_hit_tokens_total{role="decode"}`)
		preHit := pre.metric(t, `exo_prefix_cache_hit_tokens_total{role="prefill"}`)
		ok := dec.metric(t, outcome("ok"))
		r2 := chatStream(t, dec.listen, second, genTokens, ignoreEOS)
		l2 := chatStream(t, ref.listen, second, genTokens, ignoreEOS)
		expectSame(t, "turn 2", r2, l2)
		if r2.Cached == 0 || r2.Cached < r1.Prompt-1 {
			t.Fatalf("turn 2 start_pos %d, want ≥ %d (turn 1's prompt)", r2.Cached, r1.Prompt-1)
		}
		if r2.Prompt-r2.Cached < 256 {
			t.Fatalf("turn 2 leaves only %d uncached tokens: too few to go remote", r2.Prompt-r2.Cached)
		}
		if d := dec.metric(t, `exo_prefix_cache_hit_tokens_total{role="decode"}`) - decHit; d != float64(r2.Cached) {
			t.Fatalf("decode prefix hits grew by %v, want %d", d, r2.Cached)
		}
		if d := pre.metric(t, `exo_prefix_cache_hit_tokens_total{role="prefill"}`) - preHit; d < float64(r1.Prompt-1) {
			t.Fatalf("prefill prefix hits grew by %v, want ≥ %d", d, r1.Prompt-1)
		}
		if dec.metric(t, outcome("ok")) != ok+1 {
			t.Fatalf("turn 2 did not prefill remotely; outcome %q", dec.lastOutcome())
		}
	})

	t.Run("prefill-side cache serves a repeated prompt to a fresh decode cache", func(t *testing.T) {
		p := user(words(9, 200))
		r1 := chatStream(t, dec.listen, p, 4, ignoreEOS)
		// A different conversation evicts nothing (pool of 4), so ask a
		// second decode runner: its cache is cold, the prefill's is warm.
		dec2 := start(t, "decode-remote-2", "decode", "--model", dir, "--prefill", pre.listen)
		preHit := pre.metric(t, `exo_prefix_cache_hit_tokens_total{role="prefill"}`)
		computed := pre.metric(t, `exo_prefill_computed_tokens_total{role="prefill"}`)
		r2 := chatStream(t, dec2.listen, p, 4, ignoreEOS)
		expectSame(t, "repeat", r2, r1)
		if d := pre.metric(t, `exo_prefix_cache_hit_tokens_total{role="prefill"}`) - preHit; d != float64(r1.Prompt-1) {
			t.Fatalf("prefill hit tokens grew by %v, want %d", d, r1.Prompt-1)
		}
		if d := pre.metric(t, `exo_prefill_computed_tokens_total{role="prefill"}`) - computed; d != 0 {
			t.Fatalf("prefill recomputed %v tokens of a cached prompt", d)
		}
		if out := dec2.outcomeSoon("ok"); out != "ok" {
			t.Fatalf("outcome %q", out)
		}
	})
}

// blockingSink holds a prefill runner busy: it accepts the header and then
// waits until released.
type blockingSink struct {
	began   chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *blockingSink) Begin(*kvwire.Header) error {
	s.once.Do(func() { close(s.began) })
	<-s.release
	return nil
}
func (s *blockingSink) Chunk(int, int, int, []byte, []byte) error { return nil }
func (s *blockingSink) State(int, int, [][]byte) error            { return nil }
func (s *blockingSink) Done(kvwire.Totals) error                  { return nil }
func (s *blockingSink) Rollback()                                 {}

func TestTinyFaults(t *testing.T) {
	dir := tinyModel(t, "main")
	secret := filepath.Join(t.TempDir(), "secret")
	wrong := filepath.Join(t.TempDir(), "wrong")
	os.WriteFile(secret, []byte("correct horse battery staple\n"), 0o600)
	os.WriteFile(wrong, []byte("tr0ub4dor&3\n"), 0o600)

	ref := start(t, "decode-local", "decode", "--model", dir)
	prompt := user(words(42, 400))
	want := chatStream(t, ref.listen, prompt, genTokens, ignoreEOS)
	if want.Status != 200 || !want.Done {
		t.Fatalf("reference: %+v", want)
	}

	// check runs the prompt on dec and expects the reference text and
	// exactly one more count of the outcome.
	check := func(t *testing.T, dec *proc, wantOutcome string) {
		t.Helper()
		before := dec.metric(t, outcome(wantOutcome))
		got := chatStream(t, dec.listen, prompt, genTokens, ignoreEOS)
		expectSame(t, wantOutcome, got, want)
		if after := dec.metric(t, outcome(wantOutcome)); after != before+1 {
			t.Fatalf("outcome %s: %v → %v (last logged %q)", wantOutcome, before, after, dec.lastOutcome())
		}
	}

	pre := start(t, "prefill", "prefill", "--model", dir, "--secret-file", secret, "--max-queue", "-1", "--prefix-cache-mib", "0", "--prefill-chunk", "64")

	t.Run("authenticated ok", func(t *testing.T) {
		dec := start(t, "decode-auth", "decode", "--model", dir, "--prefill", pre.listen, "--secret-file", secret)
		check(t, dec, "ok")
	})
	t.Run("wrong secret", func(t *testing.T) {
		dec := start(t, "decode-wrong", "decode", "--model", dir, "--prefill", pre.listen, "--secret-file", wrong)
		check(t, dec, "fallback_error")
		fills := dec.waitRecords(t, "local prefill", 1, 5*time.Second)
		if last := fills[len(fills)-1]; last["outcome"] != "fallback_error" || !strings.Contains(last["err"], "authentication") {
			t.Fatalf("the fallback's record %v does not say authentication failed", last)
		}
	})
	t.Run("no secret against a server that requires one", func(t *testing.T) {
		dec := start(t, "decode-nosecret", "decode", "--model", dir, "--prefill", pre.listen)
		check(t, dec, "fallback_error")
	})
	t.Run("unreachable endpoint then a good one", func(t *testing.T) {
		dead := freeAddr(t)
		dec := start(t, "decode-failover", "decode", "--model", dir, "--prefill", dead+","+pre.listen, "--secret-file", secret)
		check(t, dec, "ok")
	})
	t.Run("all endpoints unreachable", func(t *testing.T) {
		dec := start(t, "decode-dead", "decode", "--model", dir, "--prefill", freeAddr(t), "--secret-file", secret)
		check(t, dec, "fallback_error")
	})
	t.Run("byte flipped by a proxy", func(t *testing.T) {
		px := newProxy(t, pre.listen)
		px.flipAt = 20000 // inside the first chunk frames, past handshake and header
		dec := start(t, "decode-flip", "decode", "--model", dir, "--prefill", px.addr(), "--secret-file", secret)
		check(t, dec, "fallback_corrupt")
		if px.flipped.Load() == 0 {
			t.Fatal("the proxy flipped nothing")
		}
	})
	t.Run("prefill busy", func(t *testing.T) {
		dec := start(t, "decode-busy", "decode", "--model", dir, "--prefill", pre.listen, "--secret-file", secret)
		// Occupy the single slot (queue: none) with a long request from a
		// client that stops reading after the header, so the producer
		// stalls on the full send queue and holds the slot.
		sink := &blockingSink{began: make(chan struct{}), release: make(chan struct{})}
		cl := kvwire.NewClient(kvwire.ClientConfig{Secret: []byte("correct horse battery staple")})
		done := make(chan error, 1)
		hogCtx, cancelHog := context.WithCancel(context.Background())
		defer cancelHog()
		go func() {
			toks := make([]int32, 4000)
			for i := range toks {
				toks[i] = int32(i % 300)
			}
			_, err := cl.Fetch(hogCtx, pre.listen, &kvwire.Request{ID: "hog", Model: "m", Tokens: toks, StartPos: 0}, nil, sink)
			done <- err
		}()
		select {
		case <-sink.began:
		case err := <-done:
			t.Fatalf("hog fetch ended early: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("hog fetch never began")
		}
		check(t, dec, "fallback_busy")
		// Hang up: the prefill runner stops within one chunk and frees its
		// slot for the next request.
		cancelHog()
		close(sink.release)
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("hog fetch: %v, want context.Canceled", err)
		}
		// The prefill runner frees the slot when the hog's handler returns,
		// a moment after the client has gone: wait for its own gauge to say
		// it is idle, so the next request does not race the release.
		testutil.Eventually(t, func() bool { return pre.metricPrefix(t, "exo_requests_running") == 0 }, 30*time.Second,
			"the prefill runner never released the hog's slot")
		check(t, start(t, "decode-after-busy", "decode", "--model", dir, "--prefill", pre.listen, "--secret-file", secret), "ok")
	})
	t.Run("fingerprint mismatch", func(t *testing.T) {
		other := start(t, "prefill-other", "prefill", "--model", tinyModel(t, "other"))
		dec := start(t, "decode-mismatch", "decode", "--model", dir, "--prefill", other.listen)
		check(t, dec, "fallback_mismatch")
	})
	t.Run("prefill killed mid-stream", func(t *testing.T) {
		victim := start(t, "prefill-victim", "prefill", "--model", dir, "--prefill-chunk", "32", "--prefix-cache-mib", "0")
		px := newProxy(t, victim.listen)
		px.trigger = 8000
		px.onTrig = victim.kill
		dec := start(t, "decode-victim", "decode", "--model", dir, "--prefill", px.addr())
		check(t, dec, "fallback_error")
		select {
		case <-victim.done:
		default:
			t.Fatal("the prefill runner was not killed")
		}
	})
}

func TestTinyAPI(t *testing.T) {
	dir := tinyModel(t, "main")
	dec := start(t, "decode", "decode", "--model", dir)
	base := "http://" + dec.listen
	cases := []struct {
		name, path, body string
		status           int
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user"`, 400},
		{"unknown model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404},
		{"missing messages", "/v1/chat/completions", `{"model":"m"}`, 400},
		{"negative max_tokens", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-1}`, 400},
		{"bad temperature", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":9}`, 400},
		{"token id outside vocabulary", "/v1/completions", `{"model":"m","prompt":[1,2,999999]}`, 400},
		{"prompt over the context", "/v1/completions", `{"model":"m","prompt":[` + strings.Repeat("5,", 5000) + `5]}`, 400},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := http.Post(base+c.path, "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := jsonDecode(resp, &eb); err != nil {
				t.Fatalf("body is not an OpenAI error: %v", err)
			}
			if resp.StatusCode != c.status || eb.Error.Message == "" || eb.Error.Type == "" {
				t.Fatalf("status %d (want %d), error %+v", resp.StatusCode, c.status, eb.Error)
			}
		})
	}
	t.Run("models", func(t *testing.T) {
		resp, err := http.Get(base + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ml struct {
			Data []struct{ ID string } `json:"data"`
		}
		if err := jsonDecode(resp, &ml); err != nil || len(ml.Data) != 1 || ml.Data[0].ID != "m" {
			t.Fatalf("models: %v %+v", err, ml)
		}
	})
	t.Run("non-streaming completion with token ids", func(t *testing.T) {
		resp, err := http.Post(base+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"m","prompt":[10,20,30,40],"max_tokens":5,"temperature":0,"ignore_eos":true}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var cr struct {
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens, CompletionTokens int
			} `json:"usage"`
		}
		if err := jsonDecode(resp, &cr); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, err)
		}
		if len(cr.Choices) != 1 || cr.Choices[0].FinishReason != "length" {
			t.Fatalf("%+v", cr)
		}
	})
	t.Run("32 concurrent streaming clients", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := goChat(dec.listen, user(words(1000+i, 8)), 8, nil)
				if r.Status != 200 || !r.Done || r.ErrorBody != "" || r.Completion == 0 && r.Finish != "stop" {
					errs <- fmt.Errorf("client %d: %+v", i, r)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if v := dec.metric(t, `exo_requests_total{code="200",model="m"}`); v < 32 {
			t.Fatalf("exo_requests_total{code=200} = %v", v)
		}
	})
	t.Run("stop sequence", func(t *testing.T) {
		m := user("tell me a story")
		full := chatStream(t, dec.listen, m, 40, ignoreEOS)
		if full.Status != 200 || len(full.Text) < 12 {
			t.Fatalf("%+v", full)
		}
		// Stop at a piece from the middle of the greedy text: the answer is
		// the text before its first occurrence, finish_reason "stop".
		rs := []rune(full.Text)
		stop := string(rs[len(rs)/2 : len(rs)/2+3])
		want := full.Text[:strings.Index(full.Text, stop)]
		r := chatStream(t, dec.listen, m, 40, map[string]any{"ignore_eos": true, "stop": []string{stop}})
		if r.Status != 200 || r.Text != want || r.Finish != "stop" {
			t.Fatalf("stop %q: got %q (%s), want %q", stop, r.Text, r.Finish, want)
		}
	})
	t.Run("client disconnect cancels generation", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"go on"}],"stream":true,"max_tokens":3000,"ignore_eos":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
		testutil.Eventually(t, func() bool { return dec.metric(t, `exo_requests_total{code="499",model="m"}`) >= 1 }, 30*time.Second,
			"the cancelled request was never counted as 499")
		// The runner is free again: a new request completes.
		r := chatStream(t, dec.listen, user("hello"), 4, nil)
		if r.Status != 200 || !r.Done {
			t.Fatalf("after cancel: %+v", r)
		}
	})
}

func jsonDecode(resp *http.Response, v any) error {
	if resp.Header.Get("Content-Type") != "application/json" {
		return errors.New("content-type " + resp.Header.Get("Content-Type"))
	}
	return jsonNewDecoder(resp).Decode(v)
}

// TestTinyMixedDTypes pairs an f32 prefill runner with a decode runner of the
// same model in bf16 (as a Spark with bf16 weights pairs with a Mac): the
// fingerprints match, the decode side asks for bf16 on the wire and the
// prefill side converts.
func TestTinyMixedDTypes(t *testing.T) {
	pre := start(t, "prefill-f32", "prefill", "--model", tinyModel(t, "main"))
	dec := start(t, "decode-bf16", "decode", "--model", tinyModel(t, "bf16"), "--prefill", pre.listen)
	r := chatStream(t, dec.listen, user(words(77, 200)), 8, ignoreEOS)
	if r.Status != 200 || !r.Done || r.Completion != 8 {
		t.Fatalf("%+v", r)
	}
	if out := dec.outcomeSoon("ok"); out != "ok" {
		t.Fatalf("outcome %q", out)
	}
	served := pre.waitRecords(t, "prefill served", 1, 5*time.Second)
	if dt := served[len(served)-1]["wire_dtype"]; dt != "bf16" {
		t.Fatalf("the prefill runner sent %q, want bf16:\n%s", dt, tail(pre.logs(), 2000))
	}
}

// TestTinyQueueFull fills a decode runner's queue (one running, one
// waiting with --max-queue 1) and expects the next request to get 429 with
// an OpenAI error body at once.
func TestTinyQueueFull(t *testing.T) {
	dec := start(t, "decode-q1", "decode", "--model", tinyModel(t, "main"), "--max-queue", "1", "--max-batch", "1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := `{"model":"m","messages":[{"role":"user","content":"go"}],"stream":true,"max_tokens":3900,"ignore_eos":true}`
	for range 2 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+dec.listen+"/v1/chat/completions", strings.NewReader(long))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	var h struct{ Waiting, Running int }
	if !testutil.Until(30*time.Second, func() bool {
		resp, err := http.Get("http://" + dec.listen + "/health")
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		return h.Waiting == 1 && h.Running == 1
	}) {
		t.Fatalf("queue never filled: %+v", h)
	}
	r := chatStream(t, dec.listen, user("one more"), 4, nil)
	if r.Status != http.StatusTooManyRequests || !strings.Contains(r.ErrorBody, `"code":"queue_full"`) {
		t.Fatalf("got %d %s, want 429 queue_full", r.Status, r.ErrorBody)
	}
	if v := dec.metric(t, `exo_requests_total{code="429",model="m"}`); v != 1 {
		t.Fatalf("429s counted: %v", v)
	}
}

// TestTinyBatchedEqualsAlone: generations decoded together (continuous
// batching, --max-batch 4) give exactly the text each gives alone, and the
// runner did batch them.
func TestTinyBatchedEqualsAlone(t *testing.T) {
	dec := start(t, "decode-batch", "decode", "--model", tinyModel(t, "main"), "--max-batch", "4")
	const n = 4
	prompts := make([][]msg, n)
	alone := make([]chatResult, n)
	for i := range prompts {
		prompts[i] = user(words(2000+i, 6+3*i))
		alone[i] = chatStream(t, dec.listen, prompts[i], 48, ignoreEOS)
		if alone[i].Status != 200 || !alone[i].Done {
			t.Fatalf("prompt %d alone: %+v", i, alone[i])
		}
	}
	solo := dec.metric(t, "exo_decode_batch_sequences_sum")
	var wg sync.WaitGroup
	together := make([]chatResult, n)
	for i := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			together[i] = goChat(dec.listen, prompts[i], 48, ignoreEOS)
		}()
	}
	wg.Wait()
	for i := range prompts {
		expectSame(t, fmt.Sprintf("prompt %d batched", i), together[i], alone[i])
	}
	steps := dec.metric(t, "exo_decode_batch_sequences_count")
	seqs := dec.metric(t, "exo_decode_batch_sequences_sum")
	// 4 × 47 decode steps ran concurrently; had none been batched, the
	// sequences per step would average exactly 1.
	if ran := seqs - solo; ran <= 0 || dec.metric(t, `exo_decode_batch_sequences_bucket{le="1"}`) >= steps {
		t.Fatalf("no batched step: %v sequences in %v steps", seqs, steps)
	}
	t.Logf("%v decode steps for %v sequence-steps in all", steps, seqs)
}

// TestTinyConcurrentRemotePrefillWhileBatching: several long prompts at once
// on a batching decode runner with a prefill runner, for a dense and a MoE
// model: remote KV is injected into one request's cache while the others
// decode in batches, and every text equals the one local prefill gives
// alone. The overlap is made, not hoped for: a long generation (the
// anchor, local prefill, its text not compared) is decoding before the
// prompts are sent and until they are answered, so each of their decode
// steps is batched with it; the runner's exo_decode_batch_sequences_max
// says that it was.
func TestTinyConcurrentRemotePrefillWhileBatching(t *testing.T) {
	for _, which := range []string{"main", "moe"} {
		t.Run(which, func(t *testing.T) {
			dir := tinyModel(t, which+"-long")
			pre := start(t, "prefill-"+which, "prefill", "--model", dir, "--prefill-chunk", "64")
			dec := start(t, "decode-batch-remote-"+which, "decode", "--model", dir, "--prefill", pre.listen, "--max-batch", "4")
			ref := start(t, "decode-ref-"+which, "decode", "--model", dir, "--max-batch", "1")
			const n = 4
			prompts := make([][]msg, n)
			want := make([]chatResult, n)
			for i := range prompts {
				prompts[i] = user(words(3000+i, 120+40*i))
				want[i] = chatStream(t, ref.listen, prompts[i], 160, ignoreEOS)
			}
			ok := dec.metric(t, outcome("ok"))
			steps0 := dec.metric(t, "exo_decode_batch_sequences_count")
			seqs0 := dec.metric(t, "exo_decode_batch_sequences_sum")

			// The anchor: a generation of up to 30000 tokens, decoding from
			// before the first prompt is sent until the last is answered
			// (it is cancelled then). Should one ever end on its own, the
			// next starts at once.
			actx, stopAnchor := context.WithCancel(context.Background())
			decoding := make(chan struct{})
			var once sync.Once
			anchorErr := make(chan error, 1)
			go func() {
				var err error
				for actx.Err() == nil && err == nil {
					var r chatResult
					r, err = chatStreamCtx(actx, dec.listen, user("anchor"), 30000, ignoreEOS, func(string) { once.Do(func() { close(decoding) }) })
					if err == nil && actx.Err() == nil && (r.Status != 200 || r.ErrorBody != "") {
						err = fmt.Errorf("anchor: %+v", r)
					}
				}
				anchorErr <- err
			}()
			select {
			case <-decoding:
			case err := <-anchorErr:
				t.Fatalf("the anchor generation ended before it decoded: %v", err)
			}

			got := make([]chatResult, n)
			var wg sync.WaitGroup
			for i := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i] = goChat(dec.listen, prompts[i], 160, ignoreEOS)
				}()
			}
			wg.Wait()
			stopAnchor()
			if err := <-anchorErr; err != nil {
				t.Fatal(err)
			}
			for i := range prompts {
				expectSame(t, fmt.Sprintf("prompt %d", i), got[i], want[i])
			}
			if d := dec.metric(t, outcome("ok")) - ok; d != n {
				t.Fatalf("%v of %d prompts prefilled remotely; last outcome %q", d, n, dec.lastOutcome())
			}
			// Generations decoded together: some steps held more than one.
			steps := dec.metric(t, "exo_decode_batch_sequences_count") - steps0
			seqs := dec.metric(t, "exo_decode_batch_sequences_sum") - seqs0
			most := dec.metric(t, "exo_decode_batch_sequences_max")
			if seqs <= steps || most < 2 {
				t.Fatalf("%v sequence-steps in %v steps, at most %v in one: the requests never decoded together", seqs, steps, most)
			}
			t.Logf("%v sequence-steps in %v steps, at most %v in one", seqs, steps, most)
		})
	}
}

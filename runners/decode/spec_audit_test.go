package decode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// TestSpeculationOffOnEveryAPI: x_exo_speculative: false turns speculative
// decoding off on every generating API (chat, completions, responses,
// anthropic messages): the request drafts nothing (its journal record
// verified no drafted token), while the same request without the field
// verifies drafts; x_exo_speculative: true is the default (speculates).
func TestSpeculationOffOnEveryAPI(t *testing.T) {
	s := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(_ Text, o *Options) {
		// The model drafts for itself: every request that speculates
		// verifies drafts, whatever its text.
		o.Speculative, o.SpecTokens, o.specForce, o.Draft = SpecDraft, 4, true, o.Model
	})
	const text = "one two three four, one two three four, one two three four, one two"
	msgs := []map[string]any{{"role": "user", "content": text}}
	apis := []struct {
		name, path string
		body       map[string]any
	}{
		{"chat", "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 40, "ignore_eos": true, "temperature": 0}},
		{"completions", "/v1/completions", map[string]any{"prompt": text, "max_tokens": 40, "ignore_eos": true, "temperature": 0}},
		{"responses", "/v1/responses", map[string]any{"input": text, "max_output_tokens": 40, "temperature": 0}},
		{"messages", "/v1/messages", map[string]any{"messages": msgs, "max_tokens": 40, "temperature": 0}},
	}
	for _, api := range apis {
		t.Run(api.name, func(t *testing.T) {
			for _, c := range []struct {
				field any // nil: absent
				spec  bool
			}{{nil, true}, {false, false}, {true, true}} {
				body := map[string]any{"model": "m"}
				for k, v := range api.body {
					body[k] = v
				}
				if c.field != nil {
					body["x_exo_speculative"] = c.field
				}
				before := len(s.srv.journal.since(0))
				b, _ := json.Marshal(body)
				resp, err := http.Post(s.url+api.path, "application/json", bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("x_exo_speculative %v: status %d: %s", c.field, resp.StatusCode, raw)
				}
				recs := s.srv.journal.since(0)
				if len(recs) != before+1 {
					t.Fatalf("x_exo_speculative %v: %d journal records, want %d", c.field, len(recs), before+1)
				}
				r := recs[len(recs)-1]
				if verified := r.SpecAccepted + r.SpecRejected; (verified > 0) != c.spec {
					t.Fatalf("x_exo_speculative %v: %d drafted tokens verified, want speculation %v", c.field, verified, c.spec)
				}
			}
		})
	}
}

// TestSpeculativeRemoteEveryFamily: on every architecture family of the
// tiny models (sliding windows and Gated DeltaNet states arriving over the
// KV wire included), a prompt prefilled by a real prefill runner (loopback
// TCP) and then decoded speculatively — prompt lookup, and a draft model
// that prefills the prompt locally — answers every request kind as plain
// decoding after local prefill does; every request went remote and drafts
// were verified on each runner.
func TestSpeculativeRemoteEveryFamily(t *testing.T) {
	names := []string{"greedy", "seeded", "grammar", "tool call", "penalties", "stop"}
	for _, fam := range specFamilies() {
		t.Run(fam.name, func(t *testing.T) {
			dir, draftDir := fam.dir(t), fam.draft(t)
			grammar := func(text Text, o *Options) {
				g := &Grammars{Text: text}
				o.NewConstraint, o.AcceptTools = g.NewConstraint, true
			}
			plain := serveTinyDir(t, dir, grammar)
			want := map[string]string{}
			for _, n := range names {
				want[n] = answerOf(t, plain.url, specBody(n, nil))
			}
			for _, mode := range []string{SpecPromptLookup, SpecDraft} {
				s := serveTinyDir(t, dir, func(text Text, o *Options) {
					grammar(text, o)
					o.Speculative, o.SpecTokens, o.specForce = mode, 4, true
					if mode == SpecDraft {
						o.Draft = loadDraft(t, draftDir, o.Model, text)
					}
					m := o.Model.(*engine.Model)
					o.Remote, o.RemoteMinTokens = loopbackRemote(m, servePrefill(t, m, 16, nil)), 1
				})
				for _, n := range names {
					if got := answerOf(t, s.url, specBody(n, nil)); got != want[n] {
						t.Fatalf("%s, %s: remote-prefilled speculative answer\n%s\nplain\n%s", mode, n, got, want[n])
					}
				}
				verified := 0
				for _, r := range s.srv.journal.since(0) {
					if r.Route != RouteRemote {
						t.Fatalf("%s: a request was prefilled %s (%s), want remote", mode, r.Route, r.Outcome)
					}
					verified += r.SpecAccepted + r.SpecRejected
				}
				if verified == 0 {
					t.Fatalf("%s: no drafted token verified after remote prefill", mode)
				}
			}
		})
	}
}

// TestSpeculationEveryRequestKind: every request kind of specRequests
// (logprobs, penalties and bias, a stop sequence, seeded sampling, a
// grammar, a forced tool call, tools the model may call) speculates — verifies drafted tokens, and
// keeps some where drafts are not constrained — rather than falling back to plain steps, on a runner whose
// model drafts for itself, and answers as plain decoding does.
func TestSpeculationEveryRequestKind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}); err != nil {
		t.Fatal(err)
	}
	grammar := func(text Text, o *Options) {
		g := &Grammars{Text: text}
		o.NewConstraint, o.AcceptTools = g.NewConstraint, true
	}
	plain := serveTinyDir(t, dir, grammar)
	s := serveTinyDir(t, dir, func(text Text, o *Options) {
		grammar(text, o)
		o.Speculative, o.SpecTokens, o.specForce, o.Draft = SpecDraft, 4, true, o.Model
	})
	kinds := specRequests()
	kinds["tool auto"] = specBody("tool call", map[string]any{"tool_choice": "auto"})
	for name, body := range kinds {
		if name == "stop" {
			continue // it stops at its first token: TestSpeculativeStopInsideDrafts
		}
		want := answerOf(t, plain.url, body)
		before := len(s.srv.journal.since(0))
		if got := answerOf(t, s.url, body); got != want {
			t.Fatalf("%s: speculative answer\n%s\nplain\n%s", name, got, want)
		}
		recs := s.srv.journal.since(0)
		if len(recs) != before+1 {
			t.Fatalf("%s: %d journal records, want %d", name, len(recs), before+1)
		}
		// Drafts do not follow the grammar (the draft model drafts its
		// unconstrained argmax): on this random model a constrained
		// request's drafts are all rejected, but they are verified.
		r := recs[len(recs)-1]
		if constrained := name == "grammar" || name == "tool call"; r.SpecAccepted+r.SpecRejected == 0 || (!constrained && r.SpecAccepted == 0) {
			t.Fatalf("%s: %d drafted tokens accepted, %d rejected: the request did not speculate", name, r.SpecAccepted, r.SpecRejected)
		}
	}
}

// TestSpeculativeStopInsideDrafts: a stop sequence that the answer reaches
// inside a run of accepted drafted tokens (the model drafts for itself, so
// its greedy drafts are kept) — several places, one spanning two tokens —
// ends the answer where plain decoding ends it: the same text, finish
// reason, usage and logprobs, streamed and not. (specRequests' stop
// request stops at its first token, before any draft.)
func TestSpeculativeStopInsideDrafts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}); err != nil {
		t.Fatal(err)
	}
	plain := serveTinyDir(t, dir, func(Text, *Options) {})
	s := serveTinyDir(t, dir, func(_ Text, o *Options) {
		o.Speculative, o.SpecTokens, o.specForce, o.Draft = SpecDraft, 4, true, o.Model
	})
	var full struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(answerOf(t, plain.url, specBody("greedy", nil))), &full); err != nil || len(full.Choices) != 1 {
		t.Fatalf("%v: %+v", err, full)
	}
	text := full.Choices[0].Message.Content
	// Stops of three plain ASCII letters first found at about a third,
	// a half and two thirds of the answer.
	var stops []string
	for _, at := range []int{len(text) / 3, len(text) / 2, 2 * len(text) / 3} {
		for p := at; p+3 <= len(text) && true; p++ {
			st := text[p : p+3]
			if strings.Index(text, st) == p && strings.IndexFunc(st, func(r rune) bool { return r < 'a' || r > 'z' }) < 0 {
				stops = append(stops, st)
				break
			}
		}
	}
	if len(stops) < 2 {
		t.Fatalf("no stop strings found in %q", text)
	}
	t.Logf("stops %q in %q", stops, text)
	for _, st := range stops {
		body := specBody("greedy", map[string]any{"stop": []string{st}})
		want := answerOf(t, plain.url, body)
		before := len(s.srv.journal.since(0))
		if got := answerOf(t, s.url, body); got != want {
			t.Fatalf("stop %q: speculative answer\n%s\nplain\n%s", st, got, want)
		}
		if !strings.Contains(want, `"finish_reason":"stop"`) {
			t.Fatalf("stop %q: plain answer did not stop: %s", st, want)
		}
		recs := s.srv.journal.since(0)
		if r := recs[len(recs)-1]; len(recs) != before+1 || r.SpecAccepted == 0 {
			t.Fatalf("stop %q: %d records, last accepted %d drafts: the stop was not reached through drafts", st, len(recs)-before, r.SpecAccepted)
		}
		sb := specBody("greedy", map[string]any{"stop": []string{st}, "stream": true})
		gotS, gotF := streamedChat(t, s.url, sb)
		wantS, wantF := streamedChat(t, plain.url, sb)
		if gotS != wantS || gotF != wantF || wantF != "stop" || !strings.HasPrefix(text, wantS) || len(wantS) >= strings.Index(text, st)+len(st) {
			t.Fatalf("stop %q streamed: speculative %q (%s), plain %q (%s)", st, gotS, gotF, wantS, wantF)
		}
	}
}

// streamedChat posts a streamed chat request and returns its content
// deltas joined and its finish reason.
func streamedChat(t *testing.T, url string, body map[string]any) (string, string) {
	t.Helper()
	req := map[string]any{"model": "m"}
	for k, v := range body {
		req[k] = v
	}
	b, _ := json.Marshal(req)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var content strings.Builder
	finish := ""
	for _, line := range strings.Split(string(raw), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		for _, c := range ch.Choices {
			content.WriteString(c.Delta.Content)
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	return content.String(), finish
}

// lockedBuffer is a bytes.Buffer for a logger written from many
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSpeculationLoggedPerRequest: each speculating request logs one
// "speculative decoding" record naming it, with its drafted tokens
// accepted and rejected (the journal's counts) and its acceptance; a
// request with x_exo_speculative: false logs none.
func TestSpeculationLoggedPerRequest(t *testing.T) {
	logs := &lockedBuffer{}
	s := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(_ Text, o *Options) {
		o.Speculative, o.SpecTokens, o.specForce, o.Draft = SpecDraft, 4, true, o.Model
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	answerOf(t, s.url, specBody("greedy", nil))
	answerOf(t, s.url, specBody("penalties", nil))
	answerOf(t, s.url, specBody("seeded", map[string]any{"x_exo_speculative": false}))
	recs := s.srv.journal.since(0)
	if len(recs) != 3 {
		t.Fatalf("%d journal records, want 3", len(recs))
	}
	logged := map[string]testutil.Record{}
	for _, r := range testutil.Records(logs.String(), "speculative decoding") {
		if _, dup := logged[r["req"]]; dup {
			t.Fatalf("request %s logged twice", r["req"])
		}
		logged[r["req"]] = r
	}
	if len(logged) != 2 {
		t.Fatalf("%d requests logged their speculation, want 2: %v", len(logged), logged)
	}
	verified := 0
	for i, rec := range recs[:2] {
		r, ok := logged[rec.ID]
		if !ok {
			t.Fatalf("request %d (%s) logged no speculation", i, rec.ID)
		}
		acc, _ := strconv.ParseFloat(r["acceptance"], 64)
		want := 0.0
		if n := rec.SpecAccepted + rec.SpecRejected; n > 0 {
			want = float64(rec.SpecAccepted) / float64(n)
		}
		if r["accepted"] != strconv.Itoa(rec.SpecAccepted) || r["rejected"] != strconv.Itoa(rec.SpecRejected) || math.Abs(acc-want) > 1e-9 {
			t.Fatalf("request %s logged %v, journal %d accepted, %d rejected", rec.ID, r, rec.SpecAccepted, rec.SpecRejected)
		}
		verified += rec.SpecAccepted + rec.SpecRejected
	}
	if verified == 0 {
		t.Fatal("no drafted token verified: the counts logged were not exercised")
	}
	if _, ok := logged[recs[2].ID]; ok {
		t.Fatal("a request with x_exo_speculative: false logged speculation")
	}
}

// pickingTiny is a Model that claims to pick its tokens on a last stage
// (a pipeline's stage 0 looks so to the decode Server); its steps are
// never taken here.
type pickingTiny struct{ *engine.Model }

func (pickingTiny) StartPicking(context.Context, engine.KVCache, *gen.Request, chat.Start, []int32) error {
	return errors.New("not a pipeline")
}

func (pickingTiny) ForwardPick(context.Context, engine.KVCache, []int32) (Picked, error) {
	return Picked{}, errors.New("not a pipeline")
}

func (pickingTiny) ForwardBatchPick(context.Context, []engine.KVCache, []int32) ([]Picked, error) {
	return nil, errors.New("not a pipeline")
}

// TestSpeculationRefusedWithReason: a model that cannot speculate (a
// pipeline's stage 0, whose logits live on its last stage) or draft mode
// without a draft model leaves speculation off (no drafting at all) and
// logs one "speculative decoding off for this model" record naming the
// model, the mode and the reason; a model that can speculate logs none.
func TestSpeculationRefusedWithReason(t *testing.T) {
	for _, c := range []struct {
		name, mode string
		picking    bool
		reason     string // "": speculation on
	}{
		{"pipeline stage 0", SpecPromptLookup, true, "last stage"},
		{"draft mode without a draft", SpecDraft, false, "without a draft model"},
		{"prompt lookup", SpecPromptLookup, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &lockedBuffer{}
			s := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1}, func(_ Text, o *Options) {
				o.Speculative, o.SpecTokens = c.mode, 4
				o.Logger = slog.New(slog.NewTextHandler(logs, nil))
				if c.picking {
					o.Model = pickingTiny{o.Model.(*engine.Model)}
				}
			})
			recs := testutil.Records(logs.String(), "speculative decoding off for this model")
			if c.reason == "" {
				if s.srv.specMax != 4 || len(recs) != 0 {
					t.Fatalf("speculation %d, refusals logged %v: want it on", s.srv.specMax, recs)
				}
				return
			}
			if s.srv.specMax != 0 {
				t.Fatalf("speculation on (%d tokens), want it refused", s.srv.specMax)
			}
			if len(recs) != 1 || recs[0]["model"] != "m" || recs[0]["mode"] != c.mode || !strings.Contains(recs[0]["reason"], c.reason) {
				t.Fatalf("refusals logged %v, want one naming model m, mode %s and %q", recs, c.mode, c.reason)
			}
		})
	}
}

// TestSpeculativeNextTurnReusesCache: a conversation's second turn, whose
// prompt holds the first turn's speculatively decoded answer, reuses at
// least as much of the first turn's cache as after plain decoding (the
// positions its verifications kept, rejected drafts gone) and answers as
// plain decoding does, on a full, two sliding and a Gated DeltaNet model,
// with prompt lookup and a draft model. (The tiny gemma3's window of 8
// keeps too little of a 47-token prompt for either to reuse it; a Gated
// DeltaNet cache resumes only at kept positions, and its verifications'
// once pushed the end of the prompt out of them.)
func TestSpeculativeNextTurnReusesCache(t *testing.T) {
	type chatAnswer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	parse := func(t *testing.T, a string) chatAnswer {
		t.Helper()
		var c chatAnswer
		if err := json.Unmarshal([]byte(a), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("%v: %s", err, a)
		}
		return c
	}
	for _, fam := range specFamilies() {
		if fam.name != "llama" && fam.name != "gemma3" && fam.name != "mistral" && fam.name != "qwen3_next" {
			continue
		}
		t.Run(fam.name, func(t *testing.T) {
			dir, draftDir := fam.dir(t), fam.draft(t)
			plain := serveTinyDir(t, dir, func(_ Text, o *Options) { o.CacheEntries = 4 })
			turn := func(url string) (first, second chatAnswer) {
				body := specBody("greedy", map[string]any{"logprobs": nil, "top_logprobs": nil})
				first = parse(t, answerOf(t, url, body))
				msgs := append(append([]map[string]any(nil), body["messages"].([]map[string]any)...),
					map[string]any{"role": "assistant", "content": first.Choices[0].Message.Content},
					map[string]any{"role": "user", "content": "one two three four once more"})
				second = parse(t, answerOf(t, url, specBody("greedy", map[string]any{"messages": msgs, "logprobs": nil, "top_logprobs": nil})))
				return first, second
			}
			w1, w2 := turn(plain.url)
			for _, mode := range []string{SpecPromptLookup, SpecDraft} {
				s := serveTinyDir(t, dir, func(text Text, o *Options) {
					o.Speculative, o.SpecTokens, o.specForce, o.CacheEntries = mode, 4, true, 4
					if mode == SpecDraft {
						o.Draft = loadDraft(t, draftDir, o.Model, text)
					}
				})
				g1, g2 := turn(s.url)
				if g1.Choices[0].Message.Content != w1.Choices[0].Message.Content || g2.Choices[0].Message.Content != w2.Choices[0].Message.Content {
					t.Fatalf("%s: speculative turns %q, %q; plain %q, %q", mode, g1.Choices[0].Message.Content, g2.Choices[0].Message.Content,
						w1.Choices[0].Message.Content, w2.Choices[0].Message.Content)
				}
				if g2.Usage.Details.Cached < w2.Usage.Details.Cached || (fam.name != "gemma3" && g2.Usage.Details.Cached == 0) {
					t.Fatalf("%s: the second turn reused %d cached tokens, plain decoding %d", mode, g2.Usage.Details.Cached, w2.Usage.Details.Cached)
				}
				verified := 0
				for _, r := range s.srv.journal.since(0) {
					verified += r.SpecAccepted + r.SpecRejected
				}
				if verified == 0 {
					t.Fatalf("%s: no drafted token verified", mode)
				}
				t.Logf("%s: second turn cached %d tokens (plain %d)", mode, g2.Usage.Details.Cached, w2.Usage.Details.Cached)
			}
		})
	}
}

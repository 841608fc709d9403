package localrun

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/hf"
)

// smolGGUF finds the SmolLM2 GGUF the way builtin:smollm2 does
// (hf.FindSmolLM2; cmd/ cannot import runners/internal/testenv): it skips
// when the model is not installed (fails under $EXO_REQUIRE_TEST_DEPS) and
// fails when $EXO_SMOLLM2_GGUF is wrong.
func smolGGUF(t *testing.T) string {
	t.Helper()
	p, err := hf.FindSmolLM2(context.Background())
	if err != nil {
		if os.Getenv("EXO_SMOLLM2_GGUF") != "" {
			t.Fatal(err)
		}
		testutil.Missing(t, "%v", err)
	}
	return p
}

// TestRunStreamsAReply runs exo run's whole path (resolve, load, chat
// template, tokenize, prefill, greedy decode, stream) on SmolLM2.
func TestRunStreamsAReply(t *testing.T) {
	path := smolGGUF(t)
	var stdout, stderr bytes.Buffer
	zero := 0.0
	o := Options{Model: path, Backend: "cpu", MaxTokens: 16, Stats: true, Offline: true,
		Flags: gen.Defaults{Temperature: &zero}}
	if err := Run(context.Background(), o, "What is the capital of France?", &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "Paris") {
		t.Fatalf("stdout %q does not mention Paris", stdout.String())
	}
	for _, want := range []string{"prefill:", "decode:", "tokens/s", "backend cpu"} {
		if !strings.Contains(stderr.String(), want) {
			t.Fatalf("--stats output %q lacks %q", stderr.String(), want)
		}
	}
}

// TestRunChatKeepsHistory: the interactive loop answers each line with the
// whole conversation so far (the second prompt's token count includes the
// first turn) and ends at /bye.
func TestRunChatKeepsHistory(t *testing.T) {
	path := smolGGUF(t)
	zero := 0.0
	s, err := Open(context.Background(), Options{Model: path, Backend: "cpu", MaxTokens: 6, Offline: true, Stats: true,
		Flags: gen.Defaults{Temperature: &zero}}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stdout, stderr bytes.Buffer
	in := strings.NewReader("What is the capital of France?\n/help\nAnd of Italy?\n/bye\nnever read\n")
	if err := s.Chat(context.Background(), in, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var prompts, reused []int
	for _, l := range strings.Split(stderr.String(), "\n") {
		var n, keep int
		var secs, rate float64
		if _, err := fmt.Sscanf(strings.TrimPrefix(l, ">>> "), "prefill: %d tokens in %fs (%f tokens/s; %d more", &n, &secs, &rate, &keep); err == nil {
			prompts, reused = append(prompts, n+keep), append(reused, keep)
		}
	}
	// the second prompt holds the first turn (and its reply), whose KV is reused
	if len(prompts) != 2 || prompts[1] <= prompts[0]+5 || reused[0] != 0 || reused[1] < prompts[0] {
		t.Fatalf("prompt sizes %v, reused %v: the second turn does not carry the first\n%s", prompts, reused, stderr.String())
	}
	if !strings.Contains(stderr.String(), "unknown command /help") || strings.Count(stdout.String(), "\n") != 2 {
		t.Fatalf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

// TestRunReusedKVGivesTheSameReply: a second turn that reuses the first
// turn's KV answers exactly as a fresh session computing it all.
func TestRunReusedKVGivesTheSameReply(t *testing.T) {
	path := smolGGUF(t)
	zero := 0.0
	o := Options{Model: path, Backend: "cpu", MaxTokens: 10, Offline: true, Flags: gen.Defaults{Temperature: &zero}}
	ctx := context.Background()
	s, err := Open(ctx, o, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u1 := chat.Message{Role: "user", Content: "What is the capital of France?"}
	r1, err := s.Reply(ctx, []chat.Message{u1}, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	conv := []chat.Message{u1, {Role: "assistant", Content: r1.Content}, {Role: "user", Content: "And of Italy?"}}
	reused, err := s.Reply(ctx, conv, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := Open(ctx, o, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	want, err := fresh.Reply(ctx, conv, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if reused.Content != want.Content || reused.Content == "" || reused.Result.CachedTokens == 0 {
		t.Fatalf("with reused KV %+v, fresh %+v", reused, want)
	}
}

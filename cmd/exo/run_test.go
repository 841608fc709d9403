package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// smolGGUF finds the SmolLM2 GGUF the way builtin:smollm2 does
// (hf.FindSmolLM2; cmd/ cannot import runners/internal/testenv): it skips
// when the model is not installed and fails when $EXO_SMOLLM2_GGUF is wrong.
func smolGGUF(t *testing.T) string {
	t.Helper()
	p, err := hf.FindSmolLM2(context.Background())
	if err != nil {
		if os.Getenv("EXO_SMOLLM2_GGUF") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return p
}

// TestRunStreamsAReply runs exo run's whole path (resolve, load, chat
// template, tokenize, prefill, greedy decode, stream) on SmolLM2.
func TestRunStreamsAReply(t *testing.T) {
	path := smolGGUF(t)
	var stdout, stderr bytes.Buffer
	zero := 0.0
	o := runOptions{model: path, backend: "cpu", maxTokens: 16, stats: true, offline: true,
		flags: openai.Defaults{Temperature: &zero}}
	if err := run(context.Background(), o, "What is the capital of France?", &stdout, &stderr); err != nil {
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

func TestRunUsageErrors(t *testing.T) {
	if err := cmdRun(context.Background(), []string{"--max-tokens", "0", "hi"}); err == nil {
		t.Fatal("--max-tokens 0 accepted")
	}
	if err := cmdRun(context.Background(), []string{"--model", "x"}); err == nil {
		t.Fatal("no prompt accepted")
	}
	o := runOptions{model: filepath.Join(t.TempDir(), "missing.gguf"), backend: "cpu", maxTokens: 1, offline: true}
	if err := run(context.Background(), o, "hi", &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("a missing model path succeeded")
	}
}

// TestRunChatKeepsHistory: the interactive loop answers each line with the
// whole conversation so far (the second prompt's token count includes the
// first turn) and ends at /bye.
func TestRunChatKeepsHistory(t *testing.T) {
	path := smolGGUF(t)
	zero := 0.0
	s, err := openSession(context.Background(), runOptions{model: path, backend: "cpu", maxTokens: 6, offline: true, stats: true,
		flags: openai.Defaults{Temperature: &zero}}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	var stdout, stderr bytes.Buffer
	in := strings.NewReader("What is the capital of France?\n/help\nAnd of Italy?\n/bye\nnever read\n")
	if err := s.chat(context.Background(), in, &stdout, &stderr); err != nil {
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

// TestRunServedName: --model accepts a served name of the cluster file
// (the embedded default's smollm2-135m is builtin:smollm2) and takes its
// [models.defaults].
func TestRunServedName(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c.toml")
	os.WriteFile(f, []byte("[hosts.h]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\n[[models]]\nname = \"tiny\"\nsource = \"/models/tiny\"\ndecode = { hosts = [\"h\"] }\n[models.defaults]\ntemperature = 0.25\n"), 0o644)
	o := runOptions{model: "tiny", configPath: f}
	if err := o.resolveServedName(); err != nil || o.model != "/models/tiny" || o.cluster.Temperature == nil || *o.cluster.Temperature != 0.25 {
		t.Fatalf("%v %+v", err, o)
	}
	o = runOptions{model: "other/model", configPath: f}
	if err := o.resolveServedName(); err != nil || o.model != "other/model" {
		t.Fatalf("%v %+v", err, o)
	}
}

// TestRunReusedKVGivesTheSameReply: a second turn that reuses the first
// turn's KV answers exactly as a fresh session computing it all.
func TestRunReusedKVGivesTheSameReply(t *testing.T) {
	path := smolGGUF(t)
	zero := 0.0
	o := runOptions{model: path, backend: "cpu", maxTokens: 10, offline: true, flags: openai.Defaults{Temperature: &zero}}
	ctx := context.Background()
	s, err := openSession(ctx, o, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	u1 := chat.Message{Role: "user", Content: "What is the capital of France?"}
	a1, err := s.reply(ctx, []chat.Message{u1}, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	conv := []chat.Message{u1, {Role: "assistant", Content: a1}, {Role: "user", Content: "And of Italy?"}}
	reused, err := s.reply(ctx, conv, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := openSession(ctx, o, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.close()
	want, err := fresh.reply(ctx, conv, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if reused != want || reused == "" {
		t.Fatalf("with reused KV %q, fresh %q", reused, want)
	}
}

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/sample"
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
	o := runOptions{model: path, backend: "cpu", maxTokens: 16, stats: true, offline: true,
		params: sample.Params{TopP: 1, RepetitionPenalty: 1}}
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

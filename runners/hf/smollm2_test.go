package hf

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestFindSmolLM2Env(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, smollm2File)
	if err := os.WriteFile(p, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("EXO_SMOLLM2_GGUF", p)
	got, err := FindSmolLM2(context.Background())
	if err != nil || got != p {
		t.Fatalf("FindSmolLM2 = %q, %v; want %q", got, err, p)
	}
	t.Setenv("EXO_SMOLLM2_GGUF", filepath.Join(dir, "missing.gguf"))
	if got, err := FindSmolLM2(context.Background()); err == nil {
		t.Fatalf("missing $EXO_SMOLLM2_GGUF file accepted: %q", got)
	}
}

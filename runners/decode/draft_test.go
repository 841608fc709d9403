package decode

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// otherToken is a Text whose token id has other bytes.
type otherToken struct {
	Text
	id int32
}

func (o otherToken) TokenBytes(id int32) []byte {
	if id == o.id {
		return []byte("something else")
	}
	return o.Text.TokenBytes(id)
}

// TestDraftTokenizerRefused: a draft whose tokenizer differs from the
// model's (another vocabulary size, one token's bytes, the end tokens) is
// refused naming the difference, by CheckDraftText and by LoadDraft,
// which loads a matching one.
func TestDraftTokenizerRefused(t *testing.T) {
	text := func(spec testmodel.Spec) (Text, string) {
		dir := filepath.Join(t.TempDir(), "m")
		if err := testmodel.Write(dir, spec); err != nil {
			t.Fatal(err)
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return NewText(tok, nil), dir
	}
	target, _ := text(testmodel.Spec{Arch: "llama", Seed: 7})
	same, sameDir := text(testmodel.Spec{Arch: "qwen3", Seed: 3, Layers: 1})
	small, smallDir := text(testmodel.Spec{Arch: "llama", Seed: 7, Vocab: 300})
	if err := CheckDraftText(target, same); err != nil {
		t.Fatalf("same tokenizer refused: %v", err)
	}
	for _, c := range []struct {
		draft Text
		want  string
	}{
		{small, "draft model's tokenizer has 300 tokens, the model's 512"},
		{otherToken{same, 100}, "draft model's tokenizer differs at token 100"},
	} {
		if err := CheckDraftText(target, c.draft); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckDraftText: %v, want %q", err, c.want)
		}
	}
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDraft(context.Background(), smallDir, b, target); err == nil || !strings.Contains(err.Error(), "300 tokens") {
		t.Errorf("LoadDraft of another tokenizer: %v", err)
	}
	m, err := LoadDraft(context.Background(), sameDir, b, target)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
}

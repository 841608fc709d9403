package testmodel

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// TestWriteHarmony: the harmony control tokens take the last merges' ids
// (gone from the vocabulary and the merges), are special added tokens in
// tokenizer.json and tokenizer_config.json, the template is the one given,
// and <|return|> and <|call|> end generation; another architecture is
// refused.
func TestWriteHarmony(t *testing.T) {
	dir := t.TempDir()
	if err := WriteHarmony(dir, Spec{Arch: "gptoss", Seed: 1, Layers: 1}, []byte("TEMPLATE")); err != nil {
		t.Fatal(err)
	}
	read := func(name string, v any) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	var tj struct {
		AddedTokens []struct {
			ID      int
			Content string
			Special bool
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int
			Merges []string
		}
	}
	read("tokenizer.json", &tj)
	if len(tj.Model.Vocab) != DefaultVocab-3-len(HarmonyTokens) || len(tj.Model.Merges) != DefaultVocab-259-len(HarmonyTokens) {
		t.Fatalf("%d tokens, %d merges after the harmony tokens took theirs", len(tj.Model.Vocab), len(tj.Model.Merges))
	}
	ids := map[string]int{}
	for _, a := range tj.AddedTokens {
		if slices.Contains(HarmonyTokens, a.Content) {
			if !a.Special {
				t.Errorf("%s is not special", a.Content)
			}
			ids[a.Content] = a.ID
		}
	}
	first := DefaultVocab - 3 - len(HarmonyTokens)
	for i, h := range HarmonyTokens {
		if ids[h] != first+i {
			t.Errorf("%s: id %d, want %d", h, ids[h], first+i)
		}
	}
	for s, id := range tj.Model.Vocab {
		if id >= first && id < first+len(HarmonyTokens) {
			t.Errorf("vocabulary keeps %q at a harmony id %d", s, id)
		}
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
		EOS          string `json:"eos_token"`
		Decoder      map[string]struct {
			Content string
			Special bool
		} `json:"added_tokens_decoder"`
	}
	read("tokenizer_config.json", &cfg)
	if cfg.ChatTemplate != "TEMPLATE" || cfg.EOS != "<|return|>" {
		t.Errorf("template %q, eos_token %q", cfg.ChatTemplate, cfg.EOS)
	}
	for _, h := range HarmonyTokens {
		if d := cfg.Decoder[strconv.Itoa(ids[h])]; d.Content != h || !d.Special {
			t.Errorf("added_tokens_decoder[%d] = %+v, want %s, special", ids[h], d, h)
		}
	}
	var gen struct {
		EOS []int `json:"eos_token_id"`
	}
	read("generation_config.json", &gen)
	if !slices.Equal(gen.EOS, []int{ids["<|return|>"], ids["<|call|>"]}) {
		t.Errorf("eos_token_id %v, want <|return|> and <|call|> (%d, %d)", gen.EOS, ids["<|return|>"], ids["<|call|>"])
	}
	if err := WriteHarmony(t.TempDir(), Spec{Arch: "llama"}, nil); err == nil {
		t.Error("a harmony llama was written")
	}
}

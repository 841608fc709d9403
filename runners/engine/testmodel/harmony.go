package testmodel

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// HarmonyTokens are the o200k_harmony control tokens WriteHarmony gives
// the tiny model's tokenizer.
var HarmonyTokens = []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}

// WriteHarmony writes the tiny model of s (Arch "gptoss") to dir and turns
// its tokenizer into a harmony one: its last len(HarmonyTokens) merges
// (the last learned, which no other merge builds on) give their ids to
// harmony's control tokens (special, as in o200k_harmony), the chat
// template is chatTemplate (gpt-oss's own, from the caller's testdata),
// and the end tokens are <|return|> and <|call|> (as gpt-oss's
// generation_config says).
func WriteHarmony(dir string, s Spec, chatTemplate []byte) error {
	if s.Arch != "gptoss" {
		return fmt.Errorf("testmodel: a harmony tokenizer is gpt-oss's, not %q's", s.Arch)
	}
	if err := Write(dir, s); err != nil {
		return err
	}
	var tj map[string]any
	if err := readJSON(filepath.Join(dir, "tokenizer.json"), &tj); err != nil {
		return err
	}
	model := tj["model"].(map[string]any)
	vocab := model["vocab"].(map[string]any)
	merges := model["merges"].([]any)
	byID := map[int]string{}
	for s, id := range vocab {
		byID[int(id.(float64))] = s
	}
	first := len(vocab) - len(HarmonyTokens) // ids of the last merges
	added := tj["added_tokens"].([]any)
	ids := map[string]int{}
	for i, h := range HarmonyTokens {
		id := first + i
		delete(vocab, byID[id])
		added = append(added, map[string]any{"id": id, "content": h, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
		ids[h] = id
	}
	model["merges"] = merges[:len(merges)-len(HarmonyTokens)]
	tj["added_tokens"] = added
	if err := writeJSON(filepath.Join(dir, "tokenizer.json"), tj); err != nil {
		return err
	}

	var cfg map[string]any
	if err := readJSON(filepath.Join(dir, "tokenizer_config.json"), &cfg); err != nil {
		return err
	}
	cfg["chat_template"] = string(chatTemplate)
	cfg["eos_token"] = "<|return|>"
	dec := cfg["added_tokens_decoder"].(map[string]any)
	for h, id := range ids {
		dec[strconv.Itoa(id)] = map[string]any{"content": h, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}
	}
	if err := writeJSON(filepath.Join(dir, "tokenizer_config.json"), cfg); err != nil {
		return err
	}
	var gen map[string]any
	if err := readJSON(filepath.Join(dir, "generation_config.json"), &gen); err != nil {
		return err
	}
	gen["eos_token_id"] = []int{ids["<|return|>"], ids["<|call|>"]}
	return writeJSON(filepath.Join(dir, "generation_config.json"), gen)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("testmodel: %s: %w", path, err)
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

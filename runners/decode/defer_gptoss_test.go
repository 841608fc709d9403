package decode

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// harmonyControls are the o200k_harmony control tokens the tiny gpt-oss
// gets in place of its last learned merges.
var harmonyTokens = []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}

// writeHarmonyGptOss writes the tiny random gpt-oss model and turns its
// tokenizer into a harmony one: its last len(harmonyTokens) merges (the
// last learned, which no other merge builds on) give their ids to
// harmony's control tokens (special, as in o200k_harmony), the chat
// template is gpt-oss's own, and the end tokens are <|return|> and
// <|call|> (as its generation_config says).
func writeHarmonyGptOss(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "gptoss")
	spec := testmodel.Spec{Arch: "gptoss", Seed: 11, Layers: 2, MaxPositions: 4096}
	if err := testmodel.Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	var tj map[string]any
	readJSON(t, filepath.Join(dir, "tokenizer.json"), &tj)
	model := tj["model"].(map[string]any)
	vocab := model["vocab"].(map[string]any)
	merges := model["merges"].([]any)
	byID := map[int]string{}
	for s, id := range vocab {
		byID[int(id.(float64))] = s
	}
	first := len(vocab) - len(harmonyTokens) // ids of the last merges
	added := tj["added_tokens"].([]any)
	ids := map[string]int{}
	for i, h := range harmonyTokens {
		id := first + i
		delete(vocab, byID[id])
		added = append(added, map[string]any{"id": id, "content": h, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
		ids[h] = id
	}
	model["merges"] = merges[:len(merges)-len(harmonyTokens)]
	tj["added_tokens"] = added
	writeJSON(t, filepath.Join(dir, "tokenizer.json"), tj)

	tmpl, err := os.ReadFile("../chat/testdata/gptoss_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	readJSON(t, filepath.Join(dir, "tokenizer_config.json"), &cfg)
	cfg["chat_template"] = string(tmpl)
	cfg["eos_token"] = "<|return|>"
	dec := cfg["added_tokens_decoder"].(map[string]any)
	for h, id := range ids {
		dec[strconvI(id)] = map[string]any{"content": h, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}
	}
	writeJSON(t, filepath.Join(dir, "tokenizer_config.json"), cfg)
	var gen map[string]any
	readJSON(t, filepath.Join(dir, "generation_config.json"), &gen)
	gen["eos_token_id"] = []int{ids["<|return|>"], ids["<|call|>"]}
	writeJSON(t, filepath.Join(dir, "generation_config.json"), gen)
	return dir
}

func strconvI(i int) string { b, _ := json.Marshal(i); return string(b) }

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTinyGptOssConstrained runs the tiny random-weight gpt-oss (sliding
// and full layers, sinks, experts) with a harmony tokenizer and gpt-oss's
// chat template through a decode Server on the cpu backend, at temperature
// 1 over several seeds: whatever garbage it reasons, response_format
// json_schema returns a schema-valid content and tool_choice "required" a
// call of the offered tool with schema-valid arguments, once
// max_reasoning_tokens has closed the analysis (or the model closed it);
// a stream (same seed) joins to the same message.
func TestTinyGptOssConstrained(t *testing.T) {
	dir := writeHarmonyGptOss(t)
	s := serveTinyDir(t, dir, func(text Text, o *Options) {
		g := &Grammars{Text: text}
		o.NewConstraint, o.AcceptTools = g.NewConstraint, true
	})
	if got := s.tok.Decode(s.tok.Encode("<|start|>assistant<|channel|>final<|message|>")); got != "<|start|>assistant<|channel|>final<|message|>" {
		t.Fatalf("harmony tokens do not round-trip: %q", got)
	}
	if ids := s.tok.Encode("<|channel|>"); len(ids) != 1 || !s.tok.IsSpecial(ids[0]) {
		t.Fatalf("<|channel|> is %v, want one control token", ids)
	}
	point := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p", "schema": json.RawMessage(pointSchema)}}
	for seed := range 3 {
		for _, c := range []struct {
			body   map[string]any
			schema string // the content's ("": a call's arguments, get_weather's)
		}{
			{map[string]any{"response_format": point}, pointSchema},
			{map[string]any{"tools": []any{cityTool}, "tool_choice": "required"}, ""},
		} {
			body := func() map[string]any {
				b := map[string]any{"max_tokens": 300, "temperature": 1, "seed": seed, "max_reasoning_tokens": 8}
				for k, v := range c.body {
					b[k] = v
				}
				return b
			}
			got, raw := chatWhole(t, s.url, body())
			t.Logf("seed %d: %+v", seed, got)
			if c.schema != "" {
				if got.finish != "stop" || got.calls != nil {
					t.Fatalf("seed %d: %+v\n%s", seed, got, raw)
				}
				validate(t, validator(t, c.schema), got.content)
			} else {
				if got.finish != "tool_calls" || len(got.calls) != 1 || got.calls[0].Name != "get_weather" || got.content != "<nil>" {
					t.Fatalf("seed %d: %+v\n%s", seed, got, raw)
				}
				validate(t, validator(t, toolSchemas["get_weather"]), got.calls[0].Args)
			}
			// (the cap itself is counted exactly in TestHarmonyConstrainedAnswers;
			// garbage text does not re-tokenize to the tokens it came from)
			want := got
			want.content, want.reasoning = strings.TrimPrefix(want.content, "<nil>"), strings.TrimPrefix(want.reasoning, "<nil>")
			if st, raw := chatStream(t, s.url, body()); !reflect.DeepEqual(st, want) {
				t.Errorf("seed %d stream: %+v\nwant %+v\n%s", seed, st, want, raw)
			}
		}
	}
}

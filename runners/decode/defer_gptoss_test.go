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

// writeHarmonyGptOss writes the tiny random gpt-oss model with a harmony
// tokenizer and gpt-oss's own chat template (testmodel.WriteHarmony).
func writeHarmonyGptOss(t *testing.T) string {
	t.Helper()
	tmpl, err := os.ReadFile("../chat/testdata/gptoss_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "gptoss")
	if err := testmodel.WriteHarmony(dir, testmodel.Spec{Arch: "gptoss", Seed: 11, Layers: 2, MaxPositions: 4096}, tmpl); err != nil {
		t.Fatal(err)
	}
	return dir
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

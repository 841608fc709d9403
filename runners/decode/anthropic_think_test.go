package decode

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/gen"
)

// anthropicBlocks is the content of a Messages answer, whole or (stream)
// rebuilt from its events: each block's type and its text or thinking.
func anthropicBlocks(t *testing.T, raw []byte, stream bool) [][2]string {
	t.Helper()
	var out [][2]string
	if !stream {
		var r struct {
			Content []struct{ Type, Text, Thinking, Signature string }
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		for _, b := range r.Content {
			if b.Type == "thinking" && !strings.HasPrefix(b.Signature, "exo-sha256:") {
				t.Errorf("thinking block without a signature: %s", raw)
			}
			out = append(out, [2]string{b.Type, b.Text + b.Thinking})
		}
		return out
	}
	signed := map[int]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type         string
			Index        int
			ContentBlock struct{ Type string } `json:"content_block"`
			Delta        struct{ Type, Text, Thinking, Signature string }
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatalf("%v: %s", err, d)
		}
		switch ev.Type {
		case "content_block_start":
			out = append(out, [2]string{ev.ContentBlock.Type, ""})
		case "content_block_delta":
			if ev.Delta.Type == "signature_delta" {
				signed[ev.Index] = ev.Delta.Signature != ""
				continue
			}
			out[ev.Index][1] += ev.Delta.Text + ev.Delta.Thinking
		}
	}
	for i, b := range out {
		if b[0] == "thinking" && !signed[i] {
			t.Errorf("streamed thinking block %d without a signature_delta: %s", i, raw)
		}
	}
	return out
}

// TestAnthropicThinking: with the real chat templates, Anthropic's
// thinking returns the reasoning the chat formats split off (gpt-oss's
// analysis channel, Qwen3's <think>) as a thinking block before the text,
// the same streamed or not; budget_tokens caps gpt-oss's reasoning and is
// refused, naming it, where the model cannot honour it (Qwen3 with a free
// answer).
func TestAnthropicThinking(t *testing.T) {
	user := []map[string]any{{"role": "user", "content": "hi"}}
	harmony := "<|channel|>analysis<|message|>Need a point.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>"
	endless := "<|channel|>analysis<|message|>" + strings.Repeat("hmm ", 40)
	for _, c := range []struct {
		name     string
		url      func(t *testing.T) string
		thinking map[string]any
		want     [][2]string
	}{
		{"gpt-oss enabled", func(t *testing.T) string { return harmonyServer(t, harmony) }, map[string]any{"type": "enabled", "budget_tokens": 100},
			[][2]string{{"thinking", "Need a point."}, {"text", "Hello!"}}},
		{"gpt-oss disabled", func(t *testing.T) string { return harmonyServer(t, harmony) }, map[string]any{"type": "disabled"},
			[][2]string{{"text", "Hello!"}}},
		{"gpt-oss budget caps the reasoning", func(t *testing.T) string { return harmonyServer(t, endless) }, map[string]any{"type": "enabled", "budget_tokens": 5},
			nil}, // the first block is "hmm h"; what follows is the model's
		{"qwen3 adaptive", func(t *testing.T) string {
			q := newQwen3Server(t, qwen3Think)
			q.aim(t, []gen.Message{{Role: "user", Content: "hi"}}, nil)
			return q.url
		}, map[string]any{"type": "adaptive"},
			[][2]string{{"thinking", "The user greets me.\nReply briefly."}, {"text", "Hello! How can I help?"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := c.url(t)
			var whole [][2]string
			for _, stream := range []bool{false, true} {
				body := map[string]any{"model": "m", "max_tokens": 300, "temperature": 0, "messages": user, "thinking": c.thinking, "stream": stream}
				code, raw := postJSON(t, url+"/v1/messages", body)
				if code != http.StatusOK {
					t.Fatalf("stream %v: %d %s", stream, code, raw)
				}
				got := anthropicBlocks(t, raw, stream)
				switch {
				case c.want != nil && !reflect.DeepEqual(got, c.want):
					t.Errorf("stream %v: %q\nwant %q\n%s", stream, got, c.want, raw)
				case c.want == nil && (len(got) == 0 || got[0] != [2]string{"thinking", "hmm h"}):
					t.Errorf("stream %v: %q, want the thinking block \"hmm h\" first\n%s", stream, got, raw)
				}
				if !stream {
					whole = got
				} else if !reflect.DeepEqual(got, whole) {
					t.Errorf("stream %q\nwhole %q", got, whole)
				}
			}
		})
	}
	t.Run("qwen3 budget refused", func(t *testing.T) {
		q := newQwen3Server(t, qwen3Think)
		q.aim(t, []gen.Message{{Role: "user", Content: "hi"}}, nil)
		body := map[string]any{"model": "m", "max_tokens": 300, "messages": user, "thinking": map[string]any{"type": "enabled", "budget_tokens": 100}}
		code, raw := postJSON(t, q.url+"/v1/messages", body)
		if code != http.StatusBadRequest || !strings.Contains(string(raw), "thinking.budget_tokens cannot be honoured on this model") ||
			!strings.Contains(string(raw), `"type":"invalid_request_error"`) {
			t.Errorf("%d %s", code, raw)
		}
	})
}

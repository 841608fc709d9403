package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// send reads a real HTTP stream through internal/sse: usage, text timing,
// a mid-stream error and a stream cut short.
func TestSend(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		err        string
		prompt     int
		completion int
		cached     int
	}{
		{"ok", `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
			`data: {"choices":[{"index":0,"delta":{"content":"b"}}]}` + "\r\n\r\n" +
			": keep-alive\n\n" +
			`data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":4}}}` + "\n\n" +
			"data: [DONE]\n\n", "", 9, 2, 4},
		{"server error", `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
			`data: {"error":{"message":"boom","type":"server_error"}}` + "\n\n", "server error mid-stream: boom", 0, 0, 0},
		{"no DONE", `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n", "without [DONE]", 0, 0, 0},
		{"cut mid-event", `data: {"choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n", "reading stream", 0, 0, 0},
		{"bad json", "data: {\n\n", "bad event", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			b := &bencher{base: srv.URL, model: "m", client: srv.Client()}
			r, err := b.send(context.Background(), "hi", 2, "remote")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.PromptTokens != tc.prompt || r.CompletionTokens != tc.completion || r.CachedTokens != tc.cached || r.Mode != "remote" {
				t.Errorf("run = %+v", r)
			}
			if r.TTFT <= 0 || r.Total < r.TTFT {
				t.Errorf("times: ttft %v total %v", r.TTFT, r.Total)
			}
		})
	}
}

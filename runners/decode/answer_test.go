package decode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// formatText is a pieceText of another chat format.
type formatText struct {
	*pieceText
	f chat.Format
}

func (t formatText) Format() chat.Format { return t.f }

// callDelta is one streamed delta.tool_calls entry.
type callDelta struct {
	Index      int
	ID, Name   string
	Args       string
	HasContent bool
}

// TestCallsStreamOverSSE: Llama 3 and Mistral calls reach an OpenAI
// client as Hermes calls do: a delta with the call's id and name as soon
// as its head is written, then its arguments in pieces as they are
// generated (one byte a token here), adding up to the call, with
// finish_reason "tool_calls".
func TestCallsStreamOverSSE(t *testing.T) {
	for _, c := range []struct {
		f     chat.Format
		gen   string
		calls [][2]string
	}{
		{chat.Llama3, `<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}`, [][2]string{{"get_weather", `{"city": "Paris"}`}}},
		{chat.Mistral, `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]`,
			[][2]string{{"get_weather", `{"city": "Paris"}`}, {"get_weather", `{"city": "Rome"}`}}},
		{chat.Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", [][2]string{{"get_weather", `{"city": "Paris"}`}}},
	} {
		p := newPieceText()
		text := formatText{p, c.f}
		srv := New(Options{Name: "m", Model: &scriptModel{script: p.encode(c.gen), eos: p.ids["<|return|>"], vocab: p.VocabSize()}, Text: text,
			NewSampler: NewSampler, NewStopMatcher: NewStopMatcher, MaxBatch: 1, CacheEntries: -1, AcceptTools: true,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		t.Cleanup(srv.Close)
		hs := httptest.NewServer(apiMux(srv))
		t.Cleanup(hs.Close)

		deltas, finish := streamDeltas(t, hs.URL, map[string]any{"model": "m", "stream": true, "temperature": 0, "tools": harmonyTools,
			"messages": []map[string]any{{"role": "user", "content": "weather?"}}})
		if finish != "tool_calls" {
			t.Errorf("%v: finish_reason %q", c.f, finish)
		}
		var calls [][2]string
		argDeltas := map[int]int{}
		for _, d := range deltas {
			if d.HasContent {
				t.Errorf("%v: content delta beside the calls: %+v", c.f, d)
			}
			if d.Index == len(calls) { // a call's first delta: id and name, no arguments yet
				if !strings.HasPrefix(d.ID, "call_") || d.Name == "" || d.Args != "" {
					t.Errorf("%v: first delta of call %d: %+v", c.f, d.Index, d)
				}
				calls = append(calls, [2]string{d.Name, ""})
				continue
			}
			if d.Index != len(calls)-1 || d.ID != "" || d.Name != "" {
				t.Errorf("%v: delta out of order: %+v", c.f, d)
				continue
			}
			calls[d.Index][1] += d.Args
			argDeltas[d.Index]++
		}
		if len(calls) != len(c.calls) {
			t.Fatalf("%v: calls %v, want %v", c.f, calls, c.calls)
		}
		for i := range calls {
			if calls[i] != c.calls[i] || argDeltas[i] < 2 {
				t.Errorf("%v: call %d %v in %d argument deltas, want %v in pieces", c.f, i, calls[i], argDeltas[i], c.calls[i])
			}
		}
	}
}

// streamDeltas posts a streamed chat request and returns its
// delta.tool_calls entries in order, and its finish reason.
func streamDeltas(t *testing.T, url string, body map[string]any) ([]callDelta, string) {
	t.Helper()
	raw, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var out []callDelta
	finish := ""
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta        openai.ResponseMessage `json:"delta"`
				FinishReason *string                `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		for _, c := range ch.Choices {
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
			if c.Delta.Content != nil && *c.Delta.Content != "" {
				out = append(out, callDelta{HasContent: true, Args: *c.Delta.Content})
			}
			for _, d := range c.Delta.ToolCalls {
				if d.Index == nil {
					t.Fatalf("delta tool call without index: %s", line)
				}
				out = append(out, callDelta{Index: *d.Index, ID: d.ID, Name: d.Function.Name, Args: d.Function.Arguments})
			}
		}
	}
	return out, finish
}

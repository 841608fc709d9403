package openai

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// SSEWriter writes server-sent events in OpenAI's form: each event is one
// `data: <json>\n\n` line, flushed at once; the stream ends with
// `data: [DONE]\n\n`.
type SSEWriter struct {
	w       io.Writer
	flusher http.Flusher
	started bool
}

// NewSSEWriter wraps w; when w is an http.ResponseWriter the headers are set
// on the first event.
func NewSSEWriter(w io.Writer) *SSEWriter {
	f, _ := w.(http.Flusher)
	return &SSEWriter{w: w, flusher: f}
}

// Start writes the SSE response headers (idempotent).
func (s *SSEWriter) Start() {
	if s.started {
		return
	}
	s.started = true
	if rw, ok := s.w.(http.ResponseWriter); ok {
		h := rw.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		h.Set("X-Accel-Buffering", "no")
		rw.WriteHeader(http.StatusOK)
	}
	s.flush()
}

// Started reports whether headers have been written.
func (s *SSEWriter) Started() bool { return s.started }

// Event writes v as one data event.
func (s *SSEWriter) Event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("sse: marshal: %w", err)
	}
	return s.raw(b)
}

// NamedEvent writes v as one event with an event name (`event: name`
// then `data: {json}`), the form of Anthropic's and the Responses API's
// streams.
func (s *SSEWriter) NamedEvent(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("sse: marshal: %w", err)
	}
	s.Start()
	buf := make([]byte, 0, len(b)+len(name)+16)
	buf = append(buf, "event: "...)
	buf = append(buf, name...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return fmt.Errorf("sse: write: %w", err)
	}
	s.flush()
	return nil
}

// Done writes the terminating [DONE] event.
func (s *SSEWriter) Done() error { return s.raw([]byte("[DONE]")) }

func (s *SSEWriter) raw(b []byte) error {
	s.Start()
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return fmt.Errorf("sse: write: %w", err)
	}
	s.flush()
	return nil
}

func (s *SSEWriter) flush() {
	if s.flusher != nil {
		s.flusher.Flush()
	}
}

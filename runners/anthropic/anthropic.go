// Package anthropic serves Anthropic's Messages API (POST /v1/messages) as
// a thin adapter over the same generation core as the OpenAI API: a
// request is converted to an openai.ChatRequest, validated by the same
// openai.Validator (sampling defaults, assistant prefill, no silent
// ignores) and run by the same openai.Generator; the answer and the stream
// (message_start, content_block_start, ping, content_block_delta…,
// content_block_stop, message_delta, message_stop) take Anthropic's
// shapes. Text only for now: tools, tool_choice, tool_use / tool_result
// blocks and thinking are refused with a 400 naming them until the grammar
// engine and tool-call parsers are wired. Nothing is stored server-side.
// The anthropic-version header is accepted (any value); x-api-key is not
// checked. It must not import the engine or anything under supervisor/.
package anthropic

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strings"

	"github.com/exo-pd/exo-pd/runners/openai"
)

// Request is the body of POST /v1/messages.
type Request struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	Messages      []Message       `json:"messages"`
	System        *Content        `json:"system,omitempty"`
	StopSequences []string        `json:"stop_sequences,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	Temperature   *float64        `json:"temperature,omitempty"`
	TopP          *float64        `json:"top_p,omitempty"`
	TopK          *int            `json:"top_k,omitempty"`
	Metadata      json.RawMessage `json:"metadata,omitempty"`
	// Tools and ToolChoice are parsed to be refused by name until tool
	// calling is wired.
	Tools      json.RawMessage `json:"tools,omitempty"`
	ToolChoice json.RawMessage `json:"tool_choice,omitempty"`
}

// Message is one turn: role user or assistant.
type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
}

// Content is a string or an array of content blocks; only text blocks are
// accepted for now. Set reports that the field was present.
type Content struct {
	Text   string
	Blocks []Block
	Set    bool
}

// Block is one content block.
type Block struct {
	Type         string          `json:"type"`
	Text         string          `json:"text"`
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

// UnmarshalJSON accepts a string or an array of blocks.
func (c *Content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = Content{Text: s, Set: true}
		return nil
	}
	var blocks []Block
	if err := json.Unmarshal(b, &blocks); err != nil {
		return fmt.Errorf("content must be a string or an array of content blocks")
	}
	*c = Content{Blocks: blocks, Set: true}
	return nil
}

var requestShape = openai.FieldsOf(reflect.TypeFor[Request](), openai.Shape{
	"messages": {"role": nil, "content": {"type": nil, "text": nil, "cache_control": nil}},
	"system":   {"type": nil, "text": nil, "cache_control": nil},
	"metadata": {"user_id": nil},
})

// text joins a content's text blocks; path names the field for errors.
func (c Content) text(path string) (string, *openai.Error) {
	if c.Blocks == nil {
		return c.Text, nil
	}
	var sb strings.Builder
	for i, b := range c.Blocks {
		if b.Type != "text" {
			return "", openai.Errorf(fmt.Sprintf("%s[%d].type", path, i),
				"%s[%d].type %q is not supported by this server yet (text only)", path, i, b.Type)
		}
		sb.WriteString(b.Text)
	}
	return sb.String(), nil
}

// blockTypes refuses content blocks other than text by their type, before
// their other keys are checked, so the error says what is missing.
func blockTypes(body []byte) *openai.Error {
	var loose struct {
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &loose) != nil {
		return nil // the strict decode reports it
	}
	check := func(raw json.RawMessage, path string) *openai.Error {
		var blocks []struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(raw, &blocks) != nil {
			return nil
		}
		for i, b := range blocks {
			if b.Type != "text" {
				return openai.Errorf(fmt.Sprintf("%s[%d].type", path, i),
					"%s[%d].type %q is not supported by this server yet (text only)", path, i, b.Type)
			}
		}
		return nil
	}
	if e := check(loose.System, "system"); e != nil {
		return e
	}
	for i, m := range loose.Messages {
		if e := check(m.Content, fmt.Sprintf("messages[%d].content", i)); e != nil {
			return e
		}
	}
	return nil
}

// Handler serves POST /v1/messages on top of an openai.Generator.
type Handler struct {
	Gen      openai.Generator
	Served   []string
	Defaults openai.Defaults
	Logger   *slog.Logger
	// NewID is injectable for golden tests; nil means a random id.
	NewID func(prefix string) string
	// OnResult, when set, is called once per request with its HTTP status.
	OnResult func(model string, code int)
}

// Register adds the route to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("/v1/messages", h.messages)
}

func (h *Handler) id(prefix string) string {
	if h.NewID != nil {
		return h.NewID(prefix)
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (h *Handler) log() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

func (h *Handler) served(name string) bool {
	for _, s := range h.Served {
		if s == name {
			return true
		}
	}
	return false
}

func (h *Handler) result(model string, code int) {
	if h.OnResult != nil {
		h.OnResult(model, code)
	}
}

// ErrorBody is Anthropic's error shape.
type ErrorBody struct {
	Type  string      `json:"type"`
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner object of ErrorBody.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func errorBody(e *openai.Error) ErrorBody {
	typ := "api_error"
	switch {
	case e.Status == http.StatusNotFound:
		typ = "not_found_error"
	case e.Status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case e.Status == http.StatusServiceUnavailable:
		typ = "overloaded_error"
	case e.Status == http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case e.Status >= 400 && e.Status < 500:
		typ = "invalid_request_error"
	}
	return ErrorBody{Type: "error", Error: ErrorDetail{Type: typ, Message: e.Message}}
}

func (h *Handler) fail(w http.ResponseWriter, model string, e *openai.Error) {
	w.Header().Set("Content-Type", "application/json")
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(errorBody(e))
	h.result(model, e.Status)
}

// convert validates r and turns it into a generation request.
func (h *Handler) convert(r *Request) (*openai.GenRequest, *openai.Error) {
	if len(r.Tools) > 0 && string(r.Tools) != "null" && string(r.Tools) != "[]" {
		return nil, openai.Errorf("tools", "tools is not supported by this server yet")
	}
	if len(r.ToolChoice) > 0 && string(r.ToolChoice) != "null" {
		return nil, openai.Errorf("tool_choice", "tool_choice is not supported by this server yet")
	}
	if r.MaxTokens == nil {
		return nil, openai.Errorf("max_tokens", "max_tokens is required")
	}
	if t := r.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 1) {
		return nil, openai.Errorf("temperature", "temperature must be between 0 and 1, got %v", *t)
	}
	cr := openai.ChatRequest{Model: r.Model}
	if r.System != nil {
		sys, e := r.System.text("system")
		if e != nil {
			return nil, e
		}
		cr.Messages = append(cr.Messages, openai.Message{Role: "system", Content: openai.Content{Text: sys, Set: true}})
	}
	for i, m := range r.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, openai.Errorf(fmt.Sprintf("messages[%d].role", i), "messages[%d].role must be user or assistant, got %q", i, m.Role)
		}
		if !m.Content.Set {
			return nil, openai.Errorf(fmt.Sprintf("messages[%d].content", i), "messages[%d].content is required", i)
		}
		t, e := m.Content.text(fmt.Sprintf("messages[%d].content", i))
		if e != nil {
			return nil, e
		}
		cr.Messages = append(cr.Messages, openai.Message{Role: m.Role, Content: openai.Content{Text: t, Set: true}})
	}
	if len(r.Messages) == 0 {
		return nil, openai.Errorf("messages", "messages is required and must not be empty")
	}
	cr.MaxTokens, cr.Temperature, cr.TopP, cr.TopK = r.MaxTokens, r.Temperature, r.TopP, r.TopK
	cr.Stop, cr.Stream = r.StopSequences, r.Stream
	v := openai.Validator{Served: h.served, Defaults: h.Defaults}
	g, e := v.ValidateChat(&cr)
	if e != nil {
		if e.Param == "stop" {
			e.Param = "stop_sequences"
			e.Message = strings.ReplaceAll(e.Message, "stop sequences", "stop_sequences")
		}
		return nil, e
	}
	g.IncludeUsage = true
	return g, nil
}

// Response is a non-streamed message.
type Response struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []ContentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        Usage          `json:"usage"`
}

// ContentBlock is an output content block.
type ContentBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Usage counts tokens: InputTokens are the prompt tokens not read from the
// prefix cache, CacheReadInputTokens those that were.
type Usage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

func usage(res openai.Result) Usage {
	return Usage{InputTokens: res.PromptTokens - res.CachedTokens, OutputTokens: res.CompletionTokens, CacheReadInputTokens: res.CachedTokens}
}

func stopReason(res openai.Result) (reason string, seq *string) {
	switch {
	case res.FinishReason == "length":
		return "max_tokens", nil
	case res.StopSequence != "":
		s := res.StopSequence
		return "stop_sequence", &s
	}
	return "end_turn", nil
}

type buffer struct{ b strings.Builder }

func (b *buffer) Start(int) error                             { return nil }
func (b *buffer) Text(t string, _ *openai.TokenLogprob) error { b.b.WriteString(t); return nil }

// stream writes Anthropic's event sequence as text arrives.
type stream struct {
	sse     *openai.SSEWriter
	id      string
	model   string
	started bool
}

func (s *stream) Start(promptTokens int) error {
	s.started = true
	msg := Response{ID: s.id, Type: "message", Role: "assistant", Model: s.model, Content: []ContentBlock{},
		Usage: Usage{InputTokens: promptTokens}}
	if err := s.sse.NamedEvent("message_start", map[string]any{"type": "message_start", "message": msg}); err != nil {
		return err
	}
	if err := s.sse.NamedEvent("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
		"content_block": ContentBlock{Type: "text", Text: ""}}); err != nil {
		return err
	}
	return s.sse.NamedEvent("ping", map[string]any{"type": "ping"})
}

func (s *stream) Text(t string, _ *openai.TokenLogprob) error {
	if t == "" {
		return nil
	}
	return s.sse.NamedEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
		"delta": map[string]any{"type": "text_delta", "text": t}})
}

func (h *Handler) messages(w http.ResponseWriter, r *http.Request) {
	body, e := openai.ReadBody(w, r)
	if e != nil {
		h.fail(w, "", e)
		return
	}
	if e := blockTypes(body); e != nil {
		h.fail(w, "", e)
		return
	}
	var req Request
	if e := openai.DecodeStrict(body, &req, requestShape); e != nil {
		h.fail(w, "", e)
		return
	}
	if !h.served(req.Model) {
		if strings.TrimSpace(req.Model) == "" {
			h.fail(w, "", openai.Errorf("model", "model is required"))
		} else {
			h.fail(w, req.Model, openai.UnknownModel(req.Model))
		}
		return
	}
	g, e := h.convert(&req)
	if e != nil {
		h.fail(w, req.Model, e)
		return
	}
	id := h.id("msg_")
	if !g.Stream {
		var b buffer
		res, err := h.Gen.Generate(r.Context(), g, &b)
		if err != nil {
			h.fail(w, g.Model, openai.AsError(err))
			return
		}
		reason, seq := stopReason(res)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(Response{ID: id, Type: "message", Role: "assistant", Model: g.Model,
			Content: []ContentBlock{{Type: "text", Text: b.b.String()}}, StopReason: &reason, StopSequence: seq, Usage: usage(res)})
		h.result(g.Model, http.StatusOK)
		return
	}
	sse := openai.NewSSEWriter(w)
	st := &stream{sse: sse, id: id, model: g.Model}
	res, err := h.Gen.Generate(r.Context(), g, st)
	if err != nil {
		oe := openai.AsError(err)
		if !sse.Started() {
			h.fail(w, g.Model, oe)
			return
		}
		code := oe.Status
		if r.Context().Err() != nil {
			code = 499
		} else {
			h.log().Warn("generation failed mid-stream", "model", g.Model, "err", err)
			_ = sse.NamedEvent("error", errorBody(oe))
		}
		h.result(g.Model, code)
		return
	}
	reason, seq := stopReason(res)
	_ = sse.NamedEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	_ = sse.NamedEvent("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq}, "usage": usage(res)})
	_ = sse.NamedEvent("message_stop", map[string]any{"type": "message_stop"})
	h.result(g.Model, http.StatusOK)
}

package openai

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Result is what a generation produced.
type Result struct {
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	// FinishReason is "stop" (end token or stop sequence) or "length".
	FinishReason string
}

// Emitter receives a generation's output. Start is called once, after the
// request is admitted and its prompt tokenized, before any text; Text is
// called with newly generated text (never a split UTF-8 rune). An error
// from either (the client went away) stops the generation.
type Emitter interface {
	Start(promptTokens int) error
	Text(s string) error
}

// Generator runs generations; the decode runner implements it.
type Generator interface {
	// Generate runs req, reporting output to em. An error returned before
	// em.Start becomes the HTTP status of the response (an *Error keeps its
	// status; others are 500).
	Generate(ctx context.Context, req *GenRequest, em Emitter) (Result, error)
	// Tokenize renders and tokenizes req's prompt as Generate would.
	Tokenize(ctx context.Context, req *GenRequest, addGenerationPrompt bool) (tokens []int32, maxModelLen int, err error)
}

// Handler serves the OpenAI-compatible routes on top of a Generator.
type Handler struct {
	Gen Generator
	// Served lists the model names served (normally one).
	Served []string
	Logger *slog.Logger
	// Now and NewID are injectable for golden tests; nil means time.Now
	// and a random id.
	Now   func() time.Time
	NewID func(prefix string) string
	// OnResult, when set, is called once per generation request with its
	// HTTP status code (for metrics), after the response is complete.
	OnResult func(model string, code int)
}

// Register adds the routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("/v1/chat/completions", h.chat)
	mux.HandleFunc("/v1/completions", h.completions)
	mux.HandleFunc("/v1/models", h.models)
	mux.HandleFunc("/tokenize", h.tokenize)
}

func (h *Handler) served(name string) bool {
	for _, s := range h.Served {
		if s == name {
			return true
		}
	}
	return false
}

func (h *Handler) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
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

func (h *Handler) result(model string, code int) {
	if h.OnResult != nil {
		h.OnResult(model, code)
	}
}

func (h *Handler) fail(w http.ResponseWriter, model string, e *Error) {
	WriteError(w, e)
	h.result(model, e.Status)
}

func (h *Handler) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		WriteError(w, &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Message: "use GET"})
		return
	}
	list := ModelList{Object: "list", Data: []Model{}}
	for _, s := range h.Served {
		list.Data = append(list.Data, Model{ID: s, Object: "model", Created: h.now().Unix(), OwnedBy: "exo"})
	}
	writeJSON(w, http.StatusOK, list)
}

func (h *Handler) tokenize(w http.ResponseWriter, r *http.Request) {
	var req TokenizeRequest
	if e := decodeBody(w, r, &req); e != nil {
		WriteError(w, e)
		return
	}
	if !h.served(req.Model) {
		WriteError(w, UnknownModel(req.Model))
		return
	}
	g := &GenRequest{Model: req.Model}
	switch {
	case len(req.Messages) > 0:
		cr := ChatRequest{Model: req.Model, Messages: req.Messages}
		v, e := ValidateChat(&cr, h.served)
		if e != nil {
			WriteError(w, e)
			return
		}
		g = v
	case req.Prompt != nil:
		g.Prompt = *req.Prompt
	default:
		WriteError(w, Errorf("messages", "messages or prompt is required"))
		return
	}
	agp := true
	if req.AddGenerationPrompt != nil {
		agp = *req.AddGenerationPrompt
	}
	toks, maxLen, err := h.Gen.Tokenize(r.Context(), g, agp)
	if err != nil {
		WriteError(w, AsError(err))
		return
	}
	if toks == nil {
		toks = []int32{}
	}
	writeJSON(w, http.StatusOK, TokenizeResponse{Count: len(toks), MaxModelLen: maxLen, Tokens: toks})
}

func (h *Handler) chat(w http.ResponseWriter, r *http.Request) {
	var req ChatRequest
	if e := decodeBody(w, r, &req); e != nil {
		h.fail(w, "", e)
		return
	}
	g, e := ValidateChat(&req, h.served)
	if e != nil {
		h.fail(w, req.Model, e)
		return
	}
	h.serve(w, r, g, true)
}

func (h *Handler) completions(w http.ResponseWriter, r *http.Request) {
	var req CompletionRequest
	if e := decodeBody(w, r, &req); e != nil {
		h.fail(w, "", e)
		return
	}
	g, e := ValidateCompletion(&req, h.served)
	if e != nil {
		h.fail(w, req.Model, e)
		return
	}
	h.serve(w, r, g, false)
}

// streamEmitter writes SSE chunks as text arrives.
type streamEmitter struct {
	sse     *SSEWriter
	chat    bool
	id      string
	created int64
	model   string
}

func (s *streamEmitter) Start(int) error {
	if !s.chat {
		s.sse.Start()
		return nil
	}
	empty := ""
	return s.sse.Event(ChatChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
		Choices: []ChatChoice{{Index: 0, Delta: &ResponseMessage{Role: "assistant", Content: &empty}}}})
}

func (s *streamEmitter) Text(t string) error {
	if t == "" {
		return nil
	}
	if !s.chat {
		return s.sse.Event(CompletionResponse{ID: s.id, Object: "text_completion", Created: s.created, Model: s.model,
			Choices: []CompletionChoice{{Index: 0, Text: t}}})
	}
	return s.sse.Event(ChatChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
		Choices: []ChatChoice{{Index: 0, Delta: &ResponseMessage{Content: &t}}}})
}

// bufferEmitter collects the text of a non-streaming request.
type bufferEmitter struct{ b strings.Builder }

func (b *bufferEmitter) Start(int) error     { return nil }
func (b *bufferEmitter) Text(t string) error { b.b.WriteString(t); return nil }

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, g *GenRequest, chat bool) {
	prefix, object := "cmpl-", "text_completion"
	if chat {
		prefix, object = "chatcmpl-", "chat.completion"
	}
	id := h.id(prefix)
	created := h.now().Unix()
	if !g.Stream {
		var be bufferEmitter
		res, err := h.Gen.Generate(r.Context(), g, &be)
		if err != nil {
			h.fail(w, g.Model, AsError(err))
			return
		}
		usage := &Usage{PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens,
			TotalTokens: res.PromptTokens + res.CompletionTokens, PromptTokensDetails: &PromptTokensDetails{CachedTokens: res.CachedTokens}}
		fr := res.FinishReason
		text := be.b.String()
		if chat {
			writeJSON(w, http.StatusOK, ChatResponse{ID: id, Object: object, Created: created, Model: g.Model,
				Choices: []ChatChoice{{Index: 0, Message: &ResponseMessage{Role: "assistant", Content: &text}, FinishReason: &fr}},
				Usage:   usage})
		} else {
			writeJSON(w, http.StatusOK, CompletionResponse{ID: id, Object: object, Created: created, Model: g.Model,
				Choices: []CompletionChoice{{Index: 0, Text: text, FinishReason: &fr}}, Usage: usage})
		}
		h.result(g.Model, http.StatusOK)
		return
	}
	sse := NewSSEWriter(w)
	em := &streamEmitter{sse: sse, chat: chat, id: id, created: created, model: g.Model}
	res, err := h.Gen.Generate(r.Context(), g, em)
	if err != nil {
		e := AsError(err)
		if !sse.Started() {
			h.fail(w, g.Model, e)
			return
		}
		if r.Context().Err() == nil {
			h.log().Warn("generation failed mid-stream", "model", g.Model, "err", err)
			_ = sse.Event(e.Body())
		}
		code := e.Status
		if r.Context().Err() != nil {
			code = 499 // client closed request (nginx's convention)
		}
		h.result(g.Model, code)
		return
	}
	fr := res.FinishReason
	if chat {
		_ = sse.Event(ChatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: g.Model,
			Choices: []ChatChoice{{Index: 0, Delta: &ResponseMessage{}, FinishReason: &fr}}})
	} else {
		_ = sse.Event(CompletionResponse{ID: id, Object: "text_completion", Created: created, Model: g.Model,
			Choices: []CompletionChoice{{Index: 0, Text: "", FinishReason: &fr}}})
	}
	if g.IncludeUsage {
		usage := &Usage{PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens,
			TotalTokens: res.PromptTokens + res.CompletionTokens, PromptTokensDetails: &PromptTokensDetails{CachedTokens: res.CachedTokens}}
		if chat {
			_ = sse.Event(ChatChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: g.Model, Choices: []ChatChoice{}, Usage: usage})
		} else {
			_ = sse.Event(CompletionResponse{ID: id, Object: "text_completion", Created: created, Model: g.Model, Choices: []CompletionChoice{}, Usage: usage})
		}
	}
	_ = sse.Done()
	h.result(g.Model, http.StatusOK)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

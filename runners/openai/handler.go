package openai

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/exo-pd/exo-pd/runners/gen"
)

// Handler serves the OpenAI-compatible routes on top of a Generator.
type Handler struct {
	Gen gen.Generator
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
	// Defaults are the model's sampling defaults (under request fields).
	Defaults gen.Defaults
	// AcceptTools: Gen honours tools, tool_choice and non-text
	// response_format; false refuses them with a 400 naming the field.
	AcceptTools bool
}

func (h *Handler) validator() Validator {
	return Validator{Served: h.served, Defaults: h.Defaults, AcceptTools: h.AcceptTools}
}

// Register adds the routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("/v1/chat/completions", h.chat)
	mux.HandleFunc("/v1/completions", h.completions)
	mux.HandleFunc("/v1/models", h.models)
	mux.HandleFunc("/tokenize", h.tokenize)
	mux.HandleFunc("/detokenize", h.detokenize)
	mux.HandleFunc("/v1/responses", h.responses)
	mux.HandleFunc("/v1/responses/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: "this server stores no responses (send the whole conversation as input)"})
	})
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

func (h *Handler) id(prefix string) string { return NewID(h.NewID, prefix) }

func (h *Handler) log() *slog.Logger { return LoggerOr(h.Logger) }

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
	if e := decodeBody(w, r, &req, tokenizeShape); e != nil {
		WriteError(w, e)
		return
	}
	if !h.served(req.Model) {
		WriteError(w, UnknownModel(req.Model))
		return
	}
	g := &gen.Request{Model: req.Model}
	switch {
	case len(req.Messages) > 0:
		cr := ChatRequest{Model: req.Model, Messages: req.Messages,
			AddGenerationPrompt: req.AddGenerationPrompt, ContinueFinalMessage: req.ContinueFinalMessage}
		v, e := h.validator().ValidateChat(&cr)
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
	toks, maxLen, err := h.Gen.Tokenize(r.Context(), g)
	if err != nil {
		WriteError(w, AsRequestError(r.Context(), err))
		return
	}
	if toks == nil {
		toks = []int32{}
	}
	writeJSON(w, http.StatusOK, TokenizeResponse{Count: len(toks), MaxModelLen: maxLen, Tokens: toks})
}

func (h *Handler) detokenize(w http.ResponseWriter, r *http.Request) {
	var req DetokenizeRequest
	if e := decodeBody(w, r, &req, detokenizeShape); e != nil {
		WriteError(w, e)
		return
	}
	if !h.served(req.Model) {
		WriteError(w, UnknownModel(req.Model))
		return
	}
	if req.Tokens == nil {
		WriteError(w, Errorf("tokens", "tokens is required"))
		return
	}
	for i, id := range req.Tokens {
		if id < 0 || id > 1<<31-1 {
			WriteError(w, Errorf("tokens", "tokens[%d] = %d is not a token id", i, id))
			return
		}
	}
	ids := make([]int32, len(req.Tokens))
	for i, id := range req.Tokens {
		ids[i] = int32(id)
	}
	text, err := h.Gen.Detokenize(r.Context(), ids)
	if err != nil {
		WriteError(w, AsRequestError(r.Context(), err))
		return
	}
	writeJSON(w, http.StatusOK, DetokenizeResponse{Prompt: text})
}

func (h *Handler) chat(w http.ResponseWriter, r *http.Request) {
	var req ChatRequest
	if e := decodeBody(w, r, &req, chatShape); e != nil {
		h.fail(w, "", e)
		return
	}
	g, e := h.validator().ValidateChat(&req)
	if e != nil {
		h.fail(w, req.Model, e)
		return
	}
	h.serve(w, r, g, true)
}

func (h *Handler) completions(w http.ResponseWriter, r *http.Request) {
	var req CompletionRequest
	if e := decodeBody(w, r, &req, completionShape); e != nil {
		h.fail(w, "", e)
		return
	}
	g, e := h.validator().ValidateCompletion(&req)
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
	offset  int // bytes of completion text sent (legacy text_offset)
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

func (s *streamEmitter) Text(t string, lp *gen.TokenLogprob) error {
	if t == "" && lp == nil {
		return nil
	}
	if !s.chat {
		c := CompletionChoice{Index: 0, Text: t}
		if lp != nil {
			var cl CompletionLogprobs
			cl.add(lp, s.offset)
			c.Logprobs = &cl
			s.offset += len(lp.Bytes)
		}
		return s.sse.Event(CompletionResponse{ID: s.id, Object: "text_completion", Created: s.created, Model: s.model,
			Choices: []CompletionChoice{c}})
	}
	c := ChatChoice{Index: 0, Delta: &ResponseMessage{Content: &t}}
	if lp != nil {
		c.Logprobs = &ChatLogprobs{Content: []LogprobContent{chatLogprob(lp)}}
	}
	return s.sse.Event(ChatChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
		Choices: []ChatChoice{c}})
}

// ToolCall implements gen.ToolCallEmitter: OpenAI's delta.tool_calls.
func (s *streamEmitter) ToolCall(index int, id, name, args string) error {
	d := ToolCallDelta{Index: &index, ID: id, Function: FunctionCallPartial{Name: name, Arguments: args}}
	if id != "" {
		d.Type = "function"
	}
	return s.sse.Event(ChatChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
		Choices: []ChatChoice{{Index: 0, Delta: &ResponseMessage{ToolCalls: []ToolCallDelta{d}}}}})
}

// Reasoning implements gen.ReasoningEmitter: OpenAI's delta.reasoning_content.
func (s *streamEmitter) Reasoning(t string) error {
	if t == "" || !s.chat {
		return nil
	}
	return s.sse.Event(ChatChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
		Choices: []ChatChoice{{Index: 0, Delta: &ResponseMessage{ReasoningContent: &t}}}})
}

// bufferEmitter collects the text (and logprobs) of a non-streaming request.
type bufferEmitter struct {
	b     strings.Builder
	r     strings.Builder // reasoning
	lps   []*gen.TokenLogprob
	calls []ToolCallDelta
}

// ToolCall implements gen.ToolCallEmitter.
func (b *bufferEmitter) ToolCall(index int, id, name, args string) error {
	for len(b.calls) <= index {
		b.calls = append(b.calls, ToolCallDelta{Type: "function"})
	}
	c := &b.calls[index]
	if id != "" {
		c.ID = id
	}
	c.Function.Name += name
	c.Function.Arguments += args
	return nil
}

// Reasoning implements gen.ReasoningEmitter.
func (b *bufferEmitter) Reasoning(t string) error { b.r.WriteString(t); return nil }

func (b *bufferEmitter) Start(int) error { return nil }
func (b *bufferEmitter) Text(t string, lp *gen.TokenLogprob) error {
	b.b.WriteString(t)
	if lp != nil {
		b.lps = append(b.lps, lp)
	}
	return nil
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, g *gen.Request, chat bool) {
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
			h.fail(w, g.Model, AsRequestError(r.Context(), err))
			return
		}
		usage := &Usage{PromptTokens: res.PromptTokens, CompletionTokens: res.CompletionTokens,
			TotalTokens: res.PromptTokens + res.CompletionTokens, PromptTokensDetails: &PromptTokensDetails{CachedTokens: res.CachedTokens}}
		fr := res.FinishReason
		text := be.b.String()
		if chat {
			c := ChatChoice{Index: 0, Message: &ResponseMessage{Role: "assistant", Content: &text, ToolCalls: be.calls}, FinishReason: &fr}
			if len(be.calls) > 0 && text == "" {
				c.Message.Content, c.Message.NullContent = nil, true // OpenAI's content: null beside tool calls
			}
			if r := be.r.String(); r != "" {
				c.Message.ReasoningContent = &r
			}
			if g.Logprobs {
				c.Logprobs = &ChatLogprobs{Content: []LogprobContent{}}
				for _, lp := range be.lps {
					c.Logprobs.Content = append(c.Logprobs.Content, chatLogprob(lp))
				}
			}
			writeJSON(w, http.StatusOK, ChatResponse{ID: id, Object: object, Created: created, Model: g.Model,
				Choices: []ChatChoice{c}, Usage: usage})
		} else {
			c := CompletionChoice{Index: 0, Text: text, FinishReason: &fr}
			if g.Logprobs {
				cl := &CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
				off := 0
				for _, lp := range be.lps {
					cl.add(lp, off)
					off += len(lp.Bytes)
				}
				c.Logprobs = cl
			}
			writeJSON(w, http.StatusOK, CompletionResponse{ID: id, Object: object, Created: created, Model: g.Model,
				Choices: []CompletionChoice{c}, Usage: usage})
		}
		h.result(g.Model, http.StatusOK)
		return
	}
	sse := NewSSEWriter(w)
	em := &streamEmitter{sse: sse, chat: chat, id: id, created: created, model: g.Model}
	res, err := h.Gen.Generate(r.Context(), g, em)
	if err != nil {
		e := AsRequestError(r.Context(), err)
		if !sse.Started() {
			h.fail(w, g.Model, e)
			return
		}
		if !ClientGone(r.Context()) {
			h.log().Warn("generation failed mid-stream", "model", g.Model, "err", err)
			_ = sse.Event(e.Body())
		}
		code := e.Status
		if ClientGone(r.Context()) {
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

// minLogprob stands for -Inf, which JSON cannot carry (OpenAI's value).
const minLogprob = -9999.0

func clampLogprob(v float64) float64 {
	if math.IsNaN(v) || v < minLogprob {
		return minLogprob
	}
	return v
}

func byteInts(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// tokenString is a token's text; bytes that are not valid UTF-8 on their
// own (part of a multi-byte rune) are written as \xHH, as OpenAI does.
func tokenString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			fmt.Fprintf(&sb, "\\x%02x", b[0])
			b = b[1:]
			continue
		}
		sb.Write(b[:n])
		b = b[n:]
	}
	return sb.String()
}

func chatLogprob(lp *gen.TokenLogprob) LogprobContent {
	c := LogprobContent{Token: tokenString(lp.Bytes), Logprob: clampLogprob(lp.Logprob), Bytes: byteInts(lp.Bytes), TopLogprobs: []TopLogprob{}}
	for _, t := range lp.Top {
		c.TopLogprobs = append(c.TopLogprobs, TopLogprob{Token: tokenString(t.Bytes), Logprob: clampLogprob(t.Logprob), Bytes: byteInts(t.Bytes)})
	}
	return c
}

func (cl *CompletionLogprobs) add(lp *gen.TokenLogprob, offset int) {
	cl.Tokens = append(cl.Tokens, tokenString(lp.Bytes))
	cl.TokenLogprobs = append(cl.TokenLogprobs, clampLogprob(lp.Logprob))
	top := map[string]float64{}
	for _, t := range lp.Top {
		if _, dup := top[tokenString(t.Bytes)]; !dup {
			top[tokenString(t.Bytes)] = clampLogprob(t.Logprob)
		}
	}
	cl.TopLogprobs = append(cl.TopLogprobs, top)
	cl.TextOffset = append(cl.TextOffset, offset)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

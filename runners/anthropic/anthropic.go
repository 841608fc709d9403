// Package anthropic serves Anthropic's Messages API (POST /v1/messages) as
// a thin adapter over the same generation core as the OpenAI API: a
// request is converted straight to a gen.Request, checked in Anthropic's
// terms and by the checks every API shares (runners/gen: sampling
// defaults and ranges, stops, the assistant prefill, tools and tool
// choice; no silent ignores) and run by the same gen.Generator (it reuses
// runners/openai's strict JSON decoding, error values and SSE writer, not
// its request types); the answer and the stream
// (message_start, ping, then per content block content_block_start,
// content_block_delta…, content_block_stop; message_delta, message_stop) take Anthropic's
// shapes. Unless Handler.AcceptTools, tools, tool_choice and tool_use /
// tool_result blocks are refused with a 400 naming them; with it, they
// become the generation request's Tools/ToolChoice and its history of
// calls and tool messages (convertMessage), and the calls the generator reports
// (gen.ToolCallEmitter) come back as tool_use blocks (streamed as
// input_json_delta) with stop_reason "tool_use". thinking {"type":"enabled",
// "budget_tokens":N} (or "adaptive", no budget) returns a reasoning model's
// reasoning (gen.ReasoningEmitter) as a thinking block before the answer,
// streamed as thinking_delta then signature_delta; the budget becomes the
// generation's MaxReasoningTokens (refused by the generator, with this
// API's field name, where it cannot be honoured). Without it the reasoning
// is dropped. thinking and redacted_thinking blocks sent back in history
// are accepted and left out of the prompt.
// Nothing is stored server-side.
// The anthropic-version header is accepted (any value); x-api-key is not
// checked. It must not import the engine or anything under supervisor/.
package anthropic

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/exo-pd/exo-pd/internal/apierr"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// Request is the body of POST /v1/messages.
type Request struct {
	Model         string               `json:"model"`
	MaxTokens     *int                 `json:"max_tokens"`
	Messages      openai.List[Message] `json:"messages"`
	System        *Content             `json:"system,omitempty"`
	StopSequences openai.List[string]  `json:"stop_sequences,omitempty"`
	Stream        bool                 `json:"stream,omitempty"`
	Temperature   *float64             `json:"temperature,omitempty"`
	TopP          *float64             `json:"top_p,omitempty"`
	TopK          *int                 `json:"top_k,omitempty"`
	Metadata      json.RawMessage      `json:"metadata,omitempty"`
	// Tools and ToolChoice become the generation request's tools (refused
	// by name unless Handler.AcceptTools).
	Tools      openai.List[Tool] `json:"tools,omitempty"`
	ToolChoice *ToolChoice       `json:"tool_choice,omitempty"`
	// Thinking enabled (with budget_tokens) or adaptive returns the
	// model's reasoning as thinking blocks; disabled or absent drops it.
	Thinking *Thinking `json:"thinking,omitempty"`
	// Speculative is exo's extension, as chat's: false turns speculative
	// decoding off for this request.
	Speculative *bool `json:"x_exo_speculative,omitempty"`
	// DisableRemotePrefill is exo's extension, as chat's: prefill this
	// request locally.
	DisableRemotePrefill bool `json:"x_exo_disable_remote_prefill,omitempty"`
}

// Thinking is the request's extended-thinking setting.
type Thinking struct {
	Type         string `json:"type"`
	BudgetTokens *int   `json:"budget_tokens,omitempty"`
}

// Tool is a client tool: a name, a description and a JSON Schema.
type Tool struct {
	Type         string          `json:"type,omitempty"`
	Name         string          `json:"name"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

// ToolChoice is Anthropic's tool_choice: auto, any, tool (with name) or
// none.
type ToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse *bool  `json:"disable_parallel_tool_use,omitempty"`
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

// Block is one content block: text, or (with tools) tool_use in an
// assistant turn and tool_result in a user turn.
type Block struct {
	Type         string          `json:"type"`
	Text         string          `json:"text,omitempty"`
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
	// tool_use
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// tool_result: Content is a string or text blocks
	ToolUseID string   `json:"tool_use_id,omitempty"`
	Content   *Content `json:"content,omitempty"`
	IsError   bool     `json:"is_error,omitempty"`
	// thinking / redacted_thinking sent back: accepted, not prompted
	Thinking  string `json:"thinking,omitempty"`
	Signature string `json:"signature,omitempty"`
	Data      string `json:"data,omitempty"`
}

// JSONKind implements openai.JSONKinder (for decoding errors).
func (Content) JSONKind() string { return "a string or an array of content blocks" }

// UnmarshalJSON accepts a string or an array of blocks; an error names
// its path inside the content (openai.List).
func (c *Content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) { // as if absent (encoding/json's convention)
		*c = Content{}
		return nil
	}
	*c = Content{Set: true}
	return openai.StringOrList(b, &c.Text, &c.Blocks, reflect.TypeFor[Content]())
}

// blockFields are the fields of each content block type this server
// takes: Block is their union, and a block carrying another type's field
// is refused by name (checkBlocks).
var blockFields = map[string][]string{
	"text":              {"type", "text", "cache_control"},
	"tool_use":          {"type", "id", "name", "input", "cache_control"},
	"tool_result":       {"type", "tool_use_id", "content", "is_error", "cache_control"},
	"thinking":          {"type", "thinking", "signature"},
	"redacted_thinking": {"type", "data"},
}

var (
	textBlockShape = openai.Shape{"type": nil, "text": nil, "cache_control": nil}
	blockShape     = func() openai.Shape { // the union of blockFields
		s := openai.Shape{}
		for _, fs := range blockFields {
			for _, f := range fs {
				s[f] = nil
			}
		}
		s["content"] = textBlockShape // tool_result's: a string or text blocks
		return s
	}()
	requestShape = openai.FieldsOf(reflect.TypeFor[Request](), openai.Shape{
		"messages":    {"role": nil, "content": blockShape},
		"system":      textBlockShape,
		"metadata":    {"user_id": nil},
		"tools":       {"type": nil, "name": nil, "description": nil, "input_schema": nil, "cache_control": nil},
		"tool_choice": {"type": nil, "name": nil, "disable_parallel_tool_use": nil},
		"thinking":    {"type": nil, "budget_tokens": nil},
	})
)

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

// generationOnly are the fields of /v1/messages that count_tokens does
// not take: they shape the answer, not the prompt.
var generationOnly = []string{"max_tokens", "stream", "stop_sequences", "temperature", "top_p", "top_k", "metadata", "x_exo_speculative", "x_exo_disable_remote_prefill"}

// countShape is requestShape without the generation-only fields.
var countShape = func() openai.Shape {
	s := openai.Shape{}
	for k, v := range requestShape {
		if !slices.Contains(generationOnly, k) {
			s[k] = v
		}
	}
	return s
}()

// checkBlocks refuses content blocks other than text (and, with tools,
// tool_use and tool_result; in history, thinking and redacted_thinking)
// by their type, before their other keys are checked, so the error says
// what is missing; then a field of another block type on a block
// (signature on a text block, text on a tool_use), by name. Keys no block
// type has are left to the strict decode, which refuses them too.
func checkBlocks(body []byte, tools bool) *openai.Error {
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
		var blocks []map[string]json.RawMessage
		if json.Unmarshal(raw, &blocks) != nil {
			return nil
		}
		for i, b := range blocks {
			var typ string
			if json.Unmarshal(b["type"], &typ) != nil {
				continue // the strict decode reports it
			}
			history := path != "system" && (typ == "thinking" || typ == "redacted_thinking")
			if typ != "text" && !history && !(tools && path != "system" && (typ == "tool_use" || typ == "tool_result")) {
				return openai.Errorf(fmt.Sprintf("%s[%d].type", path, i),
					"%s[%d].type %q is not supported by this server yet", path, i, typ)
			}
			for _, k := range slices.Sorted(maps.Keys(b)) {
				if _, some := blockShape[k]; !some || slices.Contains(blockFields[typ], k) || string(bytes.TrimSpace(b[k])) == "null" {
					continue
				}
				f := fmt.Sprintf("%s[%d].%s", path, i, k)
				return openai.Errorf(f, "%s is not a field of a %s block", f, typ)
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

// Handler serves POST /v1/messages on top of a gen.Generator.
type Handler struct {
	Gen      gen.Generator
	Served   []string
	Defaults gen.Defaults
	Logger   *slog.Logger
	// NewID is injectable for golden tests; nil means a random id.
	NewID func(prefix string) string
	// OnResult, when set, is called once per request with its HTTP status.
	OnResult func(model string, code int)
	// AcceptTools: Gen honours tools (set with openai.Handler.AcceptTools);
	// else tools, tool_choice and tool blocks are refused by name.
	AcceptTools bool
}

// Register adds the routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("/v1/messages", h.messages)
	mux.HandleFunc("/v1/messages/count_tokens", h.countTokens)
}

// readRequest reads and strictly decodes a request body of the given shape
// (content block types checked first); on an error it has answered the
// client and returns false.
func (h *Handler) readRequest(w http.ResponseWriter, r *http.Request, shape openai.Shape) (Request, bool) {
	return h.readRequestAs(w, r, shape, nil)
}

// readRequestAs is readRequest with the decoding's error passed through
// refine (when set) before it is answered.
func (h *Handler) readRequestAs(w http.ResponseWriter, r *http.Request, shape openai.Shape, refine func(*openai.Error) *openai.Error) (Request, bool) {
	body, e := openai.ReadBody(w, r)
	if e != nil {
		h.fail(w, "", e)
		return Request{}, false
	}
	if e := checkBlocks(body, h.AcceptTools); e != nil {
		h.fail(w, "", e)
		return Request{}, false
	}
	var req Request
	if e := openai.DecodeStrict(body, &req, shape); e != nil {
		if refine != nil {
			e = refine(e)
		}
		h.fail(w, "", e)
		return Request{}, false
	}
	return req, true
}

// countTokens answers POST /v1/messages/count_tokens: the prompt tokens the
// same request would have ({"input_tokens": N}). It takes the fields that
// make the prompt (countShape, checked by prompt) and refuses the
// generation's own, max_tokens among them.
func (h *Handler) countTokens(w http.ResponseWriter, r *http.Request) {
	req, ok := h.readRequestAs(w, r, countShape, func(e *openai.Error) *openai.Error {
		if slices.Contains(generationOnly, e.Param) {
			return openai.Errorf(e.Param, "%s is a field of /v1/messages, not of count_tokens, which counts the prompt "+
				"(model, messages, system, tools, tool_choice, thinking): leave it out", e.Param)
		}
		return e
	})
	if !ok || !h.checkModel(w, req.Model) {
		return
	}
	g, e := h.prompt(&req)
	if e != nil {
		h.fail(w, req.Model, e)
		return
	}
	toks, _, err := h.Gen.Tokenize(r.Context(), g)
	if err != nil {
		h.fail(w, req.Model, openai.AsRequestError(r.Context(), err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int{"input_tokens": len(toks)})
}

// checkModel refuses a missing or unknown model; on an error it has
// answered the client and returns false.
func (h *Handler) checkModel(w http.ResponseWriter, model string) bool {
	switch {
	case strings.TrimSpace(model) == "":
		h.fail(w, "", openai.Errorf("model", "model is required"))
	case !h.served(model):
		h.fail(w, model, openai.UnknownModel(model))
	default:
		return true
	}
	return false
}

func (h *Handler) id(prefix string) string { return openai.NewID(h.NewID, prefix) }

func (h *Handler) log() *slog.Logger { return openai.LoggerOr(h.Logger) }

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

// errorBody is e in Anthropic's shape, its type the one Anthropic
// documents for the status (the gateway's own errors use the same map).
func errorBody(e *openai.Error) ErrorBody {
	return ErrorBody{Type: "error", Error: ErrorDetail{Type: apierr.AnthropicType(e.Status), Message: e.Message}}
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

// convert validates r and turns it into a generation request: Anthropic's
// shapes here, then the checks every API shares (runners/gen), each error
// naming the field as this API spells it.
func (h *Handler) convert(r *Request) (*gen.Request, *openai.Error) {
	if r.MaxTokens == nil {
		return nil, openai.Errorf("max_tokens", "max_tokens is required")
	}
	if t := r.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 1) {
		return nil, openai.Errorf("temperature", "temperature must be between 0 and 1, got %v", *t)
	}
	g, e := h.prompt(r)
	if e != nil {
		return nil, e
	}
	if n := g.MaxReasoningTokens; n > 0 && n >= *r.MaxTokens {
		return nil, openai.Errorf("thinking.budget_tokens", "thinking.budget_tokens (%d) must be less than max_tokens (%d)", n, *r.MaxTokens)
	}
	if fe := gen.CheckMaxTokens(*r.MaxTokens, "max_tokens"); fe != nil {
		return nil, fieldError(fe)
	}
	g.MaxTokens = *r.MaxTokens
	s, err := h.Defaults.Over(gen.Defaults{Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK}).Sampling()
	var fe *gen.FieldError
	switch {
	case errors.As(err, &fe):
		return nil, fieldError(fe)
	case err != nil:
		return nil, openai.Errorf("", "%v", err)
	}
	if fe := gen.CheckStops(r.StopSequences, "stop_sequences", "stop_sequences"); fe != nil {
		return nil, fieldError(fe)
	}
	g.Sampling, g.Stop = s, append([]string(nil), r.StopSequences...)
	g.Stream, g.IncludeUsage = r.Stream, true
	g.NoSpeculation = r.Speculative != nil && !*r.Speculative
	g.DisableRemotePrefill = r.DisableRemotePrefill
	return g, nil
}

// prompt validates and converts what makes the prompt — system,
// messages, tools, tool_choice, thinking — the fields count_tokens takes
// too; the generation's own (max_tokens, sampling, stops, stream) are
// convert's.
func (h *Handler) prompt(r *Request) (*gen.Request, *openai.Error) {
	g := &gen.Request{Model: r.Model, Chat: true}
	if th := r.Thinking; th != nil {
		switch th.Type {
		case "disabled", "adaptive":
			if th.BudgetTokens != nil {
				return nil, openai.Errorf("thinking.budget_tokens", "thinking.budget_tokens is only for thinking enabled")
			}
		case "enabled":
			switch n := th.BudgetTokens; {
			case n == nil:
				return nil, openai.Errorf("thinking.budget_tokens", "thinking.budget_tokens is required with thinking enabled")
			case *n < 1:
				return nil, openai.Errorf("thinking.budget_tokens", "thinking.budget_tokens must be at least 1, got %d", *n)
			}
			g.MaxReasoningTokens = *th.BudgetTokens
		default:
			return nil, openai.Errorf("thinking.type", "thinking.type must be enabled, adaptive or disabled, got %q", th.Type)
		}
	}
	if r.System != nil {
		sys, e := r.System.text("system")
		if e != nil {
			return nil, e
		}
		g.Messages = append(g.Messages, gen.Message{Role: "system", Content: sys})
	}
	for i, m := range r.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, openai.Errorf(fmt.Sprintf("messages[%d].role", i), "messages[%d].role must be user or assistant, got %q", i, m.Role)
		}
		if !m.Content.Set {
			return nil, openai.Errorf(fmt.Sprintf("messages[%d].content", i), "messages[%d].content is required", i)
		}
		msgs, e := convertMessage(m, fmt.Sprintf("messages[%d].content", i))
		if e != nil {
			return nil, e
		}
		g.Messages = append(g.Messages, msgs...)
	}
	for i, t := range r.Tools {
		if t.Type != "" && t.Type != "custom" {
			return nil, openai.Errorf(fmt.Sprintf("tools[%d].type", i), "tools[%d].type %q is not supported (server tools are not run here)", i, t.Type)
		}
		g.Tools = append(g.Tools, gen.Tool{Name: t.Name, Description: t.Description, Parameters: t.InputSchema})
	}
	if tc := r.ToolChoice; tc != nil {
		mode := map[string]string{"auto": "auto", "any": "required", "tool": "function", "none": "none"}[tc.Type]
		if mode == "" || (mode == "function") != (tc.Name != "") {
			return nil, openai.Errorf("tool_choice", "tool_choice.type must be auto, any, none, or tool with a name")
		}
		g.ToolChoice = &gen.ToolChoice{Mode: mode, Name: tc.Name}
		if tc.DisableParallelToolUse != nil {
			p := !*tc.DisableParallelToolUse
			g.ParallelToolCalls = &p
		}
	}
	if len(r.Messages) == 0 {
		return nil, openai.Errorf("messages", "messages is required and must not be empty")
	}
	if err := g.SetTurn(nil, nil); err != nil { // the default turn: a final assistant message is continued
		return nil, openai.Errorf("messages", "messages: %v", err)
	}
	return g, fieldError(g.CheckTools(h.AcceptTools, toolFields))
}

// toolFields name the fields gen's tool checks report, as the Messages
// API spells them.
var toolFields = gen.ToolFields{
	ToolName:   func(i int) string { return fmt.Sprintf("tools[%d].name", i) },
	Parameters: func(i int) string { return fmt.Sprintf("tools[%d].input_schema", i) },
	Choice:     "tool_choice",
	ChoiceMode: func(mode string) string {
		return map[string]string{"required": "any", "function": "tool"}[mode]
	},
}

// fieldError is a shared check's *gen.FieldError as a 400 naming its
// field (nil for nil).
func fieldError(fe *gen.FieldError) *openai.Error {
	if fe == nil {
		return nil
	}
	return openai.Errorf(fe.Field, "%s", fe.Msg)
}

// convertMessage turns one Anthropic turn into chat messages: text blocks
// become its content, tool_use blocks an assistant's tool calls (input as
// the arguments' JSON), and each tool_result block a "tool" message
// (before the turn's text; is_error results are prefixed "Error: ").
func convertMessage(m Message, path string) ([]gen.Message, *openai.Error) {
	if m.Content.Blocks == nil {
		return []gen.Message{{Role: m.Role, Content: m.Content.Text}}, nil
	}
	var out []gen.Message
	var text strings.Builder
	var calls []gen.ToolCall
	hasText := false
	for j, b := range m.Content.Blocks {
		at := fmt.Sprintf("%s[%d]", path, j)
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
			hasText = true
		case "thinking", "redacted_thinking":
			// Earlier reasoning sent back (as Anthropic's SDKs do with a
			// whole assistant turn): accepted, and left out of the prompt,
			// as Anthropic leaves out earlier turns' thinking.
			if m.Role != "assistant" {
				return nil, openai.Errorf(at+".type", "%s: %s blocks belong to assistant turns", at, b.Type)
			}
		case "tool_use":
			if m.Role != "assistant" {
				return nil, openai.Errorf(at+".type", "%s: tool_use blocks belong to assistant turns", at)
			}
			if b.Name == "" {
				return nil, openai.Errorf(at+".name", "%s.name is required", at)
			}
			args := string(b.Input)
			if args == "" {
				args = "{}"
			}
			calls = append(calls, gen.ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
		case "tool_result":
			if m.Role != "user" {
				return nil, openai.Errorf(at+".type", "%s: tool_result blocks belong to user turns", at)
			}
			if b.ToolUseID == "" {
				return nil, openai.Errorf(at+".tool_use_id", "%s.tool_use_id is required", at)
			}
			res := ""
			if b.Content != nil {
				t, e := b.Content.text(at + ".content")
				if e != nil {
					return nil, e
				}
				res = t
			}
			if b.IsError {
				res = "Error: " + res
			}
			out = append(out, gen.Message{Role: "tool", ToolCallID: b.ToolUseID, Content: res})
		default:
			return nil, openai.Errorf(at+".type", "%s.type %q is not supported by this server yet", at, b.Type)
		}
	}
	switch {
	case len(calls) > 0:
		out = append(out, gen.Message{Role: "assistant", ToolCalls: calls, Content: text.String()})
	case hasText || len(out) == 0:
		out = append(out, gen.Message{Role: m.Role, Content: text.String()})
	}
	return out, nil
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

// ContentBlock is an output content block: text, or a tool_use (ID,
// Name, Input: the arguments object).
type ContentBlock struct {
	Type  string          `json:"type"`
	Text  string          `json:"text"`
	ID    string          `json:"-"`
	Name  string          `json:"-"`
	Input json.RawMessage `json:"-"`
	// thinking: the reasoning and its signature
	Thinking  string `json:"-"`
	Signature string `json:"-"`
}

// MarshalJSON writes a tool_use or thinking block in its own shape.
func (b ContentBlock) MarshalJSON() ([]byte, error) {
	if b.Type == "thinking" {
		return json.Marshal(struct {
			Type      string `json:"type"`
			Thinking  string `json:"thinking"`
			Signature string `json:"signature"`
		}{b.Type, b.Thinking, b.Signature})
	}
	if b.Type == "tool_use" {
		in := b.Input
		if !json.Valid(in) { // cut off by max_tokens
			in = completeInput(in)
		}
		return json.Marshal(struct {
			Type  string          `json:"type"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		}{b.Type, b.ID, b.Name, in})
	}
	type plain ContentBlock
	return json.Marshal(plain(b))
}

// toolUseID turns a generated call id into Anthropic's form.
func toolUseID(callID string) string { return "toolu_" + strings.TrimPrefix(callID, "call_") }

// Usage counts tokens: InputTokens are the prompt tokens not read from the
// prefix cache, CacheReadInputTokens those that were.
type Usage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

func usage(res gen.Result) Usage {
	return Usage{InputTokens: res.PromptTokens - res.CachedTokens, OutputTokens: res.CompletionTokens, CacheReadInputTokens: res.CachedTokens}
}

func stopReason(res gen.Result) (reason string, seq *string) {
	switch {
	case res.FinishReason == "length":
		return "max_tokens", nil
	case res.FinishReason == "tool_calls":
		return "tool_use", nil
	case res.StopSequence != "":
		s := res.StopSequence
		return "stop_sequence", &s
	}
	return "end_turn", nil
}

// signature is a thinking block's signature: exo's marker and the
// SHA-256 of the reasoning. Anthropic's is an opaque proof its API checks
// when the block is sent back; this server does not check it (it leaves
// earlier thinking out of the prompt), so it is a checksum, not a proof.
func signature(thinking string) string {
	h := sha256.Sum256([]byte(thinking))
	return "exo-sha256:" + base64.StdEncoding.EncodeToString(h[:])
}

// buffer collects a non-streamed answer: its thinking, text and tool_use
// blocks in the order the model produced them, as the stream opens them
// (text after a call is a new text block after it).
type buffer struct {
	blocks   []ContentBlock
	calls    map[int]int // a call's index → its block
	thinking bool        // thinking enabled: reasoning is kept
}

// add appends s to the last block if it is of type typ, else to a new one.
func (b *buffer) add(typ, s string) {
	if s == "" {
		return
	}
	if n := len(b.blocks); n == 0 || b.blocks[n-1].Type != typ {
		b.blocks = append(b.blocks, ContentBlock{Type: typ})
	}
	last := &b.blocks[len(b.blocks)-1]
	if typ == "thinking" {
		last.Thinking += s
	} else {
		last.Text += s
	}
}

// Reasoning implements gen.ReasoningEmitter: kept with thinking on.
func (b *buffer) Reasoning(s string) error {
	if b.thinking {
		b.add("thinking", s)
	}
	return nil
}

func (b *buffer) Start(int) error                          { return nil }
func (b *buffer) Text(t string, _ *gen.TokenLogprob) error { b.add("text", t); return nil }

// ToolCall implements gen.ToolCallEmitter: a call's first piece opens its
// tool_use block where the answer stands.
func (b *buffer) ToolCall(index int, id, name, args string) error {
	if b.calls == nil {
		b.calls = map[int]int{}
	}
	at, ok := b.calls[index]
	if !ok {
		at = len(b.blocks)
		b.calls[index] = at
		b.blocks = append(b.blocks, ContentBlock{Type: "tool_use"})
	}
	c := &b.blocks[at]
	if id != "" {
		c.ID = toolUseID(id)
	}
	c.Name += name
	c.Input = append(c.Input, args...)
	return nil
}

// content is the answer's blocks, each thinking block signed; an answer
// with none at all is one empty text block.
func (b *buffer) content() []ContentBlock {
	if len(b.blocks) == 0 {
		return []ContentBlock{{Type: "text"}}
	}
	for i := range b.blocks {
		if b.blocks[i].Type == "thinking" {
			b.blocks[i].Signature = signature(b.blocks[i].Thinking)
		}
	}
	return b.blocks
}

// stream writes Anthropic's event sequence as text arrives.
type stream struct {
	sse     *openai.SSEWriter
	id      string
	model   string
	started bool
	opened  bool   // a content block was started
	block   int    // index of the open (or last) content block
	kind    string // its type: "thinking", "text" or "tool_use"
	calls   map[int]int
	// thinking enabled: reasoning streams as a thinking block, whose
	// text so far is reason
	thinking bool
	reason   strings.Builder
}

// Reasoning implements gen.ReasoningEmitter: with thinking on, a
// thinking block whose text streams as thinking_delta.
func (s *stream) Reasoning(t string) error {
	if !s.thinking || t == "" {
		return nil
	}
	if !s.opened || s.kind != "thinking" {
		if err := s.open(ContentBlock{Type: "thinking"}); err != nil {
			return err
		}
	}
	s.reason.WriteString(t)
	return s.sse.NamedEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
		"delta": map[string]any{"type": "thinking_delta", "thinking": t}})
}

// stop ends the open block: a thinking block gets its signature_delta
// first, as Anthropic sends it.
func (s *stream) stop() error {
	if s.kind == "thinking" {
		if err := s.sse.NamedEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
			"delta": map[string]any{"type": "signature_delta", "signature": signature(s.reason.String())}}); err != nil {
			return err
		}
		s.reason.Reset()
	}
	return s.sse.NamedEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": s.block})
}

// open closes the open block, if any, and starts block cb. Blocks open
// as their content comes (not a text block up front), so a streamed
// answer has the non-streamed answer's blocks: no empty text block
// before tool_use blocks.
func (s *stream) open(cb ContentBlock) error {
	if s.opened {
		if err := s.stop(); err != nil {
			return err
		}
		s.block++
	}
	s.opened = true
	s.kind = cb.Type
	return s.sse.NamedEvent("content_block_start", map[string]any{"type": "content_block_start", "index": s.block, "content_block": cb})
}

// finish closes the last block; an answer with no content at all still
// gets one (empty) text block, as the non-streamed answer does.
func (s *stream) finish() error {
	if !s.opened {
		if err := s.open(ContentBlock{Type: "text"}); err != nil {
			return err
		}
	}
	return s.stop()
}

// ToolCall implements gen.ToolCallEmitter: a tool_use block whose
// input streams as input_json_delta.
func (s *stream) ToolCall(index int, id, name, args string) error {
	if s.calls == nil {
		s.calls = map[int]int{}
	}
	if id != "" {
		if err := s.open(ContentBlock{Type: "tool_use", ID: toolUseID(id), Name: name, Input: json.RawMessage(`{}`)}); err != nil {
			return err
		}
		s.calls[index] = s.block
	}
	if args == "" {
		return nil
	}
	return s.sse.NamedEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.calls[index],
		"delta": map[string]any{"type": "input_json_delta", "partial_json": args}})
}

func (s *stream) Start(promptTokens int) error {
	s.started = true
	msg := Response{ID: s.id, Type: "message", Role: "assistant", Model: s.model, Content: []ContentBlock{},
		Usage: Usage{InputTokens: promptTokens}}
	if err := s.sse.NamedEvent("message_start", map[string]any{"type": "message_start", "message": msg}); err != nil {
		return err
	}
	return s.sse.NamedEvent("ping", map[string]any{"type": "ping"})
}

func (s *stream) Text(t string, _ *gen.TokenLogprob) error {
	if t == "" {
		return nil
	}
	if !s.opened || s.kind != "text" { // the first text, or text after a call or thinking: a new text block
		if err := s.open(ContentBlock{Type: "text"}); err != nil {
			return err
		}
	}
	return s.sse.NamedEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.block,
		"delta": map[string]any{"type": "text_delta", "text": t}})
}

// thinks reports whether the request asks for thinking blocks.
func thinks(th *Thinking) bool { return th != nil && (th.Type == "enabled" || th.Type == "adaptive") }

// genError is a generation error in this API's terms: the generator's
// max_reasoning_tokens is this API's thinking.budget_tokens.
func genError(e *openai.Error) *openai.Error {
	if e.Param != "max_reasoning_tokens" {
		return e
	}
	c := *e
	c.Param = "thinking.budget_tokens"
	c.Message = "thinking.budget_tokens cannot be honoured on this model (" + strings.ReplaceAll(e.Message, "max_reasoning_tokens", "a reasoning budget") +
		"); send thinking {\"type\": \"adaptive\"} (reasoning bounded only by max_tokens) or leave thinking out"
	return &c
}

func (h *Handler) messages(w http.ResponseWriter, r *http.Request) {
	req, ok := h.readRequest(w, r, requestShape)
	if !ok || !h.checkModel(w, req.Model) {
		return
	}
	g, e := h.convert(&req)
	if e != nil {
		h.fail(w, req.Model, e)
		return
	}
	id := h.id("msg_")
	if !g.Stream {
		b := buffer{thinking: thinks(req.Thinking)}
		res, err := h.Gen.Generate(r.Context(), g, &b)
		if err != nil {
			h.fail(w, g.Model, genError(openai.AsRequestError(r.Context(), err)))
			return
		}
		reason, seq := stopReason(res)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(Response{ID: id, Type: "message", Role: "assistant", Model: g.Model,
			Content: b.content(), StopReason: &reason, StopSequence: seq, Usage: usage(res)})
		h.result(g.Model, http.StatusOK)
		return
	}
	sse := openai.NewSSEWriter(w)
	st := &stream{sse: sse, id: id, model: g.Model, thinking: thinks(req.Thinking)}
	res, err := h.Gen.Generate(r.Context(), g, st)
	if err != nil {
		oe := genError(openai.AsRequestError(r.Context(), err))
		if !sse.Started() {
			h.fail(w, g.Model, oe)
			return
		}
		code := oe.Status
		if openai.ClientGone(r.Context()) {
			code = 499
		} else {
			h.log().Warn("generation failed mid-stream", "model", g.Model, "err", err)
			_ = sse.NamedEvent("error", errorBody(oe))
		}
		h.result(g.Model, code)
		return
	}
	reason, seq := stopReason(res)
	_ = st.finish()
	_ = sse.NamedEvent("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq}, "usage": usage(res)})
	_ = sse.NamedEvent("message_stop", map[string]any{"type": "message_stop"})
	h.result(g.Model, http.StatusOK)
}

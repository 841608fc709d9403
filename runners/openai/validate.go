package openai

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/exo-pd/exo-pd/runners/gen"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 32 << 20

// Shape lists the JSON object keys a request may carry, recursively: the
// value of a key is the shape of its value (nil: not checked here), and a
// shape applies to every element of an array. Keys outside it get a 400
// naming them, so no field is silently ignored; one whose value is null
// asks for nothing and passes, as if absent (clients that write every
// field of their request model send null for those they leave unset).
type Shape map[string]Shape

var (
	toolCallShape = Shape{"id": nil, "type": nil, "function": Shape{"name": nil, "arguments": nil}}
	messageShape  = Shape{"role": nil, "content": Shape{"type": nil, "text": nil}, "name": nil,
		"tool_calls": toolCallShape, "tool_call_id": nil, "reasoning_content": nil}
	streamOptionsShape = Shape{"include_usage": nil}
	chatShape          = withFields(reflect.TypeFor[ChatRequest](), Shape{"messages": messageShape, "stream_options": streamOptionsShape,
		"tools":           Shape{"type": nil, "function": Shape{"name": nil, "description": nil, "parameters": nil, "strict": nil}},
		"response_format": Shape{"type": nil, "json_schema": Shape{"name": nil, "description": nil, "schema": nil, "strict": nil}}})
	completionShape = withFields(reflect.TypeFor[CompletionRequest](), Shape{"stream_options": streamOptionsShape})
	tokenizeShape   = withFields(reflect.TypeFor[TokenizeRequest](), Shape{"messages": messageShape})
	detokenizeShape = withFields(reflect.TypeFor[DetokenizeRequest](), nil)
)

// FieldsOf is the Shape of every JSON field of struct type t (embedded
// structs included), with sub-shapes from sub.
func FieldsOf(t reflect.Type, sub Shape) Shape { return withFields(t, sub) }

// DecodeStrict decodes a JSON object body into v: a key outside sh is a
// 400 naming its JSON path, a type error names the JSON field.
func DecodeStrict(body []byte, v any, sh Shape) *Error { return decodeJSON(body, v, sh) }

// ReadBody reads a POST body (bounded by MaxBodyBytes) with OpenAI-style
// errors.
func ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, *Error) {
	var raw json.RawMessage
	if e := decodeBody(w, r, &raw, nil); e != nil {
		return nil, e
	}
	return raw, nil
}

// withFields is a shape of every JSON field of struct type t (embedded
// structs included), with sub-shapes from sub.
func withFields(t reflect.Type, sub Shape) Shape {
	s := Shape{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			for k, v := range withFields(f.Type, sub) {
				s[k] = v
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		s[name] = sub[name]
	}
	return s
}

// check returns the path of the first key (in sorted order) that v carries
// outside s, or "".
func (s Shape) check(v any, path string) string {
	if s == nil {
		return ""
	}
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			if p := s.check(e, fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			if p == "" {
				p = `""` // an empty top-level key: a path still, not "nothing refused"
			}
			sub, ok := s[k]
			if !ok {
				if x[k] == nil {
					continue // null asks for nothing: as if absent
				}
				return p
			}
			if q := sub.check(x[k], p); q != "" {
				return q
			}
		}
	}
	return ""
}

// decodeBody reads a JSON body into v with OpenAI-style errors: a key
// outside sh is refused by name, a type error names the JSON field.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, sh Shape) *Error {
	if r.Method != http.MethodPost {
		return &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Message: fmt.Sprintf("method %s not allowed; use POST", r.Method)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Message: fmt.Sprintf("request body over %d bytes", MaxBodyBytes)}
		}
		return Errorf("", "reading request body: %v", err)
	}
	return decodeJSON(body, v, sh)
}

func decodeJSON(body []byte, v any, sh Shape) *Error {
	if len(bytes.TrimSpace(body)) == 0 {
		return Errorf("", "request body is empty; expected a JSON object")
	}
	var generic any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // a number too large for a float64 is the typed decoding's to name
	err := dec.Decode(&generic)
	if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
		err = errors.New("invalid character after top-level value")
	}
	if err != nil {
		return Errorf("", "invalid JSON body: %v", err)
	}
	if _, ok := generic.(map[string]any); !ok {
		return Errorf("", "invalid JSON body: expected a JSON object")
	}
	if p := sh.check(generic, ""); p != "" {
		return Errorf(p, "%s is not supported by this server (exo-pd refuses fields it does not implement rather than ignore them)", p)
	}
	if err := json.Unmarshal(body, v); err != nil {
		var ute *json.UnmarshalTypeError
		if !errors.As(err, &ute) {
			msg := strings.TrimPrefix(err.Error(), "json: ")
			if strings.Contains(msg, "Go ") { // encoding/json's own words name Go types
				msg = "a value has the wrong type"
			}
			return Errorf("", "invalid JSON body: %s", msg)
		}
		// the path, from the types and Lists on the way (list.go)
		f, kind := jsonPath(ute.Field), jsonKind(ute.Type)
		name := cmp.Or(f, "the body")
		if strings.HasPrefix(ute.Value, "number") && (kind == "a number" || kind == "an integer") && !fraction(ute.Value, kind) {
			return Errorf(f, "invalid JSON body: %s is out of range: %s", name, ute.Value)
		}
		return Errorf(f, "invalid JSON body: %s must be %s, got %s", name, kind, ute.Value)
	}
	return nil
}

// fraction reports whether a number that does not decode into an
// integer kind is not a whole number ("number 2.5"), which is no range
// error.
func fraction(value, kind string) bool {
	return kind == "an integer" && strings.ContainsAny(strings.TrimPrefix(value, "number"), ".eE")
}

// jsonPath is the JSON path of a decoding error's field path: the Go
// names of embedded structs dropped ("SamplingFields.temperature" →
// "temperature"; JSON fields here are all lower case) and array indices
// (List) joined to what they index ("messages.[1].content" →
// "messages[1].content").
func jsonPath(p string) string {
	parts := strings.Split(p, ".")
	out := parts[:0]
	for _, s := range parts {
		if s != "" && !(s[0] >= 'A' && s[0] <= 'Z') {
			out = append(out, s)
		}
	}
	return strings.ReplaceAll(strings.Join(out, "."), ".[", "[")
}

// jsonKind names the JSON type a Go type is decoded from.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if k, ok := reflect.Zero(t).Interface().(JSONKinder); ok {
		return k.JSONKind()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another JSON type"
}

// Validator checks requests against what this server serves.
type Validator struct {
	// Served reports whether a model name is served here.
	Served func(string) bool
	// Defaults are the model's sampling defaults.
	Defaults gen.Defaults
	// AcceptTools: the generator honours tools, tool_choice and
	// response_format (else they are refused with a 400).
	AcceptTools bool
	// ToolFields name the fields the shared tool checks report, for an
	// API that converts to a chat request but spells them its own way
	// (the Responses API); nil: Chat Completions' names.
	ToolFields *gen.ToolFields
}

func validateSampling(f *SamplingFields, d gen.Defaults, g *gen.Request) *Error {
	mt := f.MaxTokens
	param := "max_tokens"
	if f.MaxCompletionTokens != nil {
		if mt != nil && *mt != *f.MaxCompletionTokens {
			// one of them would be ignored: say so rather than pick
			return Errorf("max_tokens", "max_tokens (%d) and max_completion_tokens (%d) disagree; set one of them (max_tokens is the older name)", *mt, *f.MaxCompletionTokens)
		}
		mt, param = f.MaxCompletionTokens, "max_completion_tokens"
	}
	if mt != nil {
		if fe := gen.CheckMaxTokens(*mt, param); fe != nil {
			return fieldError(fe)
		}
		g.MaxTokens = *mt
	}
	d = d.Over(gen.Defaults{Temperature: f.Temperature, TopP: f.TopP, TopK: f.TopK, MinP: f.MinP, RepetitionPenalty: f.RepetitionPenalty})
	s, err := d.Sampling()
	var fe *gen.FieldError
	switch {
	case errors.As(err, &fe):
		return Errorf(fe.Field, "%s", fe.Msg)
	case err != nil:
		return Errorf("", "%v", err)
	}
	for _, pp := range []struct {
		name string
		v    *float64
		dst  *float64
	}{{"presence_penalty", f.PresencePenalty, &s.PresencePenalty}, {"frequency_penalty", f.FrequencyPenalty, &s.FrequencyPenalty}} {
		if pp.v == nil {
			continue
		}
		if math.IsNaN(*pp.v) || *pp.v < -2 || *pp.v > 2 {
			return Errorf(pp.name, "%s must be between -2 and 2, got %v", pp.name, *pp.v)
		}
		*pp.dst = *pp.v
	}
	if len(f.LogitBias) > 0 {
		if len(f.LogitBias) > 1024 {
			return Errorf("logit_bias", "logit_bias may hold at most 1024 tokens, got %d", len(f.LogitBias))
		}
		s.LogitBias = make(map[int32]float32, len(f.LogitBias))
		for k, b := range f.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || id < 0 {
				return Errorf("logit_bias", "logit_bias keys must be token ids (non-negative integers), got %q", k)
			}
			if math.IsNaN(b) || b < -100 || b > 100 {
				return Errorf("logit_bias", "logit_bias[%q] must be between -100 and 100, got %v", k, b)
			}
			s.LogitBias[int32(id)] = float32(b)
		}
	}
	if f.Seed != nil {
		s.Seed, s.SeedSet = *f.Seed, true
	}
	if f.N != nil && *f.N != 1 {
		return Errorf("n", "only n=1 is supported, got %d", *f.N)
	}
	if f.Store != nil && *f.Store {
		return Errorf("store", "store: true is not supported: this server stores no completions")
	}
	if fe := gen.CheckStops(f.Stop, "stop", "stop sequences"); fe != nil {
		return fieldError(fe)
	}
	g.Sampling = s
	g.Stop = append([]string(nil), f.Stop...)
	g.IgnoreEOS = f.IgnoreEOS
	g.DisableRemotePrefill = f.DisableRemotePrefill
	g.NoSpeculation = f.Speculative != nil && !*f.Speculative
	g.Stream = f.Stream
	g.IncludeUsage = true
	if f.StreamOptions != nil && f.StreamOptions.IncludeUsage != nil {
		if !f.Stream {
			return Errorf("stream_options", "stream_options is only allowed with stream: true")
		}
		g.IncludeUsage = *f.StreamOptions.IncludeUsage
	}
	return nil
}

var validRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// ValidateChat checks a chat request and converts it.
func (v Validator) ValidateChat(r *ChatRequest) (*gen.Request, *Error) {
	if strings.TrimSpace(r.Model) == "" {
		return nil, Errorf("model", "model is required")
	}
	if !v.Served(r.Model) {
		return nil, UnknownModel(r.Model)
	}
	if len(r.Messages) == 0 {
		return nil, Errorf("messages", "messages is required and must not be empty")
	}
	if m := r.Modalities; m != nil && (len(m) != 1 || m[0] != "text") {
		return nil, Errorf("modalities", "modalities must be [\"text\"]: this server writes text only, got %q", m)
	}
	g := &gen.Request{Model: r.Model, Chat: true}
	for i, m := range r.Messages {
		at := func(f string) string { return fmt.Sprintf("messages[%d].%s", i, f) }
		if !validRoles[m.Role] {
			return nil, Errorf(at("role"), "%s %q is not one of system, developer, user, assistant, tool", at("role"), m.Role)
		}
		if len(m.ToolCalls) > 0 && m.Role != "assistant" {
			return nil, Errorf(at("tool_calls"), "%s is only allowed on assistant messages", at("tool_calls"))
		}
		if !m.Content.Set && len(m.ToolCalls) == 0 {
			return nil, Errorf(at("content"), "%s is required (it may be null only on an assistant message with tool_calls)", at("content"))
		}
		for j, tc := range m.ToolCalls {
			tat := fmt.Sprintf("%s[%d]", at("tool_calls"), j)
			if tc.Type != "" && tc.Type != "function" {
				return nil, Errorf(tat+".type", "%s.type must be \"function\", got %q", tat, tc.Type)
			}
			if tc.Function.Name == "" {
				return nil, Errorf(tat+".function.name", "%s.function.name is required", tat)
			}
		}
		if m.Role == "tool" && m.ToolCallID == "" {
			return nil, Errorf(at("tool_call_id"), "%s is required on a tool message", at("tool_call_id"))
		}
		if m.Role != "tool" && m.ToolCallID != "" {
			return nil, Errorf(at("tool_call_id"), "%s is only allowed on tool messages", at("tool_call_id"))
		}
		if m.ReasoningContent != nil && m.Role != "assistant" {
			return nil, Errorf(at("reasoning_content"), "%s is only allowed on assistant messages", at("reasoning_content"))
		}
		role := m.Role
		if role == "developer" {
			role = "system"
		}
		cm := gen.Message{Role: role, Content: m.Content.Text, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			cm.ToolCalls = append(cm.ToolCalls, gen.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		if m.ReasoningContent != nil {
			cm.Reasoning = *m.ReasoningContent
		}
		g.Messages = append(g.Messages, cm)
	}
	if e := validateSampling(&r.SamplingFields, v.Defaults, g); e != nil {
		return nil, e
	}
	if r.Logprobs != nil && *r.Logprobs {
		g.Logprobs = true
	}
	if r.TopLogprobs != nil {
		if *r.TopLogprobs < 0 || *r.TopLogprobs > 20 {
			return nil, Errorf("top_logprobs", "top_logprobs must be between 0 and 20, got %d", *r.TopLogprobs)
		}
		if !g.Logprobs {
			return nil, Errorf("top_logprobs", "top_logprobs needs logprobs: true")
		}
		g.TopLogprobs = *r.TopLogprobs
	}
	if n := r.MaxReasoningTokens; n != nil {
		if *n < 1 {
			return nil, Errorf("max_reasoning_tokens", "max_reasoning_tokens must be at least 1, got %d", *n)
		}
		g.MaxReasoningTokens = *n
	}
	if e := v.chatPrefill(r, g); e != nil {
		return nil, e
	}
	if e := v.constraints(r, g); e != nil {
		return nil, e
	}
	return g, nil
}

// chatPrefill decides between a new assistant turn and continuing the
// final assistant message (gen's rule), naming the fields that asked.
func (v Validator) chatPrefill(r *ChatRequest, g *gen.Request) *Error {
	switch err := g.SetTurn(r.AddGenerationPrompt, r.ContinueFinalMessage); {
	case errors.Is(err, gen.ErrTurnBoth):
		return Errorf("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true")
	case errors.Is(err, gen.ErrTurnNotAssistant):
		return Errorf("continue_final_message", "continue_final_message needs the last message to be the assistant's")
	case errors.Is(err, gen.ErrTurnCalls):
		return Errorf("continue_final_message", "an assistant message with tool_calls cannot be continued")
	case err != nil:
		return Errorf("continue_final_message", "%v", err)
	}
	return nil
}

// NoParameters is the schema of a function whose parameters are omitted
// or null: OpenAI defines it as an empty parameter list, so its calls
// carry no arguments ({}), and the prompt says so.
const NoParameters = `{"type":"object","properties":{},"additionalProperties":false}`

// fieldError is a shared check's *gen.FieldError as a 400 naming its
// field (nil for nil).
func fieldError(fe *gen.FieldError) *Error {
	if fe == nil {
		return nil
	}
	return Errorf(fe.Field, "%s", fe.Msg)
}

// constraints keeps tools, tool_choice, parallel_tool_calls and
// response_format on g, and refuses what needs the grammar engine while
// it is not wired (v.AcceptTools false).
func (v Validator) constraints(r *ChatRequest, g *gen.Request) *Error {
	for i, t := range r.Tools {
		if t.Type != "function" {
			return Errorf(fmt.Sprintf("tools[%d].type", i), "tools[%d].type must be \"function\", got %q", i, t.Type)
		}
	}
	if rf := r.ResponseFormat; rf != nil {
		switch rf.Type {
		case "text", "json_object":
			if rf.JSONSchema != nil {
				return Errorf("response_format.json_schema", "response_format.json_schema is allowed only with type json_schema, not %q", rf.Type)
			}
		case "json_schema":
			if rf.JSONSchema == nil || len(rf.JSONSchema.Schema) == 0 || string(rf.JSONSchema.Schema) == "null" {
				return Errorf("response_format.json_schema", "response_format type json_schema needs json_schema.schema")
			}
		default:
			return Errorf("response_format.type", "response_format.type must be text, json_object or json_schema, got %q", rf.Type)
		}
	}
	for _, t := range r.Tools {
		params := t.Function.Parameters
		if p := bytes.TrimSpace(params); len(p) == 0 || string(p) == "null" {
			params = json.RawMessage(NoParameters) // omitted: no parameters (gen.CheckTools checks the rest)
		}
		g.Tools = append(g.Tools, gen.Tool{Name: t.Function.Name, Description: t.Function.Description,
			Parameters: params, Strict: t.Function.Strict != nil && *t.Function.Strict})
	}
	if tc := r.ToolChoice; tc != nil {
		g.ToolChoice = &gen.ToolChoice{Mode: tc.Mode, Name: tc.Name}
	}
	if rf := r.ResponseFormat; rf != nil {
		g.ResponseFormat = &gen.ResponseFormat{Type: rf.Type}
		if rf.JSONSchema != nil {
			g.ResponseFormat.Name, g.ResponseFormat.Schema = rf.JSONSchema.Name, rf.JSONSchema.Schema
		}
	}
	g.ParallelToolCalls = r.ParallelToolCalls
	f := chatToolFields
	if v.ToolFields != nil {
		f = *v.ToolFields
	}
	return fieldError(g.CheckTools(v.AcceptTools, f))
}

// chatToolFields name the fields gen's tool checks report, as Chat
// Completions spells them.
var chatToolFields = gen.ToolFields{
	ToolName:   func(i int) string { return fmt.Sprintf("tools[%d].function.name", i) },
	Parameters: func(i int) string { return fmt.Sprintf("tools[%d].function.parameters", i) },
	Choice:     "tool_choice",
	Format:     "response_format",
}

// ValidateCompletion checks a completion request and converts it.
func (v Validator) ValidateCompletion(r *CompletionRequest) (*gen.Request, *Error) {
	if strings.TrimSpace(r.Model) == "" {
		return nil, Errorf("model", "model is required")
	}
	if !v.Served(r.Model) {
		return nil, UnknownModel(r.Model)
	}
	if !r.Prompt.Set {
		return nil, Errorf("prompt", "prompt is required")
	}
	switch {
	case r.Echo != nil && *r.Echo:
		return nil, Errorf("echo", "echo: true is not supported by this server (the prompt is not returned)")
	case r.BestOf != nil && *r.BestOf != 1:
		return nil, Errorf("best_of", "only best_of=1 is supported, got %d", *r.BestOf)
	case r.Suffix != nil && *r.Suffix != "":
		return nil, Errorf("suffix", "suffix is not supported by this server (no fill-in-the-middle)")
	}
	g := &gen.Request{Model: r.Model}
	if r.Prompt.IsIDs {
		if len(r.Prompt.Tokens) == 0 {
			return nil, Errorf("prompt", "prompt must not be empty")
		}
		g.PromptIDs = r.Prompt.Tokens
	} else {
		if r.Prompt.Text == "" {
			return nil, Errorf("prompt", "prompt must not be empty")
		}
		g.Prompt = r.Prompt.Text
	}
	if e := validateSampling(&r.SamplingFields, v.Defaults, g); e != nil {
		return nil, e
	}
	if r.Logprobs != nil {
		if *r.Logprobs < 0 || *r.Logprobs > 20 {
			return nil, Errorf("logprobs", "logprobs must be between 0 and 20, got %d", *r.Logprobs)
		}
		g.Logprobs, g.TopLogprobs = true, *r.Logprobs
	}
	return g, nil
}

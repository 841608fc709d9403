package openai

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/exo-pd/exo-pd/runners/gen"
)

// The OpenAI Responses API (POST /v1/responses) as a thin adapter over the
// same Generator as chat completions: input (a string or message items),
// instructions, max_output_tokens, temperature, top_p, stream, text.format
// (as chat's response_format). Unless Handler.AcceptTools, function tools,
// forced tool_choice, function_call / function_call_output items and
// non-text formats are refused with a 400 naming them; with it, they
// become the generation request's tools, format and OpenAI-shaped
// history. Nothing is
// stored server-side: store must be absent or false, and
// previous_response_id (which needs stored responses) is refused.

// ResponsesRequest is the body of POST /v1/responses.
type ResponsesRequest struct {
	Model              string               `json:"model"`
	Input              ResponsesInput       `json:"input"`
	Instructions       *string              `json:"instructions,omitempty"`
	MaxOutputTokens    *int                 `json:"max_output_tokens,omitempty"`
	Temperature        *float64             `json:"temperature,omitempty"`
	TopP               *float64             `json:"top_p,omitempty"`
	Stream             bool                 `json:"stream,omitempty"`
	Store              *bool                `json:"store,omitempty"`
	Metadata           json.RawMessage      `json:"metadata,omitempty"`
	User               string               `json:"user,omitempty"`
	ParallelToolCalls  *bool                `json:"parallel_tool_calls,omitempty"`
	ToolChoice         *ResponsesToolChoice `json:"tool_choice,omitempty"`
	Tools              List[ResponsesTool]  `json:"tools,omitempty"`
	Text               *ResponsesText       `json:"text,omitempty"`
	PreviousResponseID *string              `json:"previous_response_id,omitempty"`
	// Truncation and Include are taken at their defaults only ("disabled",
	// empty); other values are refused by name.
	Truncation *string      `json:"truncation,omitempty"`
	Include    List[string] `json:"include,omitempty"`
	// Speculative is exo's extension, as chat's: false turns speculative
	// decoding off for this request.
	Speculative *bool `json:"x_exo_speculative,omitempty"`
	// DisableRemotePrefill is exo's extension, as chat's: prefill locally.
	DisableRemotePrefill bool `json:"x_exo_disable_remote_prefill,omitempty"`
}

// ResponsesTool is a function tool of the Responses API (flat, unlike
// chat's {"type","function":{…}}).
type ResponsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ResponsesText is the request's "text": its format is "text",
// "json_object" or a flat "json_schema" ({"type","name","description",
// "schema","strict"}), as chat's response_format.
type ResponsesText struct {
	Format *ResponsesFormat `json:"format,omitempty"`
}

// ResponsesFormat is text.format.
type ResponsesFormat struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ResponsesInput is "input": a string, or a list of message items.
type ResponsesInput struct {
	Text  string
	Items []ResponsesItem
	Set   bool
}

// ResponsesItem is one input item: a message, or (with tools) a
// function_call the model made or a function_call_output answering it.
type ResponsesItem struct {
	Type    string         `json:"type,omitempty"`
	Role    string         `json:"role,omitempty"`
	Content ResponsesParts `json:"content"`
	ID      string         `json:"id,omitempty"`
	Status  string         `json:"status,omitempty"`
	// function_call / function_call_output
	CallID    string `json:"call_id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	Output    string `json:"output,omitempty"`
}

// ResponsesParts is an item's content: a string or a list of parts.
type ResponsesParts struct {
	Text  string
	Parts []ResponsesPart
	Set   bool
}

// ResponsesPart is one content part of an input item.
type ResponsesPart struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
}

// JSONKind implements JSONKinder.
func (ResponsesInput) JSONKind() string { return "a string or an array of input items" }

// UnmarshalJSON accepts a string or a list of items.
func (in *ResponsesInput) UnmarshalJSON(b []byte) error {
	*in = ResponsesInput{Set: true}
	return StringOrList(b, &in.Text, &in.Items, reflect.TypeFor[ResponsesInput]())
}

// JSONKind implements JSONKinder.
func (ResponsesParts) JSONKind() string { return "a string or an array of content parts" }

// UnmarshalJSON accepts a string or a list of parts.
func (c *ResponsesParts) UnmarshalJSON(b []byte) error {
	*c = ResponsesParts{Set: true}
	return StringOrList(b, &c.Text, &c.Parts, reflect.TypeFor[ResponsesParts]())
}

var responsesShape = withFields(reflect.TypeFor[ResponsesRequest](), Shape{
	"input": {"type": nil, "role": nil, "id": nil, "status": nil, "content": {"type": nil, "text": nil, "annotations": nil},
		"call_id": nil, "name": nil, "arguments": nil, "output": nil},
	"tools": {"type": nil, "name": nil, "description": nil, "parameters": nil, "strict": nil},
	"text":  {"format": {"type": nil, "name": nil, "description": nil, "schema": nil, "strict": nil}},
})

// responsesItemFields are the fields each input item type takes (type
// itself, id and status on all).
var responsesItemFields = map[string][]string{
	"message":              {"type", "id", "status", "role", "content"},
	"function_call":        {"type", "id", "status", "call_id", "name", "arguments"},
	"function_call_output": {"type", "id", "status", "call_id", "output"},
}

// responsesItemTypes refuses input items and parts other than messages and
// text by their type, before their other keys are checked.
func responsesItemTypes(body []byte, tools bool) *Error {
	var loose struct {
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(body, &loose) != nil {
		return nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Content json.RawMessage `json:"content"`
	}
	var fields []map[string]json.RawMessage
	if json.Unmarshal(loose.Input, &items) != nil || json.Unmarshal(loose.Input, &fields) != nil {
		return nil
	}
	for i, it := range items {
		if it.Type != "" && it.Type != "message" && !(tools && (it.Type == "function_call" || it.Type == "function_call_output")) {
			return Errorf(fmt.Sprintf("input[%d].type", i), "input[%d].type %q is not supported by this server yet (message items only)", i, it.Type)
		}
		// ResponsesItem is every item type's fields together: one of
		// another type is refused by name, not dropped.
		own := responsesItemFields[cmp.Or(it.Type, "message")]
		for _, f := range slices.Sorted(maps.Keys(fields[i])) {
			if _, union := responsesShape["input"][f]; union && !slices.Contains(own, f) {
				return Errorf(fmt.Sprintf("input[%d].%s", i, f), "input[%d].%s is not a field of a %s item", i, f, cmp.Or(it.Type, "message"))
			}
		}
		var parts []struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(it.Content, &parts) != nil {
			continue
		}
		for j, p := range parts {
			if p.Type != "input_text" && p.Type != "output_text" && p.Type != "text" {
				return Errorf(fmt.Sprintf("input[%d].content[%d].type", i, j),
					"input[%d].content[%d].type %q is not supported by this server yet (text only)", i, j, p.Type)
			}
		}
	}
	return nil
}

// convertResponses validates r into a generation request.
func (h *Handler) convertResponses(r *ResponsesRequest) (*gen.Request, *Error) {
	switch {
	case r.Store != nil && *r.Store:
		return nil, Errorf("store", "store: true is not supported: this server stores no responses")
	case r.PreviousResponseID != nil:
		return nil, Errorf("previous_response_id", "previous_response_id is not supported: this server stores no responses; send the whole conversation as input")
	case r.Truncation != nil && *r.Truncation != "disabled":
		return nil, Errorf("truncation", "truncation %q is not supported: a prompt over the context is a 400, never cut", *r.Truncation)
	case len(r.Include) > 0:
		return nil, Errorf("include", "include %q is not supported by this server", r.Include)
	case !r.Input.Set:
		return nil, Errorf("input", "input is required")
	}
	cr := ChatRequest{Model: r.Model}
	if r.Instructions != nil {
		cr.Messages = append(cr.Messages, Message{Role: "system", Content: Content{Text: *r.Instructions, Set: true}})
	}
	if r.Input.Items == nil {
		cr.Messages = append(cr.Messages, Message{Role: "user", Content: Content{Text: r.Input.Text, Set: true}})
	}
	for i, it := range r.Input.Items {
		switch it.Type {
		case "function_call":
			call := ToolCall{ID: it.CallID, Type: "function", Function: FunctionCall{Name: it.Name, Arguments: it.Arguments}}
			if n := len(cr.Messages); n > 0 && cr.Messages[n-1].Role == "assistant" && len(cr.Messages[n-1].ToolCalls) > 0 {
				cr.Messages[n-1].ToolCalls = append(cr.Messages[n-1].ToolCalls, call) // parallel calls: one turn
			} else {
				cr.Messages = append(cr.Messages, Message{Role: "assistant", ToolCalls: []ToolCall{call}})
			}
			continue
		case "function_call_output":
			cr.Messages = append(cr.Messages, Message{Role: "tool", ToolCallID: it.CallID, Content: Content{Text: it.Output, Set: true}})
			continue
		}
		if !it.Content.Set {
			return nil, Errorf(fmt.Sprintf("input[%d].content", i), "input[%d].content is required", i)
		}
		text := it.Content.Text
		if it.Content.Parts != nil {
			var sb strings.Builder
			for _, p := range it.Content.Parts {
				sb.WriteString(p.Text)
			}
			text = sb.String()
		}
		if it.Role == "tool" {
			return nil, Errorf(fmt.Sprintf("input[%d].role", i), "input[%d].role must be user, assistant, system or developer", i)
		}
		cr.Messages = append(cr.Messages, Message{Role: it.Role, Content: Content{Text: text, Set: true}})
	}
	for _, t := range r.Tools {
		cr.Tools = append(cr.Tools, Tool{Type: t.Type, Function: FunctionDef{Name: t.Name, Description: t.Description, Parameters: t.Parameters, Strict: t.Strict}})
	}
	if r.Text != nil && r.Text.Format != nil {
		f := r.Text.Format
		switch f.Type {
		case "text", "json_object":
			// OpenAI's text and json_object formats are {"type"} alone:
			// a json_schema format's field beside them is refused, not
			// ignored (and echoed back as if honoured)
			for _, x := range []struct {
				name string
				set  bool
			}{{"name", f.Name != ""}, {"description", f.Description != ""}, {"schema", len(f.Schema) > 0 && string(f.Schema) != "null"}, {"strict", f.Strict != nil}} {
				if x.set {
					return nil, Errorf("text.format."+x.name, "text.format.%s is only for text.format type json_schema, not %q", x.name, f.Type)
				}
			}
		case "json_schema":
			if len(f.Schema) == 0 || string(f.Schema) == "null" {
				return nil, Errorf("text.format.schema", "text.format type json_schema needs text.format.schema")
			}
		default:
			return nil, Errorf("text.format.type", "text.format.type must be text, json_object or json_schema, got %q", f.Type)
		}
		cr.ResponseFormat = &ResponseFormat{Type: f.Type}
		if f.Type == "json_schema" {
			cr.ResponseFormat.JSONSchema = &JSONSchemaFormat{Name: f.Name, Description: f.Description, Schema: f.Schema, Strict: f.Strict}
		}
	}
	cr.ToolChoice, cr.ParallelToolCalls = (*ToolChoice)(r.ToolChoice), r.ParallelToolCalls
	cr.MaxTokens, cr.Temperature, cr.TopP, cr.Stream = r.MaxOutputTokens, r.Temperature, r.TopP, r.Stream
	cr.Speculative, cr.DisableRemotePrefill = r.Speculative, r.DisableRemotePrefill
	v := h.validator()
	v.ToolFields = &responsesToolFields
	g, e := v.ValidateChat(&cr)
	if e != nil {
		if e.Param == "max_tokens" {
			e.Param, e.Message = "max_output_tokens", strings.ReplaceAll(e.Message, "max_tokens", "max_output_tokens")
		}
		return nil, inputParam(e, r)
	}
	return g, nil
}

// responsesToolFields name the fields gen's tool checks report, as the
// Responses API spells them: a tool's fields are at its top, the format
// is text.format (text.format's own fields are checked in
// convertResponses, so no chat field name reaches the client).
var responsesToolFields = gen.ToolFields{
	ToolName:   func(i int) string { return fmt.Sprintf("tools[%d].name", i) },
	Parameters: func(i int) string { return fmt.Sprintf("tools[%d].parameters", i) },
	Choice:     "tool_choice",
	Format:     "text.format",
}

// inputParam renames an error about the chat messages to the Responses
// API's field: "messages" is input, messages[i] is input[i] (instructions
// are message 0 when given).
func inputParam(e *Error, r *ResponsesRequest) *Error {
	if e.Param == "messages" {
		e.Param = "input"
		return e
	}
	var i int
	var rest string
	if n, _ := fmt.Sscanf(e.Param, "messages[%d]%s", &i, &rest); n >= 1 && r.Input.Items != nil {
		off := 0
		if r.Instructions != nil {
			off = 1
		}
		e.Message = strings.ReplaceAll(e.Message, fmt.Sprintf("messages[%d]", i), fmt.Sprintf("input[%d]", i-off))
		e.Param = fmt.Sprintf("input[%d]%s", i-off, rest)
	}
	return e
}

// ResponseObject is a Responses API response.
type ResponseObject struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Status            string             `json:"status"`
	Error             any                `json:"error"`
	IncompleteDetails *IncompleteDetails `json:"incomplete_details"`
	Instructions      *string            `json:"instructions"`
	MaxOutputTokens   *int               `json:"max_output_tokens"`
	Model             string             `json:"model"`
	Output            []ResponseItem     `json:"output"`
	ParallelToolCalls bool               `json:"parallel_tool_calls"`
	Temperature       float64            `json:"temperature"`
	TopP              float64            `json:"top_p"`
	ToolChoice        any                `json:"tool_choice"`
	Tools             []any              `json:"tools"`
	Text              map[string]any     `json:"text"`
	Store             bool               `json:"store"`
	Metadata          json.RawMessage    `json:"metadata"`
	Usage             *ResponsesUsage    `json:"usage"`
	User              *string            `json:"user,omitempty"`
	Truncation        string             `json:"truncation"`
	Reasoning         map[string]any     `json:"reasoning"`
	Background        bool               `json:"background"`
	ServiceTier       string             `json:"service_tier"`
	PreviousResponse  *string            `json:"previous_response_id"`
}

// IncompleteDetails says why a response is incomplete.
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// ResponseItem is an output message, or (Type "function_call") a tool
// call: CallID, Name and Arguments (JSON text).
type ResponseItem struct {
	Type    string         `json:"type"`
	ID      string         `json:"id"`
	Status  string         `json:"status"`
	Role    string         `json:"role"`
	Content []ResponsePart `json:"content"`

	CallID    string `json:"-"`
	Name      string `json:"-"`
	Arguments string `json:"-"`
}

// MarshalJSON writes a function_call item in its own shape.
func (it ResponseItem) MarshalJSON() ([]byte, error) {
	if it.Type == "function_call" {
		return json.Marshal(struct {
			Type      string `json:"type"`
			ID        string `json:"id"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
			Status    string `json:"status"`
		}{it.Type, it.ID, it.CallID, it.Name, it.Arguments, it.Status})
	}
	type plain ResponseItem
	return json.Marshal(plain(it))
}

// functionCallItems turns collected tool calls into output items.
func functionCallItems(calls []ToolCallDelta, status string) []ResponseItem {
	var out []ResponseItem
	for _, c := range calls {
		out = append(out, ResponseItem{Type: "function_call", ID: "fc_" + strings.TrimPrefix(c.ID, "call_"), Status: status,
			CallID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	return out
}

// ResponsePart is one output_text part.
type ResponsePart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

// ResponsesUsage is the Responses API's usage.
type ResponsesUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

// ResponsesToolChoice is /v1/responses' "tool_choice": "auto", "none",
// "required" or a forced function named flat, {"type":"function","name":…}
// (chat's nested {"function":{"name":…}} is not this API's shape).
type ResponsesToolChoice ToolChoice

// JSONKind implements JSONKinder.
func (ResponsesToolChoice) JSONKind() string {
	return `"auto", "none", "required" or {"type":"function","name":…}`
}

// UnmarshalJSON accepts "auto" | "none" | "required" | {"type":"function","name":…}.
func (t *ResponsesToolChoice) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		switch s {
		case "auto", "none", "required":
			*t = ResponsesToolChoice{Mode: s}
			return nil
		}
	}
	var o map[string]json.RawMessage
	var name string
	if json.Unmarshal(b, &o) != nil || len(o) != 2 || string(o["type"]) != `"function"` ||
		json.Unmarshal(o["name"], &name) != nil || name == "" {
		te := typeError(b, reflect.TypeFor[ResponsesToolChoice]())
		if s != "" {
			te.Value = fmt.Sprintf("string %q", s)
		}
		return te
	}
	*t = ResponsesToolChoice{Mode: "function", Name: name}
	return nil
}

func (h *Handler) responseObject(id string, r *ResponsesRequest, g *gen.Request, status string) ResponseObject {
	meta := r.Metadata
	if len(meta) == 0 {
		meta = json.RawMessage(`{}`)
	}
	o := ResponseObject{ID: id, Object: "response", CreatedAt: h.now().Unix(), Status: status, Instructions: r.Instructions,
		MaxOutputTokens: r.MaxOutputTokens, Model: g.Model, Output: []ResponseItem{}, ParallelToolCalls: true,
		Temperature: g.Sampling.Temperature, TopP: g.Sampling.TopP, ToolChoice: "auto", Tools: []any{},
		Text: map[string]any{"format": textFormat(r)}, Metadata: meta, Truncation: "disabled",
		Reasoning: map[string]any{"effort": nil, "summary": nil}, ServiceTier: "default"}
	if r.ParallelToolCalls != nil {
		o.ParallelToolCalls = *r.ParallelToolCalls
	}
	if c := r.ToolChoice; c != nil {
		o.ToolChoice = c.Mode
		if c.Mode == "function" {
			o.ToolChoice = map[string]string{"type": "function", "name": c.Name}
		}
	}
	if r.User != "" {
		u := r.User
		o.User = &u
	}
	return o
}

// textFormat is the response's text.format: the request's, or text.
func textFormat(r *ResponsesRequest) any {
	if r.Text == nil || r.Text.Format == nil {
		return map[string]any{"type": "text"}
	}
	return r.Text.Format
}

func responsesUsage(res gen.Result) *ResponsesUsage {
	return &ResponsesUsage{InputTokens: res.PromptTokens, InputTokensDetails: map[string]int{"cached_tokens": res.CachedTokens},
		OutputTokens: res.CompletionTokens, OutputTokensDetails: map[string]int{"reasoning_tokens": 0},
		TotalTokens: res.PromptTokens + res.CompletionTokens}
}

// finish sets o's final status and usage and returns its items' status.
func finish(o *ResponseObject, res gen.Result) string {
	o.Status = "completed"
	itemStatus := "completed"
	if res.FinishReason == "length" {
		o.Status, itemStatus = "incomplete", "incomplete"
		o.IncompleteDetails = &IncompleteDetails{Reason: "max_output_tokens"}
	}
	o.Usage = responsesUsage(res)
	return itemStatus
}

// messageItem is the answer's text as an output message.
func messageItem(msgID, status, text string) ResponseItem {
	return ResponseItem{Type: "message", ID: msgID, Status: status, Role: "assistant",
		Content: []ResponsePart{{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}}}
}

// outputItems collects a response's output items in the order the model
// produced them, as OpenAI's output lists them: a message item holds the
// text up to the next call, each function_call item one call, and text
// after a call is a new message item after it. The stream and the whole
// answer build their output with it, so they agree.
type outputItems struct {
	items []*outputItem
	calls map[int]*outputItem // a call's index → its item
	msgID func() string       // a new message item's id
}

// outputItem is a message (msgID, text) or a function call (call).
type outputItem struct {
	at    int // its output index
	msgID string
	text  strings.Builder
	call  *ToolCallDelta
}

// id is the item's id (a function call's from its call id).
func (it *outputItem) id() string {
	if it.call != nil {
		return "fc_" + strings.TrimPrefix(it.call.ID, "call_")
	}
	return it.msgID
}

// text adds t to the message item being written (a new one when the last
// item is not a message) and returns it, its output index and whether it
// was added now.
func (o *outputItems) addText(t string) (it *outputItem, at int, added bool) {
	if n := len(o.items); n > 0 && o.items[n-1].call == nil {
		it, at = o.items[n-1], n-1
	} else {
		it, at, added = &outputItem{at: n, msgID: o.msgID()}, n, true
		o.items = append(o.items, it)
	}
	it.text.WriteString(t)
	return it, at, added
}

// addCall adds a piece of call index (its item is added at its first
// piece) and returns the item, its output index and whether it was added
// now.
func (o *outputItems) addCall(index int, id, name, args string) (it *outputItem, at int, added bool) {
	if o.calls == nil {
		o.calls = map[int]*outputItem{}
	}
	it, ok := o.calls[index]
	if !ok {
		it, added = &outputItem{at: len(o.items), call: &ToolCallDelta{Type: "function"}}, true
		o.calls[index] = it
		o.items = append(o.items, it)
	}
	if id != "" {
		it.call.ID = id
	}
	it.call.Function.Name += name
	it.call.Function.Arguments += args
	return it, it.at, added
}

// output is the items with the given status; an answer with nothing at
// all is one empty message.
func (o *outputItems) output(status string) []ResponseItem {
	if len(o.items) == 0 {
		o.addText("")
	}
	out := make([]ResponseItem, len(o.items))
	for i, it := range o.items {
		if it.call != nil {
			out[i] = functionCallItems([]ToolCallDelta{*it.call}, status)[0]
		} else {
			out[i] = messageItem(it.msgID, status, it.text.String())
		}
	}
	return out
}

// responsesBuffer collects a non-streamed response's output.
type responsesBuffer struct{ out outputItems }

func (b *responsesBuffer) Start(int) error { return nil }
func (b *responsesBuffer) Text(t string, _ *gen.TokenLogprob) error {
	if t != "" {
		b.out.addText(t)
	}
	return nil
}

// ToolCall implements gen.ToolCallEmitter.
func (b *responsesBuffer) ToolCall(index int, id, name, args string) error {
	b.out.addCall(index, id, name, args)
	return nil
}

// responsesStream writes the Responses streaming events as text arrives.
// Items are added as their content begins (a message at its first text,
// each call at its start), numbered in that order (outputItems), so an
// answer that is only calls has no empty message item, as the
// non-streamed output has none.
type responsesStream struct {
	sse *SSEWriter
	seq int
	obj ResponseObject
	out outputItems
}

func (s *responsesStream) event(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = s.seq
	s.seq++
	return s.sse.NamedEvent(typ, fields)
}

func (s *responsesStream) Start(int) error {
	if err := s.event("response.created", map[string]any{"response": s.obj}); err != nil {
		return err
	}
	return s.event("response.in_progress", map[string]any{"response": s.obj})
}

// added announces a new message item and its output_text part.
func (s *responsesStream) added(it *outputItem, at int) error {
	if err := s.event("response.output_item.added", map[string]any{"output_index": at,
		"item": ResponseItem{Type: "message", ID: it.msgID, Status: "in_progress", Role: "assistant", Content: []ResponsePart{}}}); err != nil {
		return err
	}
	return s.event("response.content_part.added", map[string]any{"item_id": it.msgID, "output_index": at, "content_index": 0,
		"part": ResponsePart{Type: "output_text", Text: "", Annotations: []any{}, Logprobs: []any{}}})
}

// ToolCall implements gen.ToolCallEmitter: a function_call output item,
// its arguments streamed as deltas.
func (s *responsesStream) ToolCall(index int, id, name, args string) error {
	it, at, added := s.out.addCall(index, id, name, args)
	if added {
		item := functionCallItems([]ToolCallDelta{*it.call}, "in_progress")[0]
		item.Arguments = ""
		if err := s.event("response.output_item.added", map[string]any{"output_index": at, "item": item}); err != nil {
			return err
		}
	}
	if args == "" {
		return nil
	}
	return s.event("response.function_call_arguments.delta", map[string]any{"item_id": it.id(), "output_index": at, "delta": args})
}

func (s *responsesStream) Text(t string, _ *gen.TokenLogprob) error {
	if t == "" {
		return nil
	}
	it, at, added := s.out.addText(t)
	if added {
		if err := s.added(it, at); err != nil {
			return err
		}
	}
	return s.event("response.output_text.delta", map[string]any{"item_id": it.msgID, "output_index": at, "content_index": 0,
		"delta": t, "logprobs": []any{}})
}

// end closes every item in output order (an answer with nothing at all
// still gets its empty message) and returns the output.
func (s *responsesStream) end(status string) []ResponseItem {
	if len(s.out.items) == 0 {
		it, at, _ := s.out.addText("")
		_ = s.added(it, at)
	}
	out := s.out.output(status)
	for i, it := range out {
		if it.Type == "message" {
			_ = s.event("response.output_text.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "text": it.Content[0].Text, "logprobs": []any{}})
			_ = s.event("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "part": it.Content[0]})
		} else {
			_ = s.event("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": i, "arguments": it.Arguments})
		}
		_ = s.event("response.output_item.done", map[string]any{"output_index": i, "item": it})
	}
	return out
}

func (h *Handler) responses(w http.ResponseWriter, r *http.Request) {
	body, e := ReadBody(w, r)
	if e != nil {
		h.fail(w, "", e)
		return
	}
	if e := responsesItemTypes(body, h.AcceptTools); e != nil {
		h.fail(w, "", e)
		return
	}
	var req ResponsesRequest
	if e := decodeJSON(body, &req, responsesShape); e != nil {
		h.fail(w, "", e)
		return
	}
	if strings.TrimSpace(req.Model) == "" {
		h.fail(w, "", Errorf("model", "model is required"))
		return
	}
	if !h.served(req.Model) {
		h.fail(w, req.Model, UnknownModel(req.Model))
		return
	}
	g, e := h.convertResponses(&req)
	if e != nil {
		h.fail(w, req.Model, e)
		return
	}
	obj := h.responseObject(h.id("resp_"), &req, g, "in_progress")
	out := outputItems{msgID: func() string { return h.id("msg_") }}
	if !g.Stream {
		b := responsesBuffer{out: out}
		res, err := h.Gen.Generate(r.Context(), g, &b)
		if err != nil {
			h.fail(w, g.Model, inputParam(AsRequestError(r.Context(), err), &req))
			return
		}
		obj.Output = b.out.output(finish(&obj, res))
		writeJSON(w, http.StatusOK, obj)
		h.result(g.Model, http.StatusOK)
		return
	}
	sse := NewSSEWriter(w)
	st := &responsesStream{sse: sse, obj: obj, out: out}
	res, err := h.Gen.Generate(r.Context(), g, st)
	if err != nil {
		oe := inputParam(AsRequestError(r.Context(), err), &req)
		if !sse.Started() {
			h.fail(w, g.Model, oe)
			return
		}
		code := oe.Status
		if ClientGone(r.Context()) {
			code = 499
		} else {
			h.log().Warn("generation failed mid-stream", "model", g.Model, "err", err)
			failed := obj
			failed.Status = "failed"
			failed.Error = map[string]any{"code": "server_error", "message": oe.Message}
			_ = st.event("response.failed", map[string]any{"response": failed})
		}
		h.result(g.Model, code)
		return
	}
	obj.Output = st.end(finish(&obj, res))
	done := "response.completed"
	if obj.Status == "incomplete" {
		done = "response.incomplete"
	}
	_ = st.event(done, map[string]any{"response": obj})
	h.result(g.Model, http.StatusOK)
}

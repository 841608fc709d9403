// Package openai owns the OpenAI-compatible HTTP surface of a decode runner:
// the request and response types of /v1/chat/completions, /v1/completions,
// /v1/responses and /v1/models, their validation into a gen.Request (every
// field honoured or refused with a 400 naming its JSON path: see Shape),
// OpenAI-style error bodies (the *Error a generator returns keeps its
// status), the SSE writer for streaming, and an http.Handler that turns
// requests into calls on a gen.Generator. The checks every API shares
// (stops, max tokens, the assistant prefill, tools and tool choice, and
// the sampling ranges of gen.Defaults) are runners/gen's: the Validator
// calls them with this API's field names. The Anthropic adapter
// (runners/anthropic) reuses its strict decoding, errors and SSE writer,
// not its request types or Validator. It knows
// nothing about models, caches or the KV wire: the decode runner implements
// gen.Generator. It must not import the engine, kvwire or anything under
// supervisor/.
//
// Streaming: chunks are "chat.completion.chunk" (or "text_completion")
// objects written as `data: {json}\n\n`, ending with `data: [DONE]\n\n`.
// The first chat chunk carries {"role":"assistant","content":""}; the last
// content chunk carries finish_reason. Unlike OpenAI, a final usage chunk
// (choices: [], usage: {...}) is sent by default, because exo's clients
// (exo bench, dashboards) want token counts; a request that sets
// stream_options.include_usage to false does not get it.
//
// Sampling: gen.Defaults (the model's, then the cluster file's) under the
// request's fields; no seed means fresh randomness. Logprobs describe the
// model's own distribution (before sampling transforms).
//
// Accepted without effect (documented allow-list): user, metadata,
// store: false, parallel_tool_calls and tool_choice "none"/"auto"
// without tools, response_format {"type":"text"}, modalities ["text"];
// completions' echo: false, best_of: 1, suffix: ""; any field as null. tools, forced tool_choice and
// json_object/json_schema formats are parsed into gen.Request (the seam for
// constrained decoding) and refused until Handler.AcceptTools is set.
//
// Extensions (all optional, ignored by OpenAI clients that do not send them):
//   - top_k, min_p, repetition_penalty: sampling knobs as in vLLM.
//   - ignore_eos: keep generating past end-of-sequence tokens until
//     max_tokens (as in vLLM; used by exo bench).
//   - add_generation_prompt, continue_final_message (vLLM's): a final
//     assistant message is continued by default (assistant prefill).
//   - max_reasoning_tokens (chat): bounds the reasoning of a model that
//     reasons before a constrained answer (see ChatRequest).
//   - x_exo_disable_remote_prefill: prefill this request locally even when a
//     prefill runner is configured (exo bench --compare-local); the
//     Responses API (and runners/anthropic's Messages) take it too.
//   - x_exo_speculative: false: no speculative decoding for this request
//     (true, the default, lets the runner's --speculative apply); the
//     Responses API (and runners/anthropic's Messages) take it too.
//   - POST /tokenize {"model","messages"|"prompt","add_generation_prompt"}
//     → {"count","tokens","max_model_len"} and POST /detokenize
//     {"model","tokens"} → {"prompt"} (vLLM's shapes).
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// Message is one chat message. Content may be a string or an array of
// content parts ({"type":"text","text":"…"}); only text parts are accepted.
// An assistant message may carry tool_calls (and then content null); a
// "tool" message answers one of them by tool_call_id.
type Message struct {
	Role       string         `json:"role"`
	Content    Content        `json:"content"`
	Name       string         `json:"name,omitempty"`
	ToolCalls  List[ToolCall] `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	// ReasoningContent is an assistant turn's reasoning as this server
	// (and vLLM, llama.cpp) returned it; rendered where the model's chat
	// template reads it, else refused by the generator.
	ReasoningContent *string `json:"reasoning_content,omitempty"`
}

// ToolCall is one function call an assistant made (OpenAI's shape:
// arguments is a JSON text).
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names a function and its JSON-encoded arguments.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is one entry of a request's "tools".
type Tool struct {
	Type     string      `json:"type"`
	Function FunctionDef `json:"function"`
}

// FunctionDef describes a function the model may call; Parameters is a
// JSON Schema kept as raw JSON for the grammar engine.
type FunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ToolChoice is a parsed "tool_choice": Mode is "auto", "none",
// "required" or "function" (then Name is the function's name).
type ToolChoice struct {
	Mode string
	Name string
}

// JSONKind implements JSONKinder.
func (ToolChoice) JSONKind() string {
	return `"auto", "none", "required" or {"type":"function","function":{"name":…}}`
}

// UnmarshalJSON accepts "auto" | "none" | "required" |
// {"type":"function","function":{"name":…}}.
func (t *ToolChoice) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		switch s {
		case "auto", "none", "required":
			*t = ToolChoice{Mode: s}
			return nil
		}
		te := typeError(b, reflect.TypeFor[ToolChoice]())
		te.Value = fmt.Sprintf("string %q", s)
		return te
	}
	var o struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(b, &o); err != nil || o.Type != "function" || o.Function.Name == "" {
		return typeError(b, reflect.TypeFor[ToolChoice]())
	}
	*t = ToolChoice{Mode: "function", Name: o.Function.Name}
	return nil
}

// ResponseFormat is "response_format": type "text", "json_object" or
// "json_schema" (with JSONSchema).
type ResponseFormat struct {
	Type       string            `json:"type"`
	JSONSchema *JSONSchemaFormat `json:"json_schema,omitempty"`
}

// JSONSchemaFormat is response_format.json_schema; Schema stays raw JSON
// for the grammar engine.
type JSONSchemaFormat struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Content is message content, normalized to text.
type Content struct {
	Text string
	// Set reports whether the field was present and not null.
	Set bool
}

// JSONKind implements JSONKinder.
func (Content) JSONKind() string { return "a string or an array of text parts" }

// UnmarshalJSON accepts a string, null, or an array of text parts.
func (c *Content) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		*c = Content{}
		return nil
	}
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = Content{Text: s, Set: true}
		return nil
	}
	if valueKind(b) != "array" {
		return typeError(b, reflect.TypeFor[Content]())
	}
	var parts List[textPart]
	if err := json.Unmarshal(b, &parts); err != nil {
		return err
	}
	var buf bytes.Buffer
	for _, p := range parts {
		buf.WriteString(p.Text)
	}
	*c = Content{Text: buf.String(), Set: true}
	return nil
}

// textPart is a content part: {"type":"text","text":…} only.
type textPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// JSONKind implements JSONKinder.
func (textPart) JSONKind() string { return `a text part ({"type":"text","text":…})` }

// UnmarshalJSON refuses a part of another type.
func (p *textPart) UnmarshalJSON(b []byte) error {
	type plain textPart
	if err := json.Unmarshal(b, (*plain)(p)); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" { // the part is not an object
			return typeError(b, reflect.TypeFor[textPart]())
		}
		return err
	}
	if p.Type != "text" {
		te := typeError(b, reflect.TypeFor[textPart]())
		te.Value = fmt.Sprintf("part type %q (only \"text\" is supported)", p.Type)
		return te
	}
	return nil
}

// MarshalJSON writes the content as a string.
func (c Content) MarshalJSON() ([]byte, error) { return json.Marshal(c.Text) }

// StringList is a JSON string or array of strings (the "stop" field).
type StringList []string

// JSONKind implements JSONKinder.
func (StringList) JSONKind() string { return "a string or an array of strings" }

// UnmarshalJSON accepts null, a string or an array of strings.
func (s *StringList) UnmarshalJSON(b []byte) error {
	var one string
	switch valueKind(b) {
	case "null":
		*s = nil
		return nil
	case "string":
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = StringList{one}
		return nil
	case "array":
		var many List[string]
		if err := json.Unmarshal(b, &many); err != nil {
			return err
		}
		*s = StringList(many)
		return nil
	}
	return typeError(b, reflect.TypeFor[StringList]())
}

// Prompt is the "prompt" of /v1/completions: a string, or an array of token
// ids (OpenAI allows both). Arrays of several prompts are refused.
type Prompt struct {
	Text   string
	Tokens []int32
	IsIDs  bool
	Set    bool
}

// JSONKind implements JSONKinder.
func (Prompt) JSONKind() string { return "a string or an array of token ids" }

// UnmarshalJSON accepts a string, [string] (one element), or [int…] (or
// [[int…]], a batch of one).
func (p *Prompt) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		*p = Prompt{}
		return nil
	}
	var s string
	if json.Unmarshal(b, &s) == nil {
		*p = Prompt{Text: s, Set: true}
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return typeError(b, reflect.TypeFor[Prompt]())
	}
	if len(raw) == 1 && valueKind(raw[0]) == "string" {
		if err := json.Unmarshal(raw[0], &s); err != nil {
			return err
		}
		*p = Prompt{Text: s, Set: true}
		return nil
	}
	at := func(i int) string { return fmt.Sprintf("[%d]", i) }
	if len(raw) == 1 && valueKind(raw[0]) == "array" {
		var inner []json.RawMessage // a batch of one token-id list: that list
		if err := json.Unmarshal(raw[0], &inner); err == nil {
			raw, at = inner, func(i int) string { return fmt.Sprintf("[0][%d]", i) }
		}
	}
	ids := make([]int32, len(raw))
	for i, r := range raw {
		if valueKind(r) == "array" {
			te := typeError(b, reflect.TypeFor[Prompt]())
			te.Value = "several prompts (batched prompts are not supported)"
			return te
		}
		var v int64
		if err := json.Unmarshal(r, &v); err != nil {
			te := typeError(r, reflect.TypeFor[int32]())
			if te.Value == "number" {
				te.Value = "number " + string(bytes.TrimSpace(r))
			}
			te.Field = at(i)
			return te
		}
		if v < 0 || v > 1<<31-1 {
			return &json.UnmarshalTypeError{Value: fmt.Sprintf("number %d", v), Type: reflect.TypeFor[int32](), Field: at(i)}
		}
		ids[i] = int32(v)
	}
	*p = Prompt{Tokens: ids, IsIDs: true, Set: true}
	return nil
}

// StreamOptions is OpenAI's stream_options.
type StreamOptions struct {
	IncludeUsage *bool `json:"include_usage,omitempty"`
}

// SamplingFields are the request fields shared by chat and completions.
type SamplingFields struct {
	MaxTokens           *int               `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int               `json:"max_completion_tokens,omitempty"`
	Temperature         *float64           `json:"temperature,omitempty"`
	TopP                *float64           `json:"top_p,omitempty"`
	TopK                *int               `json:"top_k,omitempty"`
	MinP                *float64           `json:"min_p,omitempty"`
	RepetitionPenalty   *float64           `json:"repetition_penalty,omitempty"`
	PresencePenalty     *float64           `json:"presence_penalty,omitempty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty,omitempty"`
	LogitBias           map[string]float64 `json:"logit_bias,omitempty"`
	Seed                *int64             `json:"seed,omitempty"`
	N                   *int               `json:"n,omitempty"`
	Stop                StringList         `json:"stop,omitempty"`
	Stream              bool               `json:"stream,omitempty"`
	StreamOptions       *StreamOptions     `json:"stream_options,omitempty"`
	IgnoreEOS           bool               `json:"ignore_eos,omitempty"`
	// DisableRemotePrefill is exo's extension: prefill locally.
	DisableRemotePrefill bool `json:"x_exo_disable_remote_prefill,omitempty"`
	// Speculative is exo's extension: false turns speculative decoding
	// off for this request.
	Speculative *bool `json:"x_exo_speculative,omitempty"`

	// Harmless fields, accepted and documented as having no effect here:
	// user (an end-user id for the provider's abuse monitoring), metadata
	// (tags for stored completions; nothing is stored). store must be false.
	User     string          `json:"user,omitempty"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
	Store    *bool           `json:"store,omitempty"`
}

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	Model    string        `json:"model"`
	Messages List[Message] `json:"messages"`
	SamplingFields
	Logprobs    *bool `json:"logprobs,omitempty"`
	TopLogprobs *int  `json:"top_logprobs,omitempty"`

	Tools             List[Tool]      `json:"tools,omitempty"`
	ToolChoice        *ToolChoice     `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
	ResponseFormat    *ResponseFormat `json:"response_format,omitempty"`

	// Extensions (vLLM's): add_generation_prompt (default: true unless the
	// final message is continued) and continue_final_message (default: true
	// when the last message is the assistant's and add_generation_prompt is
	// not set to true).
	AddGenerationPrompt  *bool `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage *bool `json:"continue_final_message,omitempty"`

	// MaxReasoningTokens is exo's extension: with a constrained answer
	// (response_format, tool_choice required or named) on a model that
	// reasons first (harmony, <think>), the reasoning is ended after this
	// many tokens and the answer begins.
	MaxReasoningTokens *int `json:"max_reasoning_tokens,omitempty"`
	// Modalities is taken as ["text"] only (what this server writes).
	Modalities List[string] `json:"modalities,omitempty"`
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	Model  string `json:"model"`
	Prompt Prompt `json:"prompt"`
	SamplingFields
	// Logprobs is the legacy field: how many top alternatives to return
	// per token (0: only the chosen token's).
	Logprobs *int `json:"logprobs,omitempty"`
	// Echo, BestOf and Suffix are taken at their defaults only (false, 1,
	// ""); other values are refused by name.
	Echo   *bool   `json:"echo,omitempty"`
	BestOf *int    `json:"best_of,omitempty"`
	Suffix *string `json:"suffix,omitempty"`
}

// TokenizeRequest is the body of POST /tokenize (vLLM's shape).
type TokenizeRequest struct {
	Model                string        `json:"model"`
	Messages             List[Message] `json:"messages,omitempty"`
	Prompt               *string       `json:"prompt,omitempty"`
	AddGenerationPrompt  *bool         `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage *bool         `json:"continue_final_message,omitempty"`
}

// DetokenizeRequest is the body of POST /detokenize (vLLM's shape).
type DetokenizeRequest struct {
	Model  string      `json:"model"`
	Tokens List[int64] `json:"tokens"`
}

// DetokenizeResponse is the answer of POST /detokenize.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// TokenizeResponse is the answer of POST /tokenize.
type TokenizeResponse struct {
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Tokens      []int32 `json:"tokens"`
}

// Usage counts tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails.CachedTokens is how many prompt tokens came from
	// the decode runner's prefix cache (OpenAI's field).
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is OpenAI's usage.prompt_tokens_details.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ChatResponse is a non-streaming chat completion.
type ChatResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint,omitempty"`
	Choices           []ChatChoice `json:"choices"`
	Usage             *Usage       `json:"usage,omitempty"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int              `json:"index"`
	Message      *ResponseMessage `json:"message,omitempty"`
	Delta        *ResponseMessage `json:"delta,omitempty"`
	Logprobs     *ChatLogprobs    `json:"logprobs,omitempty"`
	FinishReason *string          `json:"finish_reason"`
}

// ChatLogprobs is choices[].logprobs of a chat completion.
type ChatLogprobs struct {
	Content []LogprobContent `json:"content"`
}

// LogprobContent is one generated token with its log-probability and the
// most likely alternatives. Bytes is a JSON array of byte values (a token
// may hold part of a UTF-8 sequence).
type LogprobContent struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative in top_logprobs.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// CompletionLogprobs is the legacy choices[].logprobs of /v1/completions.
// TextOffset is each token's byte offset in the completion text.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// ResponseMessage is the assistant message (or delta) in a response.
type ResponseMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	// ReasoningContent is the model's reasoning before its answer (a
	// harmony model's analysis channel), as vLLM and llama.cpp return it.
	ReasoningContent *string `json:"reasoning_content,omitempty"`
	// ToolCalls: a message's calls (non-streaming), or fragments of them
	// (a delta: the first of a call has id, type and the name; later ones
	// pieces of the arguments text).
	ToolCalls []ToolCallDelta `json:"tool_calls,omitempty"`
	// NullContent writes "content": null (a message that only calls
	// tools, as OpenAI answers it) where Content is nil.
	NullContent bool `json:"-"`
}

// MarshalJSON writes content null when NullContent asks for it.
func (m ResponseMessage) MarshalJSON() ([]byte, error) {
	type plain ResponseMessage
	if !m.NullContent || m.Content != nil {
		return json.Marshal(plain(m))
	}
	return json.Marshal(struct {
		Role             string          `json:"role,omitempty"`
		Content          *string         `json:"content"`
		ReasoningContent *string         `json:"reasoning_content,omitempty"`
		ToolCalls        []ToolCallDelta `json:"tool_calls,omitempty"`
	}{m.Role, nil, m.ReasoningContent, m.ToolCalls})
}

// ToolCallDelta is a tool call in a response: whole in a message, in
// fragments in a stream delta (then Index says which call).
type ToolCallDelta struct {
	Index    *int                `json:"index,omitempty"`
	ID       string              `json:"id,omitempty"`
	Type     string              `json:"type,omitempty"`
	Function FunctionCallPartial `json:"function"`
}

// FunctionCallPartial is a call's function: the name (on the first
// fragment) and arguments text (whole, or a piece).
type FunctionCallPartial struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// ChatChunk is one streamed chat.completion.chunk.
type ChatChunk struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint,omitempty"`
	Choices           []ChatChoice `json:"choices"`
	Usage             *Usage       `json:"usage,omitempty"`
}

// CompletionChoice is one choice of a text completion.
type CompletionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// CompletionResponse is a text completion (or, with Object
// "text_completion", one streamed chunk of it).
type CompletionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// ModelList is GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

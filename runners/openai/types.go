// Package openai owns the OpenAI-compatible HTTP surface of a decode runner:
// the request and response types of /v1/chat/completions, /v1/completions
// and /v1/models, their validation, OpenAI-style error bodies, the SSE
// writer for streaming, and an http.Handler that turns requests into calls
// on a Generator. It knows nothing about models, caches or the KV wire: the
// decode runner implements Generator. It must not import the engine,
// kvwire or anything under supervisor/.
//
// Streaming: chunks are "chat.completion.chunk" (or "text_completion")
// objects written as `data: {json}\n\n`, ending with `data: [DONE]\n\n`.
// The first chat chunk carries {"role":"assistant","content":""}; the last
// content chunk carries finish_reason. Unlike OpenAI, a final usage chunk
// (choices: [], usage: {...}) is sent by default, because exo's clients
// (exo bench, dashboards) want token counts; a request that sets
// stream_options.include_usage to false does not get it.
//
// Extensions (all optional, ignored by OpenAI clients that do not send them):
//   - top_k, min_p, repetition_penalty: sampling knobs as in vLLM.
//   - ignore_eos: keep generating past end-of-sequence tokens until
//     max_tokens (as in vLLM; used by exo bench).
//   - x_exo_disable_remote_prefill: prefill this request locally even when a
//     prefill runner is configured (exo bench --compare-local).
//   - POST /tokenize {"model","messages"|"prompt","add_generation_prompt"}
//     → {"count","tokens","max_model_len"} (vLLM's shape), so exo bench can
//     build token-exact prompts through the model's chat template.
package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Message is one chat message. Content may be a string or an array of
// content parts ({"type":"text","text":"…"}); only text parts are accepted.
type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
	Name    string  `json:"name,omitempty"`
}

// Content is message content, normalized to text.
type Content struct {
	Text string
	// Set reports whether the field was present and not null.
	Set bool
}

// UnmarshalJSON accepts a string, null, or an array of text parts.
func (c *Content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*c = Content{}
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = Content{Text: s, Set: true}
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return fmt.Errorf("content must be a string or an array of text parts")
	}
	var buf bytes.Buffer
	for _, p := range parts {
		if p.Type != "text" {
			return fmt.Errorf("content part type %q is not supported (only \"text\")", p.Type)
		}
		buf.WriteString(p.Text)
	}
	*c = Content{Text: buf.String(), Set: true}
	return nil
}

// MarshalJSON writes the content as a string.
func (c Content) MarshalJSON() ([]byte, error) { return json.Marshal(c.Text) }

// StringList is a JSON string or array of strings (the "stop" field).
type StringList []string

// UnmarshalJSON accepts null, a string or an array of strings.
func (s *StringList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*s = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = StringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("stop must be a string or an array of strings")
	}
	*s = many
	return nil
}

// Prompt is the "prompt" of /v1/completions: a string, or an array of token
// ids (OpenAI allows both). Arrays of several prompts are refused.
type Prompt struct {
	Text   string
	Tokens []int32
	IsIDs  bool
	Set    bool
}

// UnmarshalJSON accepts a string, [string] (one element), or [int…].
func (p *Prompt) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*p = Prompt{}
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*p = Prompt{Text: s, Set: true}
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("prompt must be a string or an array of token ids")
	}
	if len(raw) == 1 && len(bytes.TrimSpace(raw[0])) > 0 && bytes.TrimSpace(raw[0])[0] == '"' {
		var s string
		if err := json.Unmarshal(raw[0], &s); err != nil {
			return err
		}
		*p = Prompt{Text: s, Set: true}
		return nil
	}
	ids := make([]int32, len(raw))
	for i, r := range raw {
		var v int64
		if err := json.Unmarshal(r, &v); err != nil {
			return fmt.Errorf("prompt must be a string or one array of token ids (batched prompts are not supported)")
		}
		if v < 0 || v > 1<<31-1 {
			return fmt.Errorf("prompt token id %d out of range", v)
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
	MaxTokens           *int           `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int           `json:"max_completion_tokens,omitempty"`
	Temperature         *float64       `json:"temperature,omitempty"`
	TopP                *float64       `json:"top_p,omitempty"`
	TopK                *int           `json:"top_k,omitempty"`
	MinP                *float64       `json:"min_p,omitempty"`
	RepetitionPenalty   *float64       `json:"repetition_penalty,omitempty"`
	Seed                *int64         `json:"seed,omitempty"`
	N                   *int           `json:"n,omitempty"`
	Stop                StringList     `json:"stop,omitempty"`
	Stream              bool           `json:"stream,omitempty"`
	StreamOptions       *StreamOptions `json:"stream_options,omitempty"`
	IgnoreEOS           bool           `json:"ignore_eos,omitempty"`
	// DisableRemotePrefill is exo's extension: prefill locally.
	DisableRemotePrefill bool `json:"x_exo_disable_remote_prefill,omitempty"`
}

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	SamplingFields
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	Model  string `json:"model"`
	Prompt Prompt `json:"prompt"`
	SamplingFields
}

// TokenizeRequest is the body of POST /tokenize (vLLM's shape).
type TokenizeRequest struct {
	Model               string    `json:"model"`
	Messages            []Message `json:"messages,omitempty"`
	Prompt              *string   `json:"prompt,omitempty"`
	AddGenerationPrompt *bool     `json:"add_generation_prompt,omitempty"`
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
	FinishReason *string          `json:"finish_reason"`
}

// ResponseMessage is the assistant message (or delta) in a response.
type ResponseMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
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

// Package gen owns the protocol-neutral generation API of a decode runner:
// a validated Request (messages or a prompt, sampling, stops, tools and
// the constraints on the answer), the Result of a generation, the Emitter
// interfaces output is reported through, per-token logprobs, a model's
// sampling Defaults (and the limits every sampling value must keep), and
// the Generator interface the decode runner implements.
//
// The HTTP APIs (runners/openai, runners/anthropic) turn their requests
// into a Request and their responses out of what an Emitter receives; the
// decode runner (runners/decode) implements Generator. gen must not know
// any of them: no HTTP, no JSON wire shape of any API, no models, caches
// or KV wire. It imports only the standard library.
package gen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Request is a validated generation request.
type Request struct {
	Model string
	// Chat requests carry Messages; completions carry Prompt or PromptIDs.
	Chat      bool
	Messages  []Message
	Prompt    string
	PromptIDs []int32
	// AddGenerationPrompt opens a new assistant turn after Messages;
	// ContinueFinal instead renders the final (assistant) message open, so
	// generation continues it (no end-of-turn, no new turn). At most one
	// is true.
	AddGenerationPrompt bool
	ContinueFinal       bool
	// MaxTokens is the completion limit; 0 means "until an end token or the
	// context is full".
	MaxTokens            int
	Sampling             Sampling
	Stop                 []string
	IgnoreEOS            bool
	DisableRemotePrefill bool
	// NoSpeculation turns speculative decoding off for this request.
	NoSpeculation bool
	// Stream and IncludeUsage are how the caller answers (as the output
	// arrives; with token counts at the end); the generator ignores them.
	Stream       bool
	IncludeUsage bool
	// Logprobs asks for each generated token's log-probability and its
	// TopLogprobs (0–20) most likely alternatives.
	Logprobs    bool
	TopLogprobs int

	// Constrained generation: the tools the model may call, which it must
	// (ToolChoice nil: the model decides), whether it may call several
	// (ParallelToolCalls nil: yes) and the form of its answer
	// (ResponseFormat nil: free text). Callers refuse them where their
	// generator does not honour them.
	Tools             []Tool
	ToolChoice        *ToolChoice
	ParallelToolCalls *bool
	ResponseFormat    *ResponseFormat
	// MaxReasoningTokens (0: none) bounds the reasoning before a
	// constrained answer; the generator refuses it where it has no effect.
	MaxReasoningTokens int
}

// Message is a validated chat message. Role is system, user, assistant or
// tool. Content is "" for an assistant message that only calls tools;
// ToolCallID is set on "tool" messages; Reasoning is an assistant
// message's earlier reasoning (the generator renders it when the chat
// template reads reasoning, else refuses it by name).
type Message struct {
	Role, Content string
	Reasoning     string
	Name          string
	ToolCalls     []ToolCall
	ToolCallID    string
}

// ToolCall is one function call an assistant made; Arguments is a JSON
// text.
type ToolCall struct {
	ID, Name, Arguments string
}

// Tool is a function the model may call; Parameters is its JSON Schema,
// kept raw for the grammar engine. Strict: a schema the grammar engine
// cannot enforce is an error rather than left unconstrained.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
	Strict      bool
}

// ToolChoice says which tools the model must call: Mode is "auto",
// "none", "required" or "function" (then Name is the function's name).
type ToolChoice struct {
	Mode string
	Name string
}

// ResponseFormat constrains the answer: Type "text", "json_object" or
// "json_schema" (then Schema is the JSON Schema, kept raw, and Name the
// name the request gave it).
type ResponseFormat struct {
	Type   string
	Name   string
	Schema json.RawMessage
}

// Sampling holds validated sampling parameters (model defaults and the
// request applied).
type Sampling struct {
	Temperature, TopP float64
	TopK              int
	MinP              float64
	RepetitionPenalty float64
	PresencePenalty   float64
	FrequencyPenalty  float64
	// LogitBias maps token ids to a bias in [-100, 100]; the generator
	// checks the ids against its vocabulary.
	LogitBias map[int32]float32
	Seed      int64
	// SeedSet: the request gave a seed. Without one, every request draws
	// fresh randomness.
	SeedSet bool
}

// Defaults are a model's default sampling parameters (nil: not set). The
// decode runner fills them from the model (generation_config.json, GGUF
// general.sampling.*) overlaid by the cluster file's [models.defaults];
// request fields override them.
type Defaults struct {
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	RepetitionPenalty *float64
}

// Over returns d with every field set in o replacing d's.
func (d Defaults) Over(o Defaults) Defaults {
	if o.Temperature != nil {
		d.Temperature = o.Temperature
	}
	if o.TopP != nil {
		d.TopP = o.TopP
	}
	if o.TopK != nil {
		d.TopK = o.TopK
	}
	if o.MinP != nil {
		d.MinP = o.MinP
	}
	if o.RepetitionPenalty != nil {
		d.RepetitionPenalty = o.RepetitionPenalty
	}
	return d
}

// FieldError is a sampling value out of its range; Field names it as the
// request fields and flags do ("temperature", "top_p", …).
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return e.Msg }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Check validates d with the limits of Sampling.
func (d Defaults) Check() error {
	_, err := d.Sampling()
	return err
}

// Sampling returns the sampling parameters d gives (temperature 1, top_p
// 1, repetition_penalty 1 and no top_k or min_p where d has none), each
// checked against its range: a value outside it is a *FieldError. The
// penalties, logit bias and seed are left unset.
func (d Defaults) Sampling() (Sampling, error) {
	s := Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
	if t := d.Temperature; t != nil {
		if math.IsNaN(*t) || *t < 0 || *t > 2 {
			return Sampling{}, fieldErr("temperature", "temperature must be between 0 and 2, got %v", *t)
		}
		s.Temperature = *t
	}
	if p := d.TopP; p != nil {
		if math.IsNaN(*p) || *p <= 0 || *p > 1 {
			return Sampling{}, fieldErr("top_p", "top_p must be in (0, 1], got %v", *p)
		}
		s.TopP = *p
	}
	if k := d.TopK; k != nil {
		if *k < -1 {
			return Sampling{}, fieldErr("top_k", "top_k must be -1 (off), 0 (off) or positive, got %d", *k)
		}
		if *k > 0 {
			s.TopK = *k
		}
	}
	if m := d.MinP; m != nil {
		if math.IsNaN(*m) || *m < 0 || *m > 1 {
			return Sampling{}, fieldErr("min_p", "min_p must be in [0, 1], got %v", *m)
		}
		s.MinP = *m
	}
	if r := d.RepetitionPenalty; r != nil {
		if math.IsNaN(*r) || *r <= 0 || *r > 10 {
			return Sampling{}, fieldErr("repetition_penalty", "repetition_penalty must be in (0, 10], got %v", *r)
		}
		s.RepetitionPenalty = *r
	}
	return s, nil
}

// Result is what a generation produced.
type Result struct {
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	// FinishReason is "stop" (end token or stop sequence) or "length".
	FinishReason string
	// StopSequence is the stop sequence that ended the generation, if one
	// did.
	StopSequence string
}

// Emitter receives a generation's output. Start is called once, after the
// request is admitted and its prompt tokenized, before any text; Text is
// called with newly generated text (never a split UTF-8 rune), and, when
// the request asked for logprobs, with the log-probabilities of the token
// generated in that step (lp nil otherwise, and for text flushed at the
// end). Text may be "" with a non-nil lp (a token whose text is held back,
// e.g. the start of a UTF-8 rune or of a possible stop sequence). An error
// from either (the client went away) stops the generation.
type Emitter interface {
	Start(promptTokens int) error
	Text(s string, lp *TokenLogprob) error
}

// ToolCallEmitter is an Emitter that also takes tool calls as they are
// parsed from the output: call index starts with its id and name (args
// ""), then gets pieces of its arguments text (id and name "").
type ToolCallEmitter interface {
	Emitter
	ToolCall(index int, id, name, args string) error
}

// ReasoningEmitter is an Emitter that also takes the model's reasoning (a
// harmony model's analysis channel) apart from its answer text; an
// emitter that is not one drops reasoning.
type ReasoningEmitter interface {
	Emitter
	Reasoning(s string) error
}

// TokenLogprob is one generated token's log-probability under the model's
// distribution and its most likely alternatives (descending).
type TokenLogprob struct {
	Bytes   []byte
	Logprob float64
	Top     []TopToken
}

// TopToken is one alternative of a TokenLogprob.
type TopToken struct {
	Bytes   []byte
	Logprob float64
}

// Generator runs generations; the decode runner implements it.
type Generator interface {
	// Generate runs req, reporting output to em. An error returned before
	// em.Start decides the caller's answer (the HTTP APIs keep the status
	// of an *openai.Error; others are 500).
	Generate(ctx context.Context, req *Request, em Emitter) (Result, error)
	// Tokenize renders and tokenizes req's prompt as Generate would.
	Tokenize(ctx context.Context, req *Request) (tokens []int32, maxModelLen int, err error)
	// Detokenize turns token ids into text (ids outside the vocabulary are
	// an error naming "tokens").
	Detokenize(ctx context.Context, tokens []int32) (string, error)
}

// ErrUnavailable is what an error that ends a request because part of the
// serving group is down for now (a pipeline stage, a tensor rank) matches
// with errors.Is: the APIs answer it 503 with Retry-After, never 500, so a
// gateway retries the request elsewhere or a client later.
var ErrUnavailable = errors.New("temporarily unavailable")

// Unavailable returns an error with text msg that is ErrUnavailable under
// errors.Is (and is itself, for sentinels of its own package).
func Unavailable(msg string) error { return &unavailableError{msg} }

type unavailableError struct{ msg string }

func (e *unavailableError) Error() string        { return e.msg }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
)

// ChatMessage is a validated chat message.
type ChatMessage struct{ Role, Content string }

// Sampling holds validated sampling parameters (defaults applied).
type Sampling struct {
	Temperature, TopP float64
	TopK              int
	MinP              float64
	RepetitionPenalty float64
	Seed              int64
	SeedSet           bool
}

// GenRequest is a validated request for a Generator.
type GenRequest struct {
	Model string
	// Chat requests carry Messages; completions carry Prompt or PromptIDs.
	Chat      bool
	Messages  []ChatMessage
	Prompt    string
	PromptIDs []int32
	// MaxTokens is the completion limit; 0 means "until an end token or the
	// context is full".
	MaxTokens            int
	Sampling             Sampling
	Stop                 []string
	IgnoreEOS            bool
	DisableRemotePrefill bool
	Stream               bool
	IncludeUsage         bool
}

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 32 << 20

// decodeBody reads a JSON body into v with OpenAI-style errors.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) *Error {
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
	if len(bytes.TrimSpace(body)) == 0 {
		return Errorf("", "request body is empty; expected a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return Errorf("", "invalid JSON body: %v", err)
	}
	return nil
}

func validateSampling(f *SamplingFields, g *GenRequest) *Error {
	mt := f.MaxTokens
	param := "max_tokens"
	if f.MaxCompletionTokens != nil {
		mt, param = f.MaxCompletionTokens, "max_completion_tokens"
	}
	if mt != nil {
		if *mt < 1 {
			return Errorf(param, "%s must be at least 1, got %d", param, *mt)
		}
		g.MaxTokens = *mt
	}
	s := Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
	if t := f.Temperature; t != nil {
		if math.IsNaN(*t) || *t < 0 || *t > 2 {
			return Errorf("temperature", "temperature must be between 0 and 2, got %v", *t)
		}
		s.Temperature = *t
	}
	if p := f.TopP; p != nil {
		if math.IsNaN(*p) || *p <= 0 || *p > 1 {
			return Errorf("top_p", "top_p must be in (0, 1], got %v", *p)
		}
		s.TopP = *p
	}
	if k := f.TopK; k != nil {
		if *k < -1 {
			return Errorf("top_k", "top_k must be -1 (off), 0 (off) or positive, got %d", *k)
		}
		if *k > 0 {
			s.TopK = *k
		}
	}
	if m := f.MinP; m != nil {
		if math.IsNaN(*m) || *m < 0 || *m > 1 {
			return Errorf("min_p", "min_p must be in [0, 1], got %v", *m)
		}
		s.MinP = *m
	}
	if r := f.RepetitionPenalty; r != nil {
		if math.IsNaN(*r) || *r <= 0 || *r > 10 {
			return Errorf("repetition_penalty", "repetition_penalty must be in (0, 10], got %v", *r)
		}
		s.RepetitionPenalty = *r
	}
	if f.Seed != nil {
		s.Seed, s.SeedSet = *f.Seed, true
	}
	if f.N != nil && *f.N != 1 {
		return Errorf("n", "only n=1 is supported, got %d", *f.N)
	}
	if len(f.Stop) > 16 {
		return Errorf("stop", "at most 16 stop sequences, got %d", len(f.Stop))
	}
	for _, st := range f.Stop {
		if st == "" {
			return Errorf("stop", "stop sequences must not be empty")
		}
	}
	g.Sampling = s
	g.Stop = append([]string(nil), f.Stop...)
	g.IgnoreEOS = f.IgnoreEOS
	g.DisableRemotePrefill = f.DisableRemotePrefill
	g.Stream = f.Stream
	g.IncludeUsage = true
	if f.StreamOptions != nil && f.StreamOptions.IncludeUsage != nil {
		g.IncludeUsage = *f.StreamOptions.IncludeUsage
	}
	return nil
}

var validRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// ValidateChat checks a chat request and converts it. served reports
// whether a model name is served here.
func ValidateChat(r *ChatRequest, served func(string) bool) (*GenRequest, *Error) {
	if strings.TrimSpace(r.Model) == "" {
		return nil, Errorf("model", "model is required")
	}
	if !served(r.Model) {
		return nil, UnknownModel(r.Model)
	}
	if len(r.Messages) == 0 {
		return nil, Errorf("messages", "messages is required and must not be empty")
	}
	g := &GenRequest{Model: r.Model, Chat: true}
	for i, m := range r.Messages {
		if !validRoles[m.Role] {
			return nil, Errorf(fmt.Sprintf("messages[%d].role", i), "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, m.Role)
		}
		if !m.Content.Set {
			return nil, Errorf(fmt.Sprintf("messages[%d].content", i), "messages[%d].content is required", i)
		}
		role := m.Role
		if role == "developer" {
			role = "system"
		}
		g.Messages = append(g.Messages, ChatMessage{Role: role, Content: m.Content.Text})
	}
	if e := validateSampling(&r.SamplingFields, g); e != nil {
		return nil, e
	}
	return g, nil
}

// ValidateCompletion checks a completion request and converts it.
func ValidateCompletion(r *CompletionRequest, served func(string) bool) (*GenRequest, *Error) {
	if strings.TrimSpace(r.Model) == "" {
		return nil, Errorf("model", "model is required")
	}
	if !served(r.Model) {
		return nil, UnknownModel(r.Model)
	}
	if !r.Prompt.Set {
		return nil, Errorf("prompt", "prompt is required")
	}
	g := &GenRequest{Model: r.Model}
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
	if e := validateSampling(&r.SamplingFields, g); e != nil {
		return nil, e
	}
	return g, nil
}

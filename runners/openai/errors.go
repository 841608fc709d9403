package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/exo-pd/exo-pd/runners/gen"
)

// Error is an API error with the HTTP status it maps to. It marshals to
// OpenAI's body: {"error":{"message","type","param","code"}}.
type Error struct {
	Status  int
	Type    string // invalid_request_error, not_found_error, rate_limit_error, server_error, …
	Message string
	Param   string
	Code    string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

// ErrorBody is the JSON shape of an error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner object of ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Body returns the JSON body of e.
func (e *Error) Body() ErrorBody {
	d := ErrorDetail{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		p := e.Param
		d.Param = &p
	}
	if e.Code != "" {
		c := e.Code
		d.Code = &c
	}
	return ErrorBody{Error: d}
}

// Errorf makes an invalid_request_error (400) about param.
func Errorf(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// ErrQueueFull is what a gen.Generator returns when the runner's queue is
// full (429).
var ErrQueueFull = &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", Message: "the runner's request queue is full; retry later"}

// UnknownModel is the 404 for a model this runner does not serve.
func UnknownModel(name string) *Error {
	return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("the model %q does not exist or is not served here", name)}
}

// ContextTooLong is the 400 for a prompt (plus max_tokens) over the context.
func ContextTooLong(prompt, limit int) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "messages", Code: "context_length_exceeded",
		Message: fmt.Sprintf("the prompt has %d tokens; this model's context is %d tokens", prompt, limit)}
}

// asError converts any error into an *Error: itself if it is one, 503
// (Retry-After) for a part of the serving group that is down for now
// (gen.ErrUnavailable: a pipeline stage, a tensor rank), else 500
// server_error.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, gen.ErrUnavailable) {
		return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "unavailable", Message: err.Error()}
	}
	return &Error{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
}

// WriteError writes e as an HTTP response.
func WriteError(w http.ResponseWriter, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	if e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(e.Body())
}

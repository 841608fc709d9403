package kvwire

import (
	"errors"
	"fmt"
)

// Errors callers branch on with errors.Is. Every error returned by the
// client and the server wraps exactly one of them (or the caller's context
// error) with details.
var (
	// ErrBusy: the server's admission queue is full (or it is shutting
	// down); another endpoint may serve the request.
	ErrBusy = errors.New("kvwire: server busy")
	// ErrMismatch: the server's KV does not fit the client's model
	// (fingerprint, geometry, dtype or model name).
	ErrMismatch = errors.New("kvwire: model mismatch")
	// ErrAuth: authentication is required, missing or failed.
	ErrAuth = errors.New("kvwire: authentication failed")
	// ErrCorrupt: a framing, length, digest or ordering error.
	ErrCorrupt = errors.New("kvwire: corrupt stream")
	// ErrTimeout: a dial, idle or overall deadline passed.
	ErrTimeout = errors.New("kvwire: timeout")
	// ErrClosed: the peer closed the connection (or could not be reached)
	// before the stream completed.
	ErrClosed = errors.New("kvwire: connection closed")
	// ErrRemoteInternal: the server's producer failed.
	ErrRemoteInternal = errors.New("kvwire: remote internal error")
	// ErrVersion: the peer does not speak this protocol version (or is not
	// a kvwire peer at all).
	ErrVersion = errors.New("kvwire: protocol version mismatch")
	// ErrBadRequest: the request is malformed or beyond the limits.
	ErrBadRequest = errors.New("kvwire: bad request")
)

// Error codes carried by the Error frame (PROTOCOL.md §11).
const (
	codeBadRequest uint16 = 1
	codeBusy       uint16 = 2
	codeMismatch   uint16 = 3
	codeInternal   uint16 = 4
	codeAuth       uint16 = 5
	codeVersion    uint16 = 6
	codeTimeout    uint16 = 7
)

// codeError maps a wire error code to its sentinel.
func codeError(code uint16) error {
	switch code {
	case codeBadRequest:
		return ErrBadRequest
	case codeBusy:
		return ErrBusy
	case codeMismatch:
		return ErrMismatch
	case codeAuth:
		return ErrAuth
	case codeVersion:
		return ErrVersion
	case codeTimeout:
		return ErrTimeout
	}
	return ErrRemoteInternal
}

func codeName(code uint16) string {
	switch code {
	case codeBadRequest:
		return "bad_request"
	case codeBusy:
		return "busy"
	case codeMismatch:
		return "mismatch"
	case codeInternal:
		return "internal"
	case codeAuth:
		return "auth"
	case codeVersion:
		return "version"
	case codeTimeout:
		return "timeout"
	}
	return fmt.Sprintf("code %d", code)
}

// errorCode maps a local error to the wire code the server reports.
func errorCode(err error) uint16 {
	switch {
	case errors.Is(err, ErrBadRequest):
		return codeBadRequest
	case errors.Is(err, ErrBusy):
		return codeBusy
	case errors.Is(err, ErrMismatch):
		return codeMismatch
	case errors.Is(err, ErrAuth):
		return codeAuth
	case errors.Is(err, ErrVersion):
		return codeVersion
	case errors.Is(err, ErrTimeout):
		return codeTimeout
	}
	return codeInternal
}

// RemoteError is an Error frame received from the server. It wraps the
// sentinel for its code, so errors.Is(err, ErrBusy) works on it.
type RemoteError struct {
	Code   uint16
	Reason string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("kvwire: server error %s: %s", codeName(e.Code), e.Reason)
}

// Unwrap returns the sentinel of the code.
func (e *RemoteError) Unwrap() error { return codeError(e.Code) }

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

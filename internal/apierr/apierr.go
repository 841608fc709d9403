// Package apierr owns the facts about the served APIs' error bodies that
// both sides of exo need: the gateway (supervisor/gateway) writes its own
// errors and the runners (runners/anthropic) theirs, and a client must see
// the same error type for the same status from either. It holds constants
// and pure functions only, stands on the standard library, and must not
// import runners/ or supervisor/.
package apierr

import "net/http"

// StatusOverloaded is Anthropic's 529: the API is temporarily overloaded.
const StatusOverloaded = 529

// AnthropicType is the error.type of Anthropic's error body
// ({"type":"error","error":{"type","message"}}) for an HTTP status, as
// Anthropic's API documents them: 400 invalid_request_error (also "other
// 4XX status codes not listed"), 401 authentication_error, 402
// billing_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 500 api_error, 504
// timeout_error, 529 overloaded_error. 503, which Anthropic does not
// list, is exo's "shedding load" (a runner stopping, loading or full) and
// takes 529's overloaded_error; any other 5xx is api_error.
func AnthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, StatusOverloaded:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

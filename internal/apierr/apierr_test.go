package apierr

import "testing"

// TestAnthropicType: every status Anthropic's error reference lists maps to
// the type it lists; unlisted 4xx are invalid_request_error, unlisted 5xx
// api_error, and 503 (exo's load shedding) is overloaded_error.
func TestAnthropicType(t *testing.T) {
	for status, want := range map[int]string{
		400: "invalid_request_error",
		401: "authentication_error",
		402: "billing_error",
		403: "permission_error",
		404: "not_found_error",
		405: "invalid_request_error",
		413: "request_too_large",
		422: "invalid_request_error",
		429: "rate_limit_error",
		500: "api_error",
		502: "api_error",
		503: "overloaded_error",
		504: "timeout_error",
		529: "overloaded_error",
	} {
		if got := AnthropicType(status); got != want {
			t.Errorf("AnthropicType(%d) = %q, want %q", status, got, want)
		}
	}
}

package gateway

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuth(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("served")) })
	keyed := NewAuth(ok, []byte("s3cret"), []string{"/health"})
	open := NewAuth(ok, nil, nil)
	tests := []struct {
		name   string
		h      http.Handler
		path   string
		auth   string
		status int
		body   string
	}{
		{"no key configured", open, "/v1/models", "", 200, "served"},
		{"missing key", keyed, "/v1/models", "", 401, "missing API key"},
		{"wrong key", keyed, "/v1/chat/completions", "Bearer s3cres", 401, "invalid API key"},
		{"key as a prefix", keyed, "/v1/models", "Bearer s3cretX", 401, "invalid API key"},
		{"not bearer", keyed, "/v1/models", "Basic s3cret", 401, "missing API key"},
		{"right key", keyed, "/v1/models", "Bearer s3cret", 200, "served"},
		{"open path", keyed, "/health", "", 200, "served"},
		{"metrics not open here", keyed, "/metrics", "", 401, "missing API key"},
		{"x-api-key (Anthropic clients)", keyed, "/v1/messages", "x-api-key s3cret", 200, "served"},
		{"wrong x-api-key", keyed, "/v1/messages", "x-api-key nope", 401, "invalid API key"},
		{"Anthropic's shape on /v1/messages", keyed, "/v1/messages", "", 401, `{"error":{"message":"missing API key`},
		{"Anthropic's error type", keyed, "/v1/messages", "x-api-key nope", 401, `"type":"authentication_error"},"type":"error"}`},
		{"OpenAI's shape elsewhere", keyed, "/v1/chat/completions", "", 401, `"code":"invalid_api_key"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tt.path, nil)
			if k, ok := strings.CutPrefix(tt.auth, "x-api-key "); ok {
				req.Header.Set("X-Api-Key", k)
			} else if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			tt.h.ServeHTTP(rec, req)
			if rec.Code != tt.status || !strings.Contains(rec.Body.String(), tt.body) {
				t.Errorf("%d %s; want %d containing %q", rec.Code, rec.Body, tt.status, tt.body)
			}
			if rec.Code == 401 && rec.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	// A new key replaces the old one.
	keyed.SetKey([]byte("other"))
	req := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	rec := httptest.NewRecorder()
	keyed.ServeHTTP(rec, req)
	if rec.Code != 401 {
		t.Errorf("old key after SetKey: %d", rec.Code)
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "k")
	os.WriteFile(p, []byte("  abc\n"), 0o600)
	if k, err := ReadKeyFile(p); err != nil || string(k) != "abc" {
		t.Errorf("ReadKeyFile = %q, %v", k, err)
	}
	os.WriteFile(p, []byte("\n"), 0o600)
	if _, err := ReadKeyFile(p); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty file: %v", err)
	}
	if _, err := ReadKeyFile(filepath.Join(dir, "none")); err == nil {
		t.Error("missing file accepted")
	}
}

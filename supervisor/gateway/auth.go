package gateway

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
)

// ReadKeyFile reads an API key file ([api] api_key_file): the key is the
// file's content without surrounding white space, and must not be empty.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("api_key_file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("api_key_file %s is empty", path)
	}
	return b, nil
}

// Auth requires "Authorization: Bearer <key>" (or Anthropic clients'
// "x-api-key: <key>") on every request except to the open paths. The key can be replaced while serving (SetKey); with no
// key set every request passes.
type Auth struct {
	next http.Handler
	open []string
	hash atomic.Pointer[[sha256.Size]byte] // sha256 of the key; nil = no key
}

// NewAuth wraps next; open are paths served without the key.
func NewAuth(next http.Handler, key []byte, open []string) *Auth {
	a := &Auth{next: next, open: slices.Clone(open)}
	a.SetKey(key)
	return a
}

// SetKey replaces the key (nil or empty: no key required).
func (a *Auth) SetKey(key []byte) {
	if len(key) == 0 {
		a.hash.Store(nil)
		return
	}
	h := sha256.Sum256(key)
	a.hash.Store(&h)
}

func (a *Auth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	want := a.hash.Load()
	if want == nil || slices.Contains(a.open, r.URL.Path) {
		a.next.ServeHTTP(w, r)
		return
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if x := r.Header.Get("X-Api-Key"); !ok && x != "" { // Anthropic SDKs send the key here
		tok, ok = x, true
	}
	// Both sides are hashed first, so the comparison takes the same time
	// whatever the length or content of what the client sent.
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	if !ok || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="exo"`)
		msg := "missing API key: send \"Authorization: Bearer <key>\" (the key is in the file named by [api] api_key_file)"
		if ok {
			msg = "invalid API key"
		}
		APIError(w, r, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", msg)
		return
	}
	a.next.ServeHTTP(w, r)
}

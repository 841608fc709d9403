package openai

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/exo-pd/exo-pd/runners/gen"
)

// TestAsErrorStatus: an error that wraps a part of the serving group being
// down (gen.ErrUnavailable: a pipeline stage's ring, a tensor group) is a
// 503 with Retry-After, an API error keeps its own status, anything else is
// a 500.
func TestAsErrorStatus(t *testing.T) {
	down := gen.Unavailable("stage link: ring down")
	for _, tc := range []struct {
		name  string
		err   error
		want  int
		retry bool
	}{
		{"ring down", fmt.Errorf("local prefill: %w", down), http.StatusServiceUnavailable, true},
		{"wrapped twice", fmt.Errorf("decode step 3: %w", fmt.Errorf("%w: rank 1 lost", down)), http.StatusServiceUnavailable, true},
		{"the sentinel", gen.ErrUnavailable, http.StatusServiceUnavailable, true},
		{"api error", fmt.Errorf("x: %w", Errorf("messages", "bad")), http.StatusBadRequest, false},
		{"other", errors.New("index out of range"), http.StatusInternalServerError, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := asError(tc.err)
			if e.Status != tc.want {
				t.Fatalf("status %d, want %d (%+v)", e.Status, tc.want, e)
			}
			w := httptest.NewRecorder()
			WriteError(w, e)
			if got := w.Header().Get("Retry-After") != ""; got != tc.retry {
				t.Errorf("Retry-After present %v, want %v", got, tc.retry)
			}
			if w.Code != tc.want {
				t.Errorf("written %d, want %d", w.Code, tc.want)
			}
		})
	}
	if !errors.Is(down, gen.ErrUnavailable) || errors.Is(errors.New("stage link: ring down"), gen.ErrUnavailable) {
		t.Error("gen.Unavailable's errors.Is")
	}
}

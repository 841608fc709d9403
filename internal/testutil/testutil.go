// Package testutil holds the helpers tests share across runners/ and
// supervisor/ (which must not import each other): waiting on state with a
// deadline instead of sleeping. It must not import any package of this
// module, and only tests import it.
package testutil

import (
	"testing"
	"time"
)

// Until polls cond until it reports true or timeout has passed, and says
// which. The pause between polls grows from 1 ms to 50 ms: a condition that
// holds at once costs nothing, one that takes seconds is not polled hot.
// It is safe on any goroutine.
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond() // one last look: the deadline may have passed while it became true
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// Eventually fails the test (t.Fatalf, so only on the test goroutine) when
// cond has not reported true within timeout; what (formatted with args)
// says what was waited for.
func Eventually(t testing.TB, cond func() bool, timeout time.Duration, what string, args ...any) {
	t.Helper()
	if !Until(timeout, cond) {
		t.Fatalf("after %v: "+what, append([]any{timeout}, args...)...)
	}
}

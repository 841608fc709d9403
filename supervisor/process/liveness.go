package process

import (
	"fmt"
	"time"
)

// Liveness decides when a runner whose /health went unanswered must be
// stopped and restarted. A runner serves /health from its own goroutine,
// off the model's thread, so a long generation or a slow load still
// answers; silence means the process is stopped, hung or swapping. It is a
// small value with no clock of its own (callers pass now), table-tested.
type Liveness struct {
	// Ready is the silence allowed once the runner has answered 200
	// (default 10 s).
	Ready time.Duration
	// Starting is the silence allowed before that (default 2 min): the
	// process may still be starting up; a loading runner answers 503
	// "loading", which counts as an answer.
	Starting time.Duration
}

// withDefaults fills zero fields; a negative field turns that check off.
func (l Liveness) withDefaults() Liveness {
	if l.Ready == 0 {
		l.Ready = 10 * time.Second
	}
	if l.Starting == 0 {
		l.Starting = 2 * time.Minute
	}
	return l
}

// limit is the silence allowed after a runner was (wasReady) or was never
// ready; 0 means no limit.
func (l Liveness) limit(wasReady bool) time.Duration {
	d := l.Starting
	if wasReady {
		d = l.Ready
	}
	return max(d, 0)
}

// Dead reports whether a runner last heard from at lastAnswer (or started
// then) has been silent past its limit at now, and says why.
func (l Liveness) Dead(wasReady bool, lastAnswer, now time.Time) (bool, string) {
	lim := l.limit(wasReady)
	silent := now.Sub(lastAnswer)
	if lim <= 0 || silent < lim {
		return false, ""
	}
	what := "before it was ever ready"
	if wasReady {
		what = "after it was ready"
	}
	return true, fmt.Sprintf("liveness: /health unanswered for %s %s (limit %s)", silent.Round(100*time.Millisecond), what, lim)
}

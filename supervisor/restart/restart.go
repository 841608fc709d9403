// Package restart owns the restart policy of runner processes as a pure
// value: how long to wait before restarting a runner that exited, and when a
// runner is crash-looping. It has no clock, no randomness and no processes of
// its own: callers pass the time and a jitter sample in, which makes every
// decision table-testable. It must not import other supervisor packages.
package restart

import (
	"math"
	"time"
)

// Policy decides restart delays.
type Policy struct {
	// Attempts is how many exits within Interval are tolerated; one more and
	// the runner is crash-looping.
	Attempts int
	Interval time.Duration
	// Initial is the first backoff; each consecutive failure doubles it up to Max.
	Initial, Max time.Duration
	// Jitter spreads each delay by ±Jitter (a fraction, e.g. 0.2 = ±20%).
	Jitter float64
	// StableAfter: a run at least this long resets the backoff and clears the
	// crash loop.
	StableAfter time.Duration
	// CrashLoopDelay is the delay between attempts while crash-looping (the
	// runner keeps being retried, slowly, so a fixed fault heals by itself).
	CrashLoopDelay time.Duration
}

// Default is the supervisor's policy.
func Default() Policy {
	return Policy{
		Attempts: 5, Interval: 2 * time.Minute,
		Initial: 250 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.2,
		StableAfter: time.Minute, CrashLoopDelay: time.Minute,
	}
}

// Tracker is one runner's restart history. The zero value is a runner that
// has never failed. Trackers are values: Exit returns the next one.
type Tracker struct {
	exits       []time.Time // exits within the policy's Interval
	consecutive int         // exits since the last stable run
	crashLoop   bool
}

// CrashLoop reports whether the runner is crash-looping.
func (t Tracker) CrashLoop() bool { return t.crashLoop }

// Consecutive is the number of failures since the last stable run.
func (t Tracker) Consecutive() int { return t.consecutive }

// Exit records that the runner exited at now after running for ranFor, and
// returns the new tracker and how long to wait before starting it again.
// jitter is a sample in [0, 1) (0.5 = no jitter).
func (p Policy) Exit(t Tracker, now time.Time, ranFor time.Duration, jitter float64) (Tracker, time.Duration) {
	if ranFor >= p.StableAfter {
		t = Tracker{}
	}
	kept := make([]time.Time, 0, len(t.exits)+1)
	for _, e := range t.exits {
		if now.Sub(e) < p.Interval {
			kept = append(kept, e)
		}
	}
	t.exits = append(kept, now)
	t.consecutive++
	if len(t.exits) > p.Attempts {
		t.crashLoop = true
	}
	var d time.Duration
	if t.crashLoop {
		d = p.CrashLoopDelay
	} else {
		f := float64(p.Initial) * math.Pow(2, float64(t.consecutive-1))
		d = time.Duration(min(f, float64(p.Max)))
	}
	d = time.Duration(float64(d) * (1 + p.Jitter*(2*jitter-1)))
	return t, d
}

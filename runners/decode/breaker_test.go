package decode

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// TestBreaker drives one endpoint's breaker through a script of fetch
// and probe outcomes with a fake clock.
func TestBreaker(t *testing.T) {
	timeout := fmt.Errorf("%w: hello: i/o timeout", kvwire.ErrTimeout)
	closed := fmt.Errorf("%w: connection refused", kvwire.ErrClosed)
	busy := &kvwire.RemoteError{Code: 2, Reason: "queue full"}
	mismatch := fmt.Errorf("%w: fingerprint", kvwire.ErrMismatch)
	corrupt := fmt.Errorf("%w: crc", kvwire.ErrCorrupt)
	cancelled := fmt.Errorf("kvwire: %w", context.Canceled)
	type step struct {
		fetch, probe bool
		err          error
		gap          time.Duration
		want         BreakerState
		wantIdle     time.Duration
	}
	cases := []struct {
		name  string
		steps []step
		trips int
	}{
		{"success stays closed", []step{{fetch: true, want: Closed}}, 0},
		{"timeout opens", []step{{fetch: true, err: timeout, want: Open}}, 1},
		{"connection failure opens", []step{{fetch: true, err: closed, want: Open}}, 1},
		{"busy is not a failure", []step{{fetch: true, err: busy, want: Closed}, {fetch: true, err: busy, want: Closed}}, 0},
		{"mismatch and corrupt do not open", []step{{fetch: true, err: mismatch, want: Closed}, {fetch: true, err: corrupt, want: Closed}}, 0},
		{"caller cancellation does not open", []step{{fetch: true, err: cancelled, want: Closed}}, 0},
		{"failed probe keeps it open", []step{{fetch: true, err: timeout, want: Open}, {probe: true, err: timeout, want: Open}}, 1},
		{"answered probe closes", []step{{fetch: true, err: timeout, want: Open}, {probe: true, want: Closed}}, 1},
		{"reopens after a later failure", []step{
			{fetch: true, err: timeout, want: Open}, {probe: true, want: Closed}, {fetch: true, err: closed, want: Open}}, 2},
		{"a straggling success closes an open circuit", []step{{fetch: true, err: timeout, want: Open}, {fetch: true, want: Closed}}, 1},
		{"idle: floor before measurement", []step{{fetch: true, want: Closed, wantIdle: 3 * time.Second}}, 0},
		{"idle: factor × gap above the floor", []step{{fetch: true, gap: 2 * time.Second, want: Closed, wantIdle: 8 * time.Second}}, 0},
		{"idle: small gaps stay at the floor", []step{{fetch: true, gap: 100 * time.Millisecond, want: Closed, wantIdle: 3 * time.Second}}, 0},
		{"idle: capped", []step{{fetch: true, gap: time.Minute, want: Closed, wantIdle: 30 * time.Second}}, 0},
		{"idle: moving average", []step{
			{fetch: true, gap: 2 * time.Second, want: Closed, wantIdle: 8 * time.Second},
			{fetch: true, gap: 6 * time.Second, want: Closed, wantIdle: 12 * time.Second}}, 0},
		{"idle: failed fetches do not measure", []step{
			{fetch: true, gap: 2 * time.Second, want: Closed, wantIdle: 8 * time.Second},
			{fetch: true, gap: 20 * time.Second, err: corrupt, want: Closed, wantIdle: 8 * time.Second}}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			var changes []BreakerState
			b := NewBreaker([]string{"a:1", "b:1"}, BreakerOptions{Now: func() time.Time { return now },
				OnChange: func(addr string, s BreakerState) {
					if addr != "a:1" {
						t.Errorf("change reported for %s", addr)
					}
					changes = append(changes, s)
				}})
			last := Closed
			wantChanges := 0
			for i, s := range tc.steps {
				now = now.Add(time.Second)
				if s.fetch {
					b.Report("a:1", kvwire.Stats{MaxGap: s.gap}, s.err)
				}
				if s.probe {
					b.Probed("a:1", s.err)
				}
				st := b.Status()[0]
				if st.State != s.want || b.Allow("a:1") != (s.want == Closed) {
					t.Fatalf("step %d: state %s (allow %v), want %s", i, st.State, b.Allow("a:1"), s.want)
				}
				if s.want != last {
					wantChanges++
					if !st.Since.Equal(now) {
						t.Fatalf("step %d: since %v, want %v", i, st.Since, now)
					}
				}
				last = s.want
				if s.wantIdle != 0 && b.Idle("a:1") != s.wantIdle {
					t.Fatalf("step %d: idle %v, want %v", i, b.Idle("a:1"), s.wantIdle)
				}
			}
			if len(changes) != wantChanges {
				t.Fatalf("OnChange called %d times (%v), want %d", len(changes), changes, wantChanges)
			}
			st := b.Status()
			if st[0].Trips != tc.trips {
				t.Fatalf("trips %d, want %d", st[0].Trips, tc.trips)
			}
			if st[1].State != Closed || !b.Allow("b:1") {
				t.Fatalf("the other endpoint changed: %+v", st[1])
			}
			open := b.OpenEndpoints()
			if (last == Open) != (len(open) == 1 && open[0] == "a:1") {
				t.Fatalf("OpenEndpoints %v with state %s", open, last)
			}
		})
	}
}

// TestBreakerUnknownEndpoint: an address not given to NewBreaker is
// allowed and its reports are ignored.
func TestBreakerUnknownEndpoint(t *testing.T) {
	b := NewBreaker([]string{"a:1", "a:1"}, BreakerOptions{})
	b.Report("x:1", kvwire.Stats{}, kvwire.ErrTimeout)
	b.Probed("x:1", nil)
	if !b.Allow("x:1") || len(b.Status()) != 1 || len(b.OpenEndpoints()) != 0 {
		t.Fatalf("unknown endpoint changed the breaker: %+v", b.Status())
	}
}

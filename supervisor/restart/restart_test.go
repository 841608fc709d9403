package restart

import (
	"testing"
	"time"
)

func TestPolicy(t *testing.T) {
	p := Policy{Attempts: 3, Interval: time.Minute, Initial: time.Second, Max: 5 * time.Second,
		Jitter: 0.5, StableAfter: 30 * time.Second, CrashLoopDelay: 20 * time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at        time.Duration // since t0
		ranFor    time.Duration
		jitter    float64
		wantDelay time.Duration
		wantLoop  bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"exponential backoff, capped", []step{
			{0, time.Second, 0.5, 1 * time.Second, false},
			{2 * time.Second, time.Second, 0.5, 2 * time.Second, false},
			{5 * time.Second, time.Second, 0.5, 4 * time.Second, false},
		}},
		{"jitter spreads both ways", []step{
			{0, time.Second, 0, 500 * time.Millisecond, false},
			{2 * time.Second, time.Second, 1, 3 * time.Second, false},
		}},
		{"cap", []step{
			{0, 0, 0.5, time.Second, false}, {1 * time.Hour, 0, 0.5, 2 * time.Second, false},
			{2 * time.Hour, 0, 0.5, 4 * time.Second, false}, {3 * time.Hour, 0, 0.5, 5 * time.Second, false},
			{4 * time.Hour, 0, 0.5, 5 * time.Second, false},
		}},
		{"crash loop after Attempts+1 exits in Interval", []step{
			{0, 0, 0.5, 1 * time.Second, false},
			{1 * time.Second, 0, 0.5, 2 * time.Second, false},
			{3 * time.Second, 0, 0.5, 4 * time.Second, false},
			{7 * time.Second, 0, 0.5, 20 * time.Second, true},
			{27 * time.Second, 0, 0.5, 20 * time.Second, true},
		}},
		{"crash loop stays until a stable run, which resets", []step{
			{0, 0, 0.5, 1 * time.Second, false},
			{1 * time.Second, 0, 0.5, 2 * time.Second, false},
			{2 * time.Second, 0, 0.5, 4 * time.Second, false},
			{3 * time.Second, 0, 0.5, 20 * time.Second, true},
			{5 * time.Minute, 10 * time.Second, 0.5, 20 * time.Second, true},
			{10 * time.Minute, time.Hour, 0.5, 1 * time.Second, false},
		}},
		{"exits spread wider than Interval never loop", []step{
			{0, 0, 0.5, 1 * time.Second, false},
			{40 * time.Second, 0, 0.5, 2 * time.Second, false},
			{80 * time.Second, 0, 0.5, 4 * time.Second, false},
			{120 * time.Second, 0, 0.5, 5 * time.Second, false},
			{160 * time.Second, 0, 0.5, 5 * time.Second, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tr Tracker
			for i, s := range tt.steps {
				var d time.Duration
				tr, d = p.Exit(tr, t0.Add(s.at), s.ranFor, s.jitter)
				if d != s.wantDelay || tr.CrashLoop() != s.wantLoop {
					t.Errorf("step %d: delay %v crashLoop %v, want %v %v", i, d, tr.CrashLoop(), s.wantDelay, s.wantLoop)
				}
			}
		})
	}
}

func TestTrackerIsAValue(t *testing.T) {
	p := Default()
	now := time.Unix(1000, 0)
	a, _ := p.Exit(Tracker{}, now, 0, 0.5)
	b, _ := p.Exit(a, now.Add(time.Second), 0, 0.5)
	if a.Consecutive() != 1 || b.Consecutive() != 2 {
		t.Fatalf("consecutive a=%d b=%d", a.Consecutive(), b.Consecutive())
	}
}

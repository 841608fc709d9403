package runner

import (
	"testing"
	"time"
)

func TestIdleTrim(t *testing.T) {
	t0 := time.Unix(100, 0)
	type step struct {
		at   time.Duration
		busy bool
		trim bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"never busy: never trims", []step{{0, false, false}, {10 * time.Second, false, false}}},
		{"trims once after a burst", []step{{0, true, false}, {time.Second, false, false}, {5 * time.Second, false, true}, {20 * time.Second, false, false}}},
		{"busy again before idleFor: waits", []step{{0, true, false}, {4 * time.Second, true, false}, {8 * time.Second, false, false}, {9 * time.Second, false, true}}},
		{"each burst trims once", []step{{0, true, false}, {5 * time.Second, false, true}, {6 * time.Second, true, false}, {11 * time.Second, false, true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := idleTrim{idleFor: 5 * time.Second}
			for i, s := range tc.steps {
				if got := tr.tick(t0.Add(s.at), s.busy); got != s.trim {
					t.Fatalf("step %d: trim %v, want %v", i, got, s.trim)
				}
			}
		})
	}
}

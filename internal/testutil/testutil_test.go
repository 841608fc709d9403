package testutil

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	var n atomic.Int32
	cases := []struct {
		name string
		cond func() bool
		want bool
	}{
		{"at once", func() bool { return true }, true},
		{"after three polls", func() bool { return n.Add(1) >= 3 }, true},
		{"never", func() bool { return false }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Until(20*time.Millisecond, tc.cond); got != tc.want {
				t.Fatalf("Until = %v, want %v", got, tc.want)
			}
		})
	}
}

// fakeTB records a failure instead of ending the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = format
}

func TestEventually(t *testing.T) {
	f := &fakeTB{TB: t}
	Eventually(f, func() bool { return true }, time.Second, "never shown")
	if f.failed != "" {
		t.Fatalf("a condition that held failed the test: %q", f.failed)
	}
	Eventually(f, func() bool { return false }, time.Millisecond, "the %s", "thing")
	if f.failed == "" {
		t.Fatal("a condition that never held did not fail the test")
	}
}

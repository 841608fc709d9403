package hf

import (
	"testing"
	"time"
)

func TestMeter(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := NewMeter(10 * time.Second)
	const mib = 1 << 20
	steps := []struct {
		at          time.Duration
		done, total int64
		want        string
	}{
		{0, 0, 100 * mib, "       0 B / 100.0 MiB   0%        0 B/s  ETA -"},
		{time.Second, 10 * mib, 100 * mib, "  10.0 MiB / 100.0 MiB  10%   10.0 MiB/s  ETA 9s"},
		{2 * time.Second, 30 * mib, 100 * mib, "  30.0 MiB / 100.0 MiB  30%   15.0 MiB/s  ETA 5s"},
		{4 * time.Second, 100 * mib, 100 * mib, " 100.0 MiB / 100.0 MiB 100%   25.0 MiB/s  done"},
	}
	for _, s := range steps {
		if got := m.Line(t0.Add(s.at), s.done, s.total); got != s.want {
			t.Errorf("at %v: %q\n                want %q", s.at, got, s.want)
		}
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

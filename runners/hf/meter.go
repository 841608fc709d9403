package hf

import (
	"fmt"
	"strings"
	"time"
)

// Meter turns (done, total) samples into a one-line progress report with
// rate and ETA, for `exo model pull` and runner logs. The rate is averaged
// over a sliding window of recent samples. Not safe for concurrent use
// (Options.Progress is called from one goroutine at a time).
type Meter struct {
	window  time.Duration
	samples []sample
}

type sample struct {
	t    time.Time
	done int64
}

// NewMeter returns a Meter averaging the rate over the last window.
func NewMeter(window time.Duration) *Meter { return &Meter{window: window} }

// Line records a sample taken at now and renders it, e.g.
// "  1.5 GiB / 16.4 GiB   9%  112.0 MiB/s  ETA 2m16s".
func (m *Meter) Line(now time.Time, done, total int64) string {
	m.samples = append(m.samples, sample{now, done})
	for len(m.samples) > 2 && now.Sub(m.samples[1].t) >= m.window {
		m.samples = m.samples[1:]
	}
	first := m.samples[0]
	var rate float64
	if dt := now.Sub(first.t).Seconds(); dt > 0 && done >= first.done {
		rate = float64(done-first.done) / dt
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%10s / %s", Bytes(done), Bytes(total))
	if total > 0 {
		fmt.Fprintf(&b, " %3d%%", done*100/total)
	}
	fmt.Fprintf(&b, " %10s/s", Bytes(int64(rate)))
	switch {
	case total > 0 && done >= total:
		b.WriteString("  done")
	case rate > 0 && total > 0:
		eta := time.Duration(float64(total-done) / rate * float64(time.Second))
		fmt.Fprintf(&b, "  ETA %s", eta.Round(time.Second))
	default:
		b.WriteString("  ETA -")
	}
	return b.String()
}

// Bytes formats a byte count with binary units ("512 B", "1.5 GiB").
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

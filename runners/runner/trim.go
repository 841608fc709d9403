package runner

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"
)

// idleTrim decides when a runner returns freed heap memory to the OS: once
// after each burst of work, when it has been idle for idleFor. Go's own
// scavenger gives memory back slowly; after a burst of many concurrent
// streams that leaves RSS well above the idle level for minutes. A value
// with no clock of its own (tick takes now), table-tested.
type idleTrim struct {
	idleFor  time.Duration
	lastBusy time.Time
	dirty    bool // busy since the last trim
}

// tick records whether the runner is busy at now and reports whether to
// trim now.
func (t *idleTrim) tick(now time.Time, busy bool) bool {
	if busy {
		t.lastBusy, t.dirty = now, true
		return false
	}
	if t.dirty && now.Sub(t.lastBusy) >= t.idleFor {
		t.dirty = false
		return true
	}
	return false
}

// trimWhenIdle polls load every second until ctx ends and calls
// debug.FreeOSMemory once per burst, idleFor after it ended.
func trimWhenIdle(ctx context.Context, load func() (waiting, running int), idleFor time.Duration, log *slog.Logger) {
	tr := idleTrim{idleFor: idleFor}
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			w, r := load()
			if tr.tick(now, w+r > 0) {
				t0 := time.Now()
				debug.FreeOSMemory()
				log.Debug("idle: returned freed memory to the OS", "took", time.Since(t0))
			}
		}
	}
}

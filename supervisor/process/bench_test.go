package process

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/restart"
)

// BenchmarkCrashToReady measures how long a runner that died (SIGKILL) takes
// to be running and answering /health again: exit noticed, group cleaned,
// process re-executed, /health polled. The backoff is 1 ms here so the
// mechanism is what is measured; the default policy adds 250 ms ±20% for a
// first crash (doubling per consecutive crash).
func BenchmarkCrashToReady(b *testing.B) {
	b.ReportAllocs()
	addr := freeAddrB(b)
	spec := Spec{Name: "bench", Path: os.Args[0],
		Args: []string{"runner", "decode", "--served-name", "m", "--listen", addr},
		Env:  append(os.Environ(), "EXO_FAKE_RUNNER=1"), HealthURL: "http://" + addr + "/health"}
	p := restart.Policy{Attempts: 1 << 30, Interval: time.Second, Initial: time.Millisecond, Max: time.Millisecond, StableAfter: 0, CrashLoopDelay: time.Millisecond}
	changed := make(chan Status, 64)
	r := Start(spec, Options{Policy: p, PollStarting: 5 * time.Millisecond, Jitter: func() float64 { return 0.5 },
		OnChange: func(s Status) { changed <- s }})
	defer r.Stop(context.Background())
	waitReady := func() int {
		for s := range changed {
			if s.State == Ready {
				return s.PID
			}
		}
		return 0
	}
	pid := waitReady()
	for b.Loop() {
		syscall.Kill(pid, syscall.SIGKILL)
		pid = waitReady()
	}
}

func freeAddrB(b *testing.B) string {
	l, err := netListen()
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

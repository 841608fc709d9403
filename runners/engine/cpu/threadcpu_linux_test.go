package cpu

import "syscall"

// threadCPU is the calling thread's CPU time in nanoseconds (0 where not
// available). With the goroutine locked to its thread, a one-thread
// benchmark's CPU time per operation moves much less with the machine's
// load than its wall time.
func threadCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// ThreadCPU is threadCPU for the package's external tests.
var ThreadCPU = threadCPU

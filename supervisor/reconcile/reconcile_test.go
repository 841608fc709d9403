package reconcile

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/internal/fakerunner"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

func TestMain(m *testing.M) {
	fakerunner.MaybeRun()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil))) // quiet test output
	os.Exit(m.Run())
}

func portBase(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func cfg(t *testing.T, base int, extra string) *config.Config {
	t.Helper()
	src := fmt.Sprintf(`
[cluster]
runner_port_base = %d
[hosts.h]
address = "127.0.0.1"
backend = "cpu"
[[models]]
name = "m"
source = "builtin:smollm2"
decode = { hosts = ["h"] }
prefill = { hosts = ["h"] }
%s`, base, extra)
	c, err := config.Parse("t.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pids(s *Set) map[string]int {
	out := map[string]int{}
	for _, r := range s.Runners() {
		out[r.Spec.Name] = r.Status.PID
	}
	return out
}

func TestApplyMinimalDiff(t *testing.T) {
	base := portBase(t)
	s := New(Options{Executable: os.Args[0], ExtraEnv: []string{fakerunner.EnvEnable + "=1"},
		Process: process.Options{Grace: 2 * time.Second}})
	ctx := context.Background()
	defer s.StopAll(ctx)

	ch := s.Apply(ctx, cfg(t, base, "").Runners("h"))
	if len(ch.Start) != 2 {
		t.Fatalf("first apply: %s", ch)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if !s.WaitReady(wctx) {
		t.Fatalf("not ready: %+v", s.Runners())
	}
	before := pids(s)
	for _, r := range s.Runners() {
		if r.Status.State != process.Ready {
			t.Errorf("%s is %s", r.Spec.Name, r.Status.State)
		}
		if !strings.Contains(r.Status.Health.Role, r.Spec.Role) {
			t.Errorf("%s health role %q", r.Spec.Name, r.Status.Health.Role)
		}
	}

	// A decode-only setting changes: only the decode runner restarts.
	ch = s.Apply(ctx, cfg(t, base, "remote_prefill_min_tokens = 7").Runners("h"))
	if ch.String() != "start [], stop [], restart [m-decode], keep [m-prefill]" {
		t.Fatalf("second apply: %s", ch)
	}
	if !s.WaitReady(wctx) {
		t.Fatal("not ready after restart")
	}
	after := pids(s)
	if after["m-prefill"] != before["m-prefill"] {
		t.Errorf("untouched prefill runner changed PID %d → %d", before["m-prefill"], after["m-prefill"])
	}
	if after["m-decode"] == before["m-decode"] || after["m-decode"] == 0 {
		t.Errorf("decode runner did not restart: %d → %d", before["m-decode"], after["m-decode"])
	}
	if err := syscallGone(before["m-decode"]); err != nil {
		t.Error(err)
	}

	s.StopAll(ctx)
	if n := len(s.Runners()); n != 0 {
		t.Errorf("%d runners left after StopAll", n)
	}
	for name, pid := range after {
		if err := syscallGone(pid); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func syscallGone(pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
		return nil
	}
	return fmt.Errorf("pid %d still running", pid)
}

// TestSpecRingHostfile: a stage runner with an MLX ring starts with
// MLX_HOSTFILE naming the hostfile written into the state dir and MLX_RANK
// its stage; other runners get neither, even when the supervisor's own
// environment has them.
func TestSpecRingHostfile(t *testing.T) {
	t.Setenv("MLX_HOSTFILE", "/elsewhere.json")
	t.Setenv("MLX_RANK", "7")
	dir := t.TempDir()
	s := New(Options{Executable: os.Args[0], StateDir: dir})
	const hf = `[["10.0.0.1:52504"],["10.0.0.2:52504"],["10.0.0.3:52504"]]`
	ring := config.Runner{Name: "m-decode-stage1", Host: "b", Role: config.Decode, Listen: "127.0.0.1:1", RingHostfile: hf, RingRank: 1}
	env := s.spec(ring).Env
	path := filepath.Join(dir, "b-m-decode-stage1.mlx-ring.json")
	if got := envOf(env, "MLX_HOSTFILE"); got != path {
		t.Errorf("MLX_HOSTFILE %q, want %q", got, path)
	}
	if got := envOf(env, "MLX_RANK"); got != "1" {
		t.Errorf("MLX_RANK %q, want 1", got)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != hf {
		t.Errorf("hostfile %q (%v), want %q", b, err, hf)
	}
	plain := config.Runner{Name: "m-decode", Host: "b", Role: config.Decode, Listen: "127.0.0.1:1"}
	if env := s.spec(plain).Env; envOf(env, "MLX_HOSTFILE") != "" || envOf(env, "MLX_RANK") != "" {
		t.Errorf("a runner without a ring has MLX_HOSTFILE %q MLX_RANK %q", envOf(env, "MLX_HOSTFILE"), envOf(env, "MLX_RANK"))
	}
}

// envOf is the value exec gives key in env (the last one wins).
func envOf(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, x, _ := strings.Cut(kv, "="); k == key {
			v = x
		}
	}
	return v
}

// TestSpecFlags: exo runners get --instance (a fresh token per start) and
// --stop-grace (the supervisor's grace, for their drain).
func TestSpecFlags(t *testing.T) {
	s := New(Options{Executable: os.Args[0], StateDir: t.TempDir()})
	sp := s.spec(config.Runner{Name: "m-decode", Host: "b", Role: config.Decode, Listen: "127.0.0.1:1"})
	if sp.InstanceFlag != "--instance" || sp.GraceFlag != "--stop-grace" {
		t.Errorf("instance flag %q, grace flag %q", sp.InstanceFlag, sp.GraceFlag)
	}
}

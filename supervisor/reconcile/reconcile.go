// Package reconcile owns the set of runner processes on this host: given
// the runners the cluster file assigns to the host, it applies the minimal
// change (config.Diff) to the running set — starting new runners, stopping
// removed ones, restarting changed ones and leaving the rest untouched —
// and reports each runner's state. It builds the `exo runner …` command
// lines from config.Runner.Args and must not import runners/.
package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

// Options configure a Set.
type Options struct {
	// Executable runs the runners: `<Executable> runner decode …`.
	Executable string
	// ExtraEnv is appended to the supervisor's environment (minus the
	// systemd variables meant for the supervisor alone).
	ExtraEnv []string
	// StateDir is where the runners' files are written (a decode
	// pipeline stage's MLX ring hostfile, MLX_HOSTFILE); "" =
	// $STATE_DIRECTORY/runners under systemd, else
	// $TMPDIR/exo-runners-<uid>.
	StateDir string
	// Process is the template for every runner's process options
	// (policy, grace, logger); OnChange and Restarts are set per runner.
	Process  process.Options
	OnChange func(process.Status)
}

// Runner is one runner's spec and state.
type Runner struct {
	Spec   config.Runner
	Status process.Status
}

// Set is the running runners of this host.
type Set struct {
	o        Options
	env      []string
	mu       sync.Mutex
	running  map[string]*entry
	restarts map[string]int // carried across config restarts
}

type entry struct {
	spec config.Runner
	proc *process.Runner
}

// New returns an empty Set.
func New(o Options) *Set {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES":
			continue
		case "MLX_HOSTFILE", "MLX_RANK":
			// One process's place in one MLX group: never right for
			// every runner (a stage runner gets its own, Runner.Env).
			continue
		}
		env = append(env, kv)
	}
	env = append(env, o.ExtraEnv...)
	if o.StateDir == "" {
		if d := os.Getenv("STATE_DIRECTORY"); d != "" {
			o.StateDir = filepath.Join(d, "runners")
		} else {
			o.StateDir = filepath.Join(os.TempDir(), "exo-runners-"+strconv.Itoa(os.Getuid()))
		}
	}
	return &Set{o: o, env: env, running: map[string]*entry{}, restarts: map[string]int{}}
}

// Apply makes the running set equal want and returns what changed.
// Runners that are stopped or restarted are fully gone before their
// replacements start (they may reuse the same ports).
func (s *Set) Apply(ctx context.Context, want []config.Runner) config.Changes {
	s.mu.Lock()
	var cur []config.Runner
	for _, e := range s.running {
		cur = append(cur, e.spec)
	}
	sort.Slice(cur, func(i, j int) bool { return cur[i].Name < cur[j].Name })
	ch := config.Diff(cur, want)
	var stopping []*entry
	for _, r := range append(append([]config.Runner{}, ch.Stop...), ch.Restart...) {
		stopping = append(stopping, s.running[r.Name])
		delete(s.running, r.Name)
	}
	s.mu.Unlock()

	var wg sync.WaitGroup
	for _, e := range stopping {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.proc.Stop(ctx); err != nil {
				s.logger().Error("stop runner", "runner", e.spec.Name, "err", err)
			}
			s.mu.Lock()
			s.restarts[e.spec.Name] = e.proc.Status().Restarts
			s.mu.Unlock()
		}()
	}
	wg.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range append(append([]config.Runner{}, ch.Restart...), ch.Start...) {
		s.running[r.Name] = &entry{spec: r, proc: s.start(r)}
	}
	return ch
}

func (s *Set) logger() *slog.Logger {
	if s.o.Process.Logger != nil {
		return s.o.Process.Logger
	}
	return slog.Default()
}

func (s *Set) start(r config.Runner) *process.Runner {
	po := s.o.Process
	po.Restarts = s.restarts[r.Name]
	po.OnChange = s.o.OnChange
	return process.Start(s.spec(r), po)
}

// spec is r's process: its command line, and the supervisor's environment
// with r's MLX ring (its hostfile written into the state dir).
func (s *Set) spec(r config.Runner) process.Spec {
	env := s.env
	if r.RingHostfile != "" {
		path, err := s.writeHostfile(r)
		if err != nil {
			// The stages then keep their hidden states on the stage link
			// (the runner logs why).
			s.logger().Error("runner's MLX ring hostfile not written: its stages stay on the stage link", "runner", r.Name, "err", err)
		} else {
			env = append(slices.Clip(env), r.Env(path)...)
		}
	}
	return process.Spec{
		Name:      r.Name,
		Path:      s.o.Executable,
		Args:      r.Args(),
		Env:       env,
		HealthURL: "http://" + r.HealthAddr() + "/health",
		// exo runners echo --instance in /health: a runner is ready only
		// if the process answering is the one this supervisor started.
		InstanceFlag: "--instance",
		// and they drain for the time the supervisor gives them (--grace).
		GraceFlag: "--stop-grace",
	}
}

// writeHostfile writes r's MLX ring hostfile into the state dir
// (<host>-<runner>.mlx-ring.json: two supervisors of one test machine
// do not share it) and returns its path.
func (s *Set) writeHostfile(r config.Runner) (string, error) {
	if err := os.MkdirAll(s.o.StateDir, 0o700); err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	path := filepath.Join(s.o.StateDir, r.Host+"-"+r.Name+".mlx-ring.json")
	tmp, err := os.CreateTemp(s.o.StateDir, ".mlx-ring-*")
	if err != nil {
		return "", fmt.Errorf("MLX ring hostfile: %w", err)
	}
	_, err = tmp.WriteString(r.RingHostfile)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("MLX ring hostfile %s: %w", path, err)
	}
	return path, nil
}

// Runners returns every running runner's spec and state, sorted by name.
func (s *Set) Runners() []Runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Runner, 0, len(s.running))
	for _, e := range s.running {
		out = append(out, Runner{e.spec, e.proc.Status()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Name < out[j].Spec.Name })
	return out
}

// Instance returns the instance token of the runner named name's current
// start ("" when it is not running here).
func (s *Set) Instance(name string) string {
	s.mu.Lock()
	e := s.running[name]
	s.mu.Unlock()
	if e == nil {
		return ""
	}
	return e.proc.Instance()
}

// LastError returns the error the runner named name last exited with (""
// when none or not running here).
func (s *Set) LastError(name string) string {
	s.mu.Lock()
	e := s.running[name]
	s.mu.Unlock()
	if e == nil {
		return ""
	}
	return e.proc.Status().LastError
}

// WaitReady blocks until every runner now in the set has answered /health
// once, or ctx ends (false).
func (s *Set) WaitReady(ctx context.Context) bool {
	s.mu.Lock()
	var procs []*process.Runner
	for _, e := range s.running {
		procs = append(procs, e.proc)
	}
	s.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.Ready():
		case <-p.Done():
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// StopAll stops every runner and waits until they are gone.
func (s *Set) StopAll(ctx context.Context) {
	s.Apply(ctx, nil)
}

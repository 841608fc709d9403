// Package process owns one runner child process at a time: it starts it in
// its own process group, logs its output line by line tagged with the
// runner's name, polls its /health, restarts it under a restart.Policy when it
// exits, and stops it (SIGTERM to the group, SIGKILL after a grace period) so
// that no process of the group survives. It knows nothing about the cluster
// file or HTTP routing and must not import runners/.
package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/restart"
)

// State is where a runner is in its life.
type State string

// States.
const (
	Starting  State = "starting"  // process running, /health not 200 yet (loading, downloading)
	Ready     State = "ready"     // /health answers 200
	Unhealthy State = "unhealthy" // was ready, /health stopped answering 200
	Backoff   State = "backoff"   // exited; waiting to restart
	CrashLoop State = "crashloop" // exited too often; restarting slowly
	Stopped   State = "stopped"   // stopped on purpose
)

// Spec is one runner's command.
type Spec struct {
	Name      string
	Path      string   // executable
	Args      []string // after the executable
	Env       []string // nil = the supervisor's environment
	HealthURL string   // e.g. http://127.0.0.1:52500/health; "" = ready once started
	// InstanceFlag, when set (e.g. "--instance"), is appended to Args with a
	// fresh random token on every start, and the runner counts as ready
	// only when its /health reports that token as "instance": a /health
	// answered by another process on the same port (a second supervisor's
	// runner, a stale one) is not this runner starting.
	InstanceFlag string
	// GraceFlag, when set (e.g. "--stop-grace"), is appended to Args with
	// Options.Grace, so the child knows how long it may drain after SIGTERM.
	GraceFlag string
}

// Options tune a Runner; zero fields take defaults.
type Options struct {
	Policy       restart.Policy // zero → restart.Default()
	Grace        time.Duration  // SIGTERM → SIGKILL; default 10s
	PollStarting time.Duration  // /health poll while starting; default 100ms
	PollReady    time.Duration  // /health poll once ready; default 2s (at most Liveness.Ready/4)
	// Liveness: a runner whose /health stays unanswered this long is
	// stopped (SIGTERM, SIGKILL after Grace) and restarted under Policy.
	Liveness Liveness
	Logger   *slog.Logger
	Now      func() time.Time // default time.Now
	Jitter   func() float64   // default rand.Float64
	// OnChange is called (from the runner's goroutine) after every state change.
	OnChange func(Status)
	// Restarts is the restart count carried over from a previous Runner of the same name.
	Restarts int
}

// Health is what a runner's /health said last.
type Health struct {
	Status   string  `json:"status"`
	Role     string  `json:"role,omitempty"`
	Model    string  `json:"model,omitempty"`
	Progress float64 `json:"progress,omitempty"`
	// Phase ("download", "load") and its bytes while loading, when the
	// runner reports them.
	Phase      string `json:"phase,omitempty"`
	DoneBytes  int64  `json:"done_bytes,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
	Waiting    int    `json:"waiting"`
	Running    int    `json:"running"`
	Instance   string `json:"instance,omitempty"`
	PID        int    `json:"pid,omitempty"`
	// PrefillEndpoints: a decode runner's circuit breakers, one per
	// prefill endpoint ("closed": used; "open": skipped until it answers).
	PrefillEndpoints []PrefillEndpoint `json:"prefill_endpoints,omitempty"`
	// StageTransport: a pipeline stage's (decode or prefill) where its
	// hidden states go and, on the stage link, why not over MLX's ring.
	StageTransport *StageTransport `json:"stage_transport,omitempty"`
}

// StageTransport is a pipeline stage runner's "stage_transport" on /health
// (docs/OPERATIONS.md: transport "mlx", "tcp" with a reason code, or
// "pending").
type StageTransport struct {
	Transport string `json:"transport"`
	Reason    string `json:"reason,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

// PrefillEndpoint is one prefill endpoint as a decode runner sees it.
type PrefillEndpoint struct {
	Addr      string `json:"addr"`
	State     string `json:"state"`
	Trips     int    `json:"trips"`
	LastError string `json:"last_error,omitempty"`
}

// Status is a snapshot of a runner.
type Status struct {
	Name     string `json:"name"`
	State    State  `json:"state"`
	PID      int    `json:"pid,omitempty"`
	Restarts int    `json:"restarts"`
	LastExit string `json:"last_exit,omitempty"`
	// LastError is the error the last start died with: its final "exo: …"
	// line on stderr (e.g. a model that cannot be found, with the hint).
	LastError string    `json:"last_error,omitempty"`
	Since     time.Time `json:"since"`
	Health    *Health   `json:"health,omitempty"`
	NextStart time.Time `json:"next_start,omitzero"`
	// Backoff is the delay chosen before NextStart.
	Backoff time.Duration `json:"backoff_ns,omitempty"`
	// LivenessKills counts the times the supervisor stopped the runner
	// because its /health went unanswered (each followed by a restart).
	LivenessKills int `json:"liveness_kills,omitempty"`
}

// Runner keeps one child alive until Stop.
type Runner struct {
	spec Spec
	opt  Options
	log  *slog.Logger

	mu     sync.Mutex
	st     Status
	ready  chan struct{} // closed on first Ready
	cancel context.CancelFunc
	done   chan struct{}
	token  string // the current start's instance token (under mu)
}

// Instance returns the instance token of the current start ("" when the
// Spec has no InstanceFlag or no start has happened).
func (r *Runner) Instance() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.token
}

func newToken() string {
	return strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64(), 36)
}

// Start launches the child and its keep-alive loop.
func Start(spec Spec, o Options) *Runner {
	if o.Policy == (restart.Policy{}) {
		o.Policy = restart.Default()
	}
	if o.Grace == 0 {
		o.Grace = 10 * time.Second
	}
	if o.PollStarting == 0 {
		o.PollStarting = 100 * time.Millisecond
	}
	if o.PollReady == 0 {
		o.PollReady = 2 * time.Second
	}
	o.Liveness = o.Liveness.withDefaults()
	if o.Liveness.Ready > 0 {
		o.PollReady = min(o.PollReady, max(o.Liveness.Ready/4, 10*time.Millisecond))
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{spec: spec, opt: o, log: o.Logger.With("runner", spec.Name),
		ready: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	r.st = Status{Name: spec.Name, State: Starting, Since: o.Now(), Restarts: o.Restarts}
	go r.loop(ctx)
	return r
}

// Status returns a snapshot.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.st
	if s.Health != nil {
		h := *s.Health
		h.PrefillEndpoints = slices.Clone(h.PrefillEndpoints)
		if h.StageTransport != nil {
			t := *h.StageTransport
			h.StageTransport = &t
		}
		s.Health = &h
	}
	return s
}

// Spec returns the runner's command.
func (r *Runner) Spec() Spec { return r.spec }

// Ready is closed the first time the runner answers /health with 200.
func (r *Runner) Ready() <-chan struct{} { return r.ready }

// Stop stops the child (SIGTERM to its group, SIGKILL after the grace
// period) and returns when every process of the group is gone or ctx ends.
func (r *Runner) Stop(ctx context.Context) error {
	r.cancel()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop runner %s: %w", r.spec.Name, ctx.Err())
	}
}

// Done is closed once the runner is stopped.
func (r *Runner) Done() <-chan struct{} { return r.done }

func (r *Runner) set(f func(*Status)) {
	r.mu.Lock()
	old := r.st.State
	f(&r.st)
	if r.st.State != old {
		r.st.Since = r.opt.Now()
	}
	s := r.st
	r.mu.Unlock()
	if s.State == Ready {
		select {
		case <-r.ready:
		default:
			close(r.ready)
		}
	}
	if r.opt.OnChange != nil {
		r.opt.OnChange(s)
	}
}

func (r *Runner) loop(ctx context.Context) {
	defer close(r.done)
	var tr restart.Tracker
	for {
		started := r.opt.Now()
		fatal, err := r.runOnce(ctx)
		if ctx.Err() != nil {
			r.set(func(s *Status) { s.State, s.PID, s.Health = Stopped, 0, nil })
			r.log.Info("runner stopped")
			return
		}
		var d time.Duration
		tr, d = r.opt.Policy.Exit(tr, r.opt.Now(), r.opt.Now().Sub(started), r.opt.Jitter())
		state := Backoff
		if tr.CrashLoop() {
			state = CrashLoop
		}
		exit := describeExit(err)
		var ke *killedError
		killed := errors.As(err, &ke)
		r.log.Warn("runner exited; restarting", "exit", exit, "ran", r.opt.Now().Sub(started).Round(time.Millisecond), "restart_in", d.Round(time.Millisecond), "state", state)
		r.set(func(s *Status) {
			s.State, s.PID, s.Health, s.LastExit, s.NextStart, s.Backoff = state, 0, nil, exit, r.opt.Now().Add(d), d
			if killed {
				s.LivenessKills++
			}
			s.LastError = fatal
		})
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			r.set(func(s *Status) { s.State, s.NextStart = Stopped, time.Time{} })
			return
		case <-t.C:
		}
		r.set(func(s *Status) { s.State, s.Restarts, s.NextStart, s.Backoff = Starting, s.Restarts+1, time.Time{}, 0 })
	}
}

// killedError is how runOnce reports a child it stopped for not answering.
type killedError struct {
	reason string
	exit   error
}

func (k *killedError) Error() string { return k.reason + "; then " + describeExit(k.exit) }

func describeExit(err error) string {
	var ke *killedError
	if errors.As(err, &ke) {
		return ke.Error()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "signal " + ws.Signal().String()
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// runOnce runs the child until it exits or ctx is cancelled; it returns
// only when no process of the child's group is left, with the child's last
// "exo: …" error line on stderr, if any.
func (r *Runner) runOnce(ctx context.Context) (fatal string, err error) {
	runCtx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	// The health poller cancels procCtx (with the reason) to stop a child
	// that stopped answering; cancelling ctx stops it for good.
	procCtx, kill := context.WithCancelCause(ctx)
	defer kill(nil)
	args := r.spec.Args
	token := ""
	if r.spec.InstanceFlag != "" {
		token = newToken()
		args = append(append([]string(nil), args...), r.spec.InstanceFlag, token)
	}
	if r.spec.GraceFlag != "" {
		args = append(append([]string(nil), args...), r.spec.GraceFlag, r.opt.Grace.String())
	}
	r.mu.Lock()
	r.token = token
	r.mu.Unlock()
	cmd := exec.CommandContext(procCtx, r.spec.Path, args...)
	cmd.Env = r.spec.Env
	cmd.SysProcAttr = sysProcAttr()
	stdout := &lineLogger{log: r.log, stream: "stdout"}
	stderr := &lineLogger{log: r.log, stream: "stderr"}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	var termAt time.Time // when the group got SIGTERM
	cmd.Cancel = func() error {
		termAt = time.Now()
		err := signalGroup(cmd.Process.Pid, syscall.SIGTERM)
		// A stopped (SIGSTOP, SIGTSTP) group gets its SIGTERM only once
		// it runs again; let it, so it can exit cleanly within the grace.
		_ = signalGroup(cmd.Process.Pid, syscall.SIGCONT)
		return err
	}
	cmd.WaitDelay = r.opt.Grace
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", r.spec.Path, err)
	}
	pid := cmd.Process.Pid
	r.log.Info("runner started", "pid", pid, "args", r.spec.Args)
	r.set(func(s *Status) { s.State, s.PID, s.Health = Starting, pid, nil })
	go r.pollHealth(runCtx, pid, token, func(reason string) { kill(errors.New(reason)) })
	err = cmd.Wait() // after Cancel, Wait SIGKILLs the leader once WaitDelay passes
	stopHealth()
	stdout.flush()
	stderr.flush()
	// The leader is gone. The rest of its group gets what is left of the
	// grace period after its SIGTERM, then SIGKILL.
	if groupAlive(pid) {
		if termAt.IsZero() {
			termAt = time.Now()
			_ = signalGroup(pid, syscall.SIGTERM)
		}
		for groupAlive(pid) && time.Since(termAt) < r.opt.Grace {
			time.Sleep(20 * time.Millisecond)
		}
		if groupAlive(pid) {
			r.log.Warn("runner's process group outlived the grace period; killing it", "pgid", pid)
			_ = signalGroup(pid, syscall.SIGKILL)
			for i := 0; groupAlive(pid) && i < 250; i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if ctx.Err() == nil && procCtx.Err() != nil {
		// Wait reports the cancellation; the process state says how it ended.
		exit := err
		if ps := cmd.ProcessState; ps != nil {
			exit = &exec.ExitError{ProcessState: ps}
		}
		return stderr.fatalLine(), &killedError{reason: context.Cause(procCtx).Error(), exit: exit}
	}
	return stderr.fatalLine(), err
}

// pollHealth polls the child's /health, keeps the state current, and calls
// kill when the child stays silent past its Liveness limit.
func (r *Runner) pollHealth(ctx context.Context, pid int, token string, kill func(reason string)) {
	if r.spec.HealthURL == "" {
		r.set(func(s *Status) {
			if s.PID == pid {
				s.State = Ready
			}
		})
		return
	}
	timeout := 2 * time.Second
	if l := r.opt.Liveness.Ready; l > 0 {
		timeout = min(timeout, max(l/3, 10*time.Millisecond))
	}
	client := &http.Client{Timeout: timeout}
	wasReady, warned := false, false
	lastAnswer := r.opt.Now()
	for {
		h, code, err := getHealth(ctx, client, r.spec.HealthURL)
		if ctx.Err() != nil {
			return
		}
		now := r.opt.Now()
		// Any HTTP answer from our own child (not another process on its
		// port) says it is alive.
		if code != 0 && !(token != "" && h != nil && h.Instance != token) {
			lastAnswer = now
		} else if dead, why := r.opt.Liveness.Dead(wasReady, lastAnswer, now); dead {
			r.log.Warn("runner not answering /health; stopping it to restart it", "pid", pid, "reason", why, "err", err)
			r.set(func(s *Status) {
				if s.PID == pid {
					s.State = Unhealthy
				}
			})
			kill(why)
			return
		}
		if token != "" && h != nil && h.Instance != token {
			// Someone else answers on our port: not ready, whatever it says.
			if !warned {
				r.log.Warn("another process answers this runner's /health (port taken?); not ready",
					"url", r.spec.HealthURL, "their_instance", h.Instance, "their_pid", h.PID, "our_pid", pid)
				warned = true
			}
			h = &Health{Status: fmt.Sprintf("not ours: %s is answered by another process (pid %d), this runner's port is probably taken", r.spec.HealthURL, h.PID)}
			code = 0
		}
		r.set(func(s *Status) {
			if s.PID != pid {
				return
			}
			if err == nil {
				s.Health = h
			}
			switch {
			case code == http.StatusOK:
				s.State = Ready
				if !wasReady {
					r.log.Info("runner ready", "pid", pid)
				}
				wasReady = true
			case wasReady:
				s.State = Unhealthy
			default:
				s.State = Starting
			}
		})
		every := r.opt.PollStarting
		if wasReady {
			every = r.opt.PollReady
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func getHealth(ctx context.Context, c *http.Client, url string) (*Health, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var h Health
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&h); err != nil {
		return nil, resp.StatusCode, fmt.Errorf("decode /health: %w", err)
	}
	return &h, resp.StatusCode, nil
}

// lineLogger turns a child's output into one log record per line.
type lineLogger struct {
	log    *slog.Logger
	stream string
	mu     sync.Mutex
	buf    []byte
	fatal  string // the last line starting "exo: " (how exo reports the error it exits with)
}

func (l *lineLogger) fatalLine() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := indexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 64<<10 { // a runaway line: log what we have
		l.emit(l.buf)
		l.buf = nil
	}
	return len(p), nil
}

func (l *lineLogger) emit(line []byte) {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if f, ok := strings.CutPrefix(string(line), "exo: "); ok {
		l.fatal = f
	}
	lvl, msg := childLine(string(line))
	l.log.Log(context.Background(), lvl, msg, "stream", l.stream)
}

// childLine takes apart a line a runner logged with slog's text handler
// ("time=… level=WARN msg=… k=v"): the level becomes the record's level and
// the time is dropped (the supervisor's record has one). A line starting
// "exo: ", "panic: " or "fatal error: " is an error. Other lines are
// logged as they are, at INFO.
func childLine(line string) (slog.Level, string) {
	lvl := slog.LevelInfo
	rest, ok := strings.CutPrefix(line, "time=")
	if !ok {
		// The error a runner exits with (cmd/exo prints "exo: …") and the
		// runtime's last words are what an operator greps for.
		for _, p := range []string{"exo: ", "panic: ", "fatal error: "} {
			if strings.HasPrefix(line, p) {
				return slog.LevelError, line
			}
		}
		return lvl, line
	}
	_, rest, ok = strings.Cut(rest, " ")
	if !ok {
		return lvl, line
	}
	if v, ok := strings.CutPrefix(rest, "level="); ok {
		word, after, _ := strings.Cut(v, " ")
		if lvl.UnmarshalText([]byte(word)) == nil {
			rest = after
		}
	}
	if m, ok := strings.CutPrefix(rest, "msg="); ok {
		rest = m
		if strings.HasPrefix(m, `"`) { // unquote the message, keep the attributes
			if q, err := strconv.QuotedPrefix(m); err == nil {
				if u, err := strconv.Unquote(q); err == nil {
					rest = u + m[len(q):]
				}
			}
		}
	}
	return lvl, rest
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit(l.buf)
		l.buf = nil
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

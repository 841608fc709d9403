// Package supervisor owns `exo supervise`: it ties the cluster file
// (config), this host's runner processes (reconcile, process, restart),
// reloads (watch), systemd (sdnotify), the API gateway (gateway) and the
// Prometheus endpoint (metrics, gpu) into one long-running service, and
// serves its own status at /exo/status for `exo status`. It starts runners
// as `<own executable> runner …` child processes and talks to them only over
// HTTP: it must never import runners/, and it builds with CGO_ENABLED=0.
package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/exo-pd/exo-pd/internal/hostmem"
	"github.com/exo-pd/exo-pd/internal/modelinfo"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/dashboard"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/gpu"
	"github.com/exo-pd/exo-pd/supervisor/metrics"
	"github.com/exo-pd/exo-pd/supervisor/process"
	"github.com/exo-pd/exo-pd/supervisor/reconcile"
	"github.com/exo-pd/exo-pd/supervisor/sdnotify"
	"github.com/exo-pd/exo-pd/supervisor/watch"
)

// StatusPath is where the supervisor serves its status JSON.
const StatusPath = "/exo/status"

// Options configure Run.
type Options struct {
	// ConfigPath is the cluster file, loaded and watched. Empty with
	// Embedded set: the embedded default, not watched.
	ConfigPath string
	Embedded   bool
	// Host is this host's name in the file ("" = hostname, then address).
	Host string
	// Executable starts runners (default: this process's executable).
	Executable string
	ExtraEnv   []string
	// StateDir is where runners' files are written (reconcile.Options).
	StateDir string
	// APIListen overrides the file's [api] listen/port ("HOST:PORT").
	APIListen string
	Logger    *slog.Logger
	Process   process.Options // restart policy, grace period
	Debounce  time.Duration
	// Ready is called once all of this host's runners answered /health.
	Ready func(apiURL string)
	// NoGPU skips the NVML collector (tests).
	NoGPU bool
	// ReadHeaderTimeout closes API connections that have not sent their
	// request headers within it (default 10 s): hundreds of clients that
	// never finish (slowloris) cost a goroutine each until then, and
	// every other client is served meanwhile.
	ReadHeaderTimeout time.Duration
}

type supervisor struct {
	o    Options
	log  *slog.Logger
	sd   *sdnotify.Notifier
	set  *reconcile.Set
	gw   *gateway.Gateway
	met  *metrics.Metrics
	auth *gateway.Auth
	key  atomic.Pointer[[]byte] // the API key in force (nil: none), sent to peers
	dash *dashboard.Dashboard
	hist *dashboard.History // runners' state changes, for the dashboard
	gpu  *gpu.Collector     // nil: no NVML
	host string
	api  string
	// apiPort is the port every host's gateway is taken to listen on.
	apiPort int
	// reloadCh asks the main loop to reload the cluster file.
	reloadCh chan string

	// memMu guards reports: what the other hosts' supervisors reported of
	// their memory (asked once each: physical memory does not change).
	memMu   sync.Mutex
	reports map[string]config.HostMemory

	mu         sync.Mutex
	cfg        *config.Config
	digest     string // ClusterDigest of the file cfg was parsed from
	lastReload Reload
	started    time.Time
	// initial is the file the supervisor started with: what of [api] and
	// [supervisor] is in force until it restarts.
	initial *config.Config
}

// Reload is the outcome of the last (re)load of the cluster file.
type Reload struct {
	OK      bool      `json:"ok"`
	At      time.Time `json:"at"`
	Error   string    `json:"error,omitempty"`
	Changes string    `json:"changes,omitempty"`
	// Pending: the settings of the file in force only after a restart of
	// the supervisor ([api] but cors_origins, [supervisor]), changed since
	// it started ("" when none).
	Pending string `json:"pending,omitempty"`
}

// pendingRestart says what of now's [api] and [supervisor] differs from
// what the supervisor started with, which only a restart applies ("":
// nothing). With listenOverride (--listen) the file's [api] listen and
// port are not used at all.
func pendingRestart(start, now *config.Config, listenOverride bool) string {
	var d []string
	a, b := start.API, now.API
	if !listenOverride && a.Listen != b.Listen {
		d = append(d, fmt.Sprintf("[api] listen %q → %q", a.Listen, b.Listen))
	}
	if !listenOverride && a.Port != b.Port {
		d = append(d, fmt.Sprintf("[api] port %d → %d", a.Port, b.Port))
	}
	if a.APIKeyFile != b.APIKeyFile {
		d = append(d, fmt.Sprintf("[api] api_key_file %q → %q", a.APIKeyFile, b.APIKeyFile))
	}
	if !slices.Equal(a.OpenPaths, b.OpenPaths) {
		d = append(d, fmt.Sprintf("[api] open_paths %q → %q", a.OpenPaths, b.OpenPaths))
	}
	if x, y := start.Supervisor, now.Supervisor; x.Liveness != y.Liveness {
		d = append(d, fmt.Sprintf("[supervisor] liveness_timeout %s → %s", orDefault(x.LivenessTimeout), orDefault(y.LivenessTimeout)))
	}
	if x, y := start.Supervisor, now.Supervisor; x.LivenessStarting != y.LivenessStarting {
		d = append(d, fmt.Sprintf("[supervisor] liveness_starting_timeout %s → %s", orDefault(x.LivenessStartingTimeout), orDefault(y.LivenessStartingTimeout)))
	}
	return strings.Join(d, ", ")
}

func orDefault(s string) string {
	if s == "" {
		return "(default)"
	}
	return s
}

// Run supervises this host's share of the cluster until ctx ends; then
// every runner is stopped before it returns. Cancellation is not an error.
func Run(ctx context.Context, o Options) error {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find own executable: %w", err)
		}
		o.Executable = exe
	}
	s := &supervisor{o: o, log: o.Logger, sd: sdnotify.New(o.Logger), started: time.Now(),
		reloadCh: make(chan string, 1), reports: map[string]config.HostMemory{}}
	cfg, digest, err := s.load()
	if err != nil {
		return err
	}
	s.cfg, s.digest, s.initial = cfg, digest, cfg
	if s.host, err = s.identify(cfg); err != nil {
		return err
	}
	s.log = s.log.With("host", s.host)
	s.met = metrics.New(s.metricRunners)
	// The supervisor's own CPU, memory and file descriptors, named apart
	// from the runners' process_* series.
	s.met.Registry().MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{Namespace: "exo_supervisor"}))
	if !o.NoGPU {
		if g := gpu.Open(s.log); g != nil {
			defer g.Close()
			s.met.Register("gpu", g)
			s.gpu = g
		}
	}
	s.gw = gateway.New(gateway.Options{Logger: s.log,
		Instance:    func(runner string) string { return s.set.Instance(runner) },
		RunnerError: func(runner string) string { return s.set.LastError(runner) }})
	s.gw.SetConfig(cfg, s.host)
	s.hist = dashboard.NewHistory()
	s.set = reconcile.New(reconcile.Options{Executable: o.Executable, ExtraEnv: o.ExtraEnv, StateDir: o.StateDir, Process: withLogger(livenessFrom(o.Process, cfg), s.log),
		OnChange: s.hist.Observe})

	addr := o.APIListen
	if addr == "" {
		addr = net.JoinHostPort(cfg.API.Listen, strconv.Itoa(cfg.API.Port))
	}
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("API gateway: %s is taken (another exo supervise running?): pick another address with --listen HOST:PORT or [api] port in the cluster file: %w", addr, err)
	}
	if err != nil {
		return fmt.Errorf("API gateway: %w", err)
	}
	s.api = apiURL(ln.Addr())
	s.apiPort = cfg.API.Port
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		s.apiPort = ta.Port
	}
	mux := http.NewServeMux()
	mux.Handle("/", s.gw.Handler())
	mux.Handle("GET /metrics", s.met.Handler())
	mux.HandleFunc("GET "+StatusPath, s.serveStatus)
	mux.HandleFunc("GET "+ClusterPath, s.serveCluster)
	mux.Handle("GET "+ProbePath, ProbeHandler())
	s.dash = s.newDashboard(ln.Addr())
	s.dash.Register(mux)
	var key []byte
	if f := cfg.API.APIKeyFile; f != "" {
		if key, err = gateway.ReadKeyFile(f); err != nil {
			ln.Close()
			return err
		}
		s.key.Store(&key)
	}
	// The dashboard's page holds no data and asks for the key itself.
	s.auth = gateway.NewAuth(mux, key, append(slices.Clone(cfg.API.OpenPaths), dashboard.ShellPaths...))
	rht := o.ReadHeaderTimeout
	if rht <= 0 {
		rht = 10 * time.Second
	}
	srv := &http.Server{Handler: s.gw.CORS(s.auth), ReadHeaderTimeout: rht, MaxHeaderBytes: gateway.MaxHeaderBytes}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()

	runCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	go s.gw.Run(runCtx)

	ch := s.set.Apply(runCtx, cfg.Runners(s.host))
	s.setReload(Reload{OK: true, At: time.Now(), Changes: ch.String()})
	s.log.Info("supervising", "cluster", cfg.Cluster.Name, "config", cfg.Path, "api", s.api, "runners", len(cfg.Runners(s.host)))
	go s.announceReady(runCtx)
	go s.askMemory(runCtx)

	reload := s.reloadCh
	if !o.Embedded {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			err := watch.Run(runCtx, o.ConfigPath, watch.Options{Debounce: o.Debounce, Trigger: hup, Logger: s.log},
				func(reason string) {
					select {
					case reload <- reason:
					default: // one pending reload covers this one too
					}
				})
			if err != nil {
				s.log.Error("not watching the cluster file; SIGHUP and restarts only", "err", err)
			}
		}()
	}
	ping := make(chan chan struct{})
	go s.sd.RunWatchdog(runCtx, func() bool {
		pong := make(chan struct{})
		select {
		case ping <- pong:
		case <-time.After(5 * time.Second):
			return false
		}
		select {
		case <-pong:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	})

loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-srvDone:
			s.log.Error("API server stopped", "err", err)
			stopAll()
			s.shutdown(srv)
			return fmt.Errorf("API gateway: %w", err)
		case reason := <-reload:
			s.reload(runCtx, reason)
		case pong := <-ping:
			close(pong)
		}
	}
	s.shutdown(srv)
	return nil
}

func withLogger(p process.Options, l *slog.Logger) process.Options {
	if p.Logger == nil {
		p.Logger = l
	}
	return p
}

func apiURL(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return "http://" + a.String()
	}
	host := ta.IP.String()
	if ta.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(ta.Port))
}

func (s *supervisor) shutdown(srv *http.Server) {
	s.sd.Stopping()
	s.log.Info("stopping: runners get SIGTERM, then SIGKILL after the grace period")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(ctx)
	cancel()
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.set.StopAll(ctx)
	s.log.Info("stopped")
}

// livenessFrom fills the liveness limits the options leave unset (0: no
// flag given) from the cluster file's [supervisor] table; what both leave
// unset keeps process's defaults.
func livenessFrom(po process.Options, c *config.Config) process.Options {
	if po.Liveness.Ready == 0 {
		po.Liveness.Ready = c.Supervisor.Liveness
	}
	if po.Liveness.Starting == 0 {
		po.Liveness.Starting = c.Supervisor.LivenessStarting
	}
	return po
}

// load reads and checks the cluster file; digest is ClusterDigest of its bytes.
func (s *supervisor) load() (c *config.Config, digest string, err error) {
	if s.o.Embedded {
		return config.Default(), ClusterDigest([]byte(config.DefaultText())), nil
	}
	data, err := os.ReadFile(s.o.ConfigPath)
	if err != nil {
		return nil, "", fmt.Errorf("cluster file: %w", err)
	}
	if c, err = config.Parse(s.o.ConfigPath, data); err != nil {
		return nil, "", fmt.Errorf("cluster file: %w", err)
	}
	if err := s.place(c); err != nil {
		return nil, "", fmt.Errorf("cluster file: %w", err)
	}
	return c, ClusterDigest(data), nil
}

// place splits c's pipelines from the models' files in this host's store
// and the hosts' memory (config.PlaceWith): memory_gib, else what each
// stage host's supervisor reported (this host's own reading included); a
// pipeline split by memory whose hosts have not all reported runs no stage
// yet (askMemory asks them and reloads). A pipeline whose model is not
// here (and has no split by hand) runs no stage on this host. Both are
// logged.
func (s *supervisor) place(c *config.Config) error {
	host := s.host
	if host == "" {
		host, _ = s.identify(c)
	}
	store, _ := modelinfo.StoreDir(c.Cluster.ModelsDir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := config.PlaceOptions{LocalHost: host, Wait: true, Reported: map[string]config.HostMemory{host: localMemory()}}
	s.memMu.Lock()
	for hn, m := range s.reports {
		if hn != host {
			o.Reported[hn] = m
		}
	}
	s.memMu.Unlock()
	ps, err := c.PlaceWith(modelinfo.Local(ctx, store), o)
	if err != nil {
		return err
	}
	for _, p := range ps {
		var split []string
		for _, st := range p.Stages {
			split = append(split, fmt.Sprintf("%s %d:%d", st.Host, st.Start, st.End))
		}
		switch {
		case p.Waiting != nil:
			s.log.Info("pipeline waits for its hosts' memory: none of its stages runs yet", "model", p.Model, "role", p.Role, "waiting_for", strings.Join(p.Waiting, ", "))
		case p.Stages == nil:
			s.log.Warn("pipeline not placed: this host runs none of its stages", "model", p.Model, "role", p.Role, "reason", p.Note)
		default:
			s.log.Info("pipeline placed", "model", p.Model, "role", p.Role, "stages", strings.Join(split, ", "), "note", p.Note)
		}
	}
	return nil
}

// localMemory is this host's physical memory as it reports it to
// placement (hostmem.Reported).
func localMemory() config.HostMemory {
	n, err := hostmem.Reported()
	if err != nil {
		return config.HostMemory{Err: err.Error()}
	}
	return config.HostMemory{Total: n}
}

// askMemory asks, every second, the supervisors of the stage hosts that a
// pipeline waits for (Placement.Waiting) for their memory (ClusterPath),
// and reloads the cluster file once one has answered: the split then
// follows. An answer is kept for the supervisor's life (physical memory
// does not change); a host that does not answer is asked again.
func (s *supervisor) askMemory(ctx context.Context) {
	client := &http.Client{Timeout: 3 * time.Second}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	warned := map[string]string{}
	for {
		s.mu.Lock()
		c := s.cfg
		s.mu.Unlock()
		want := map[string]bool{}
		s.memMu.Lock()
		for _, p := range c.Placements() {
			for _, hn := range p.Waiting {
				if _, ok := s.reports[hn]; !ok && hn != s.host {
					want[hn] = true
				}
			}
		}
		s.memMu.Unlock()
		var got []string
		for _, hn := range slices.Sorted(maps.Keys(want)) {
			m, err := s.askPeerMemory(ctx, client, c, hn)
			if err != nil {
				if warned[hn] != err.Error() {
					s.log.Warn("a pipeline's stage host has not reported its memory; asking again", "peer", hn, "err", err)
					warned[hn] = err.Error()
				}
				continue
			}
			s.memMu.Lock()
			s.reports[hn] = m
			s.memMu.Unlock()
			s.log.Info("stage host reported its memory", "peer", hn, "total_bytes", m.Total, "err", m.Err)
			got = append(got, hn)
		}
		if got != nil {
			s.requestReload("memory reported by " + strings.Join(got, ", "))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// askPeerMemory asks host's supervisor, through its gateway, for its
// memory (ClusterInfo.Memory).
func (s *supervisor) askPeerMemory(ctx context.Context, client *http.Client, c *config.Config, host string) (config.HostMemory, error) {
	h := c.Hosts[host]
	if h == nil {
		return config.HostMemory{}, fmt.Errorf("host %q is not in the cluster file", host)
	}
	addr := net.JoinHostPort(h.Address, strconv.Itoa(s.apiPort))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+ClusterPath, nil)
	if err != nil {
		return config.HostMemory{}, err
	}
	if k := s.key.Load(); k != nil {
		req.Header.Set("Authorization", "Bearer "+string(*k))
	}
	resp, err := client.Do(req)
	if err != nil {
		return config.HostMemory{}, fmt.Errorf("no supervisor answering at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return config.HostMemory{}, fmt.Errorf("%s%s: %s (the same [api] api_key_file on every host?)", addr, ClusterPath, resp.Status)
	}
	var info ClusterInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info); err != nil {
		return config.HostMemory{}, fmt.Errorf("%s%s: %w", addr, ClusterPath, err)
	}
	switch {
	case info.Host != host:
		return config.HostMemory{}, fmt.Errorf("%s answers as host %q, not %q", addr, info.Host, host)
	case info.Memory == nil:
		return config.HostMemory{}, fmt.Errorf("%s reports no memory (an older exo there?)", addr)
	}
	return *info.Memory, nil
}

// requestReload asks the main loop to reload the cluster file.
func (s *supervisor) requestReload(reason string) {
	select {
	case s.reloadCh <- reason:
	default: // one pending reload covers this one too
	}
}

func (s *supervisor) identify(c *config.Config) (string, error) {
	if s.o.Embedded && s.o.Host == "" {
		return "local", nil
	}
	hn, _ := os.Hostname()
	return c.Identify(s.o.Host, hn, config.LocalAddrs())
}

func (s *supervisor) setReload(r Reload) {
	s.mu.Lock()
	s.lastReload = r
	s.mu.Unlock()
	s.met.SetReload(r.OK, r.At)
}

// reload applies a changed cluster file, or keeps the old one if it is invalid.
func (s *supervisor) reload(ctx context.Context, reason string) {
	s.sd.Reloading()
	s.log.Info("reloading the cluster file", "reason", reason)
	c, digest, err := s.load()
	if err == nil {
		if _, ok := c.Hosts[s.host]; !ok {
			err = fmt.Errorf("%w: host %q is no longer in %s", config.ErrUnknownHost, s.host, c.Path)
		}
	}
	if err != nil {
		first, _, _ := strings.Cut(err.Error(), "\n")
		s.log.Error("cluster file invalid; the previous configuration keeps running", "err", err)
		s.mu.Lock()
		pending := pendingRestart(s.initial, s.cfg, s.o.APIListen != "")
		s.mu.Unlock()
		s.setReload(Reload{OK: false, At: time.Now(), Error: err.Error(), Pending: pending})
		s.sd.Ready("config reload FAILED, running the previous config: " + first)
		return
	}
	s.mu.Lock()
	old := s.cfg
	s.cfg, s.digest = c, digest
	s.mu.Unlock()
	// cors_origins applies live; the rest of [api] and [supervisor] waits
	// for a restart, said on every reload until then (and in exo status).
	pending := pendingRestart(s.initial, c, s.o.APIListen != "")
	if pending != "" {
		s.log.Warn("settings that apply only when the supervisor restarts changed; restart it to apply them", "pending", pending)
	}
	// The key file itself is re-read on every reload (key rotation by
	// rewriting the file and `systemctl reload exo`).
	if f := old.API.APIKeyFile; f != "" {
		if key, err := gateway.ReadKeyFile(f); err != nil {
			s.log.Error("API key not reloaded; the previous key stays in force", "err", err)
		} else {
			s.auth.SetKey(key)
			s.key.Store(&key)
		}
	}
	ch := s.set.Apply(ctx, c.Runners(s.host))
	s.gw.SetConfig(c, s.host)
	s.setReload(Reload{OK: true, At: time.Now(), Changes: ch.String(), Pending: pending})
	s.log.Info("cluster file applied", "changes", ch.String())
	s.sd.Ready(s.statusLine())
}

// announceReady sends READY=1 (and calls Options.Ready) once every runner
// answered /health; until then it keeps systemd's start timeout extended
// and STATUS current (downloads can take long).
func (s *supervisor) announceReady(ctx context.Context) {
	done := make(chan bool, 1)
	go func() { done <- s.set.WaitReady(ctx) }()
	t := time.NewTicker(20 * time.Second)
	defer t.Stop()
	s.sd.Status(s.statusLine())
	for {
		select {
		case ok := <-done:
			if !ok {
				return
			}
			s.log.Info("all runners ready", "api", s.api)
			s.sd.Ready(s.statusLine())
			if s.o.Ready != nil {
				s.o.Ready(s.api)
			}
			return
		case <-t.C:
			s.sd.ExtendTimeout(time.Minute)
			s.sd.Status(s.statusLine())
		}
	}
}

func (s *supervisor) statusLine() string {
	rs := s.set.Runners()
	ready := 0
	var notes []string
	for _, r := range rs {
		switch {
		case r.Status.State == process.Ready:
			ready++
		case r.Status.Health != nil && r.Status.Health.Status == "loading":
			notes = append(notes, fmt.Sprintf("%s loading %.0f%%", r.Spec.Name, 100*r.Status.Health.Progress))
		default:
			notes = append(notes, r.Spec.Name+" "+string(r.Status.State))
		}
	}
	s.mu.Lock()
	rl, c := s.lastReload, s.cfg
	s.mu.Unlock()
	for _, p := range c.Placements() {
		if p.Waiting != nil {
			notes = append(notes, fmt.Sprintf("%s %s waits for %s's memory", p.Model, p.Role, strings.Join(p.Waiting, ", ")))
		}
	}
	line := fmt.Sprintf("host %s: %d/%d runners ready; API %s", s.host, ready, len(rs), s.api)
	if len(notes) > 0 {
		line += "; " + strings.Join(notes, ", ")
	}
	if !rl.OK {
		line += "; last reload FAILED"
	}
	return line
}

func (s *supervisor) metricRunners() []metrics.Runner {
	var out []metrics.Runner
	for _, r := range s.set.Runners() {
		mr := metrics.Runner{
			Name: r.Spec.Name, Role: r.Spec.Role, Model: r.Spec.Model,
			Up: r.Status.State == process.Ready, CrashLoop: r.Status.State == process.CrashLoop, Restarts: r.Status.Restarts,
			LivenessKills: r.Status.LivenessKills,
			MetricsURL:    "http://" + r.Spec.HealthAddr() + "/metrics",
		}
		if h := r.Status.Health; h != nil && h.Status == "loading" {
			mr.LoadProgress = h.Progress
		}
		out = append(out, mr)
	}
	return out
}

// Status is what /exo/status returns and `exo status` prints.
type Status struct {
	Cluster    string                    `json:"cluster"`
	Host       string                    `json:"host"`
	Config     string                    `json:"config"`
	API        string                    `json:"api"`
	Started    time.Time                 `json:"started"`
	LastReload Reload                    `json:"last_reload"`
	Runners    []RunnerStatus            `json:"runners"`
	Hosts      []HostStatus              `json:"hosts"`
	Decode     map[string]gateway.Health `json:"decode_health"` // by address, cluster-wide
	// Placements are the pipelines' and tensor groups' placement as this
	// host computed it: stages, the memory each split counted, and the
	// hosts a split waits for.
	Placements []config.Placement `json:"placements,omitempty"`
}

// RunnerStatus is one local runner.
type RunnerStatus struct {
	Spec   config.Runner  `json:"spec"`
	Status process.Status `json:"status"`
}

// ClusterPath is where the supervisor says which cluster file it runs and
// what its clock reads (`exo doctor` compares hosts with it).
const ClusterPath = "/exo/cluster"

// ClusterInfo is served at ClusterPath.
type ClusterInfo struct {
	Cluster string `json:"cluster"`
	Host    string `json:"host"`
	// Digest is ClusterDigest of the cluster file now in force.
	Digest string    `json:"config_sha256"`
	Time   time.Time `json:"time"`
	// Memory is this host's physical memory as placement counts it
	// (hostmem.Reported): the other supervisors split pipelines by it.
	Memory *config.HostMemory `json:"memory,omitempty"`
}

// ClusterDigest is the hex SHA-256 of a cluster file's bytes: equal on two
// hosts exactly when they run the same file.
func ClusterDigest(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

func (s *supervisor) serveCluster(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	info := ClusterInfo{Cluster: s.cfg.Cluster.Name, Host: s.host, Digest: s.digest}
	s.mu.Unlock()
	info.Time = time.Now()
	m := localMemory()
	info.Memory = &m
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(info)
}

// ProbePath serves `exo doctor`'s goodput probe of a link to this host:
// GET ?bytes=N answers N zero bytes (1 to MaxProbeBytes), behind the API
// key like every path but /health and /metrics.
const ProbePath = "/exo/probe"

// MaxProbeBytes bounds one probe answer.
const MaxProbeBytes = 1 << 30

// ProbeHandler serves ProbePath.
func ProbeHandler() http.Handler {
	zeros := make([]byte, 64<<10)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
		if err != nil || n < 1 || n > MaxProbeBytes {
			http.Error(w, fmt.Sprintf("bytes: want 1 to %d", MaxProbeBytes), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			k := min(n, int64(len(zeros)))
			if _, err := w.Write(zeros[:k]); err != nil {
				return
			}
			n -= k
		}
	})
}

// HostStatus is one host of the file and the runners it should run.
type HostStatus struct {
	Name    string   `json:"name"`
	Address string   `json:"address"`
	Backend string   `json:"backend"`
	Runners []string `json:"runners"`
}

func (s *supervisor) serveStatus(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	c, rl := s.cfg, s.lastReload
	s.mu.Unlock()
	st := Status{Cluster: c.Cluster.Name, Host: s.host, Config: c.Path, API: s.api, Started: s.started,
		LastReload: rl, Decode: s.gw.Health(), Placements: c.Placements()}
	for _, r := range s.set.Runners() {
		st.Runners = append(st.Runners, RunnerStatus{r.Spec, r.Status})
	}
	for _, hn := range c.HostNames() {
		h := c.Hosts[hn]
		hs := HostStatus{Name: hn, Address: h.Address, Backend: string(h.Backend)}
		for _, r := range c.Runners(hn) {
			hs.Runners = append(hs.Runners, r.Name)
		}
		st.Hosts = append(st.Hosts, hs)
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(st)
}

// newDashboard makes the status API and page over this supervisor's state;
// the other hosts' gateways are taken to listen on this one's port.
func (s *supervisor) newDashboard(api net.Addr) *dashboard.Dashboard {
	port := s.cfg.API.Port
	if ta, ok := api.(*net.TCPAddr); ok {
		port = ta.Port
	}
	o := dashboard.Options{Port: port, Logger: s.log, Local: s.dashboardLocal, History: s.hist,
		Key: func() []byte {
			if k := s.key.Load(); k != nil {
				return *k
			}
			return nil
		}}
	if s.gpu != nil {
		o.GPU = s.gpu.Samples
	}
	return dashboard.New(o)
}

func (s *supervisor) dashboardLocal() dashboard.Local {
	s.mu.Lock()
	c, digest, rl := s.cfg, s.digest, s.lastReload
	s.mu.Unlock()
	l := dashboard.Local{Config: c, Host: s.host, Digest: digest, API: s.api, Started: s.started,
		LastReload: dashboard.Reload(rl), Decode: s.gw.Health()}
	for _, r := range s.set.Runners() {
		l.Runners = append(l.Runners, dashboard.Runner{Spec: r.Spec, Status: r.Status})
	}
	return l
}

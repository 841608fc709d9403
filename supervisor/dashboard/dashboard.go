// Package dashboard owns the cluster view every supervisor serves: a JSON
// status API — GET /exo/host (this host as its supervisor sees it), GET
// /exo/state (the whole cluster: every host of the cluster file asked
// through its gateway, as `exo doctor` asks it; the models and where their
// runners stand; the prefill links; the recent requests of every decode
// runner) and GET /exo/events (the same as a Server-Sent Events stream) —
// and the browser dashboard at / whose files are embedded in the binary.
// `exo status` prints /exo/state. Everything here reads: nothing it serves
// changes the cluster. It talks to peers and to this host's decode runners
// over HTTP only (their /exo/requests journal); it must not import
// runners/, nor the supervisor package that mounts it.
package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/gpu"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

// API paths (docs/OPERATIONS.md).
const (
	HostPath   = "/exo/host"
	StatePath  = "/exo/state"
	EventsPath = "/exo/events"
	// journalPath is the decode runners' recent-requests endpoint.
	journalPath = "/exo/requests"
)

// ShellPaths are the dashboard's static files. They hold no cluster data
// (the page asks for the API key before it reads any), so the supervisor
// serves them without the key; the JSON they read stays behind it.
var ShellPaths = []string{"/", "/dashboard/app.js", "/dashboard/app.css"}

// maxRequests bounds the recent requests kept per decode runner and
// returned in a State.
const maxRequests = 200

// Reload is the outcome of the last (re)load of the cluster file.
type Reload struct {
	OK      bool      `json:"ok"`
	At      time.Time `json:"at"`
	Error   string    `json:"error,omitempty"`
	Changes string    `json:"changes,omitempty"`
	Pending string    `json:"pending,omitempty"` // changed settings only a restart applies
}

// Runner is one of this host's runners as the supervisor keeps it.
type Runner struct {
	Spec   config.Runner  `json:"spec"`
	Status process.Status `json:"status"`
}

// Local is what the supervisor knows about itself, asked on every view.
type Local struct {
	Config     *config.Config
	Host       string
	Digest     string // sha256 of the cluster file in force
	API        string // this gateway's URL
	Started    time.Time
	LastReload Reload
	Runners    []Runner
	Decode     map[string]gateway.Health // the gateway's view of every decode runner, by address
}

// Options configure a Dashboard.
type Options struct {
	Local func() Local
	// Port is the gateway port of the other hosts (every host serves the
	// API on the same port).
	Port int
	// Key, when set, gives the API key sent to peers (nil: none).
	Key func() []byte
	// GPU, when set, samples this host's GPUs.
	GPU    func() ([]gpu.Sample, error)
	Client *http.Client // default: 2 s timeout
	Logger *slog.Logger
	// Every is how often /exo/events sends (default 1 s).
	Every time.Duration
	// History, when set, is where the supervisor records its runners'
	// state changes.
	History *History
}

// Dashboard serves the pages and the status API.
type Dashboard struct {
	o   Options
	log *slog.Logger

	jmu      sync.Mutex
	jAt      time.Time
	journals map[string]*runnerJournal // by runner name

	emu  sync.Mutex
	load map[string]loadSample // first loading sample by runner name + pid

	smu   sync.Mutex
	state *State
	sAt   time.Time
}

// New returns a Dashboard.
func New(o Options) *Dashboard {
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 2 * time.Second}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Every <= 0 {
		o.Every = time.Second
	}
	return &Dashboard{o: o, log: o.Logger, journals: map[string]*runnerJournal{}, load: map[string]loadSample{}}
}

// Register adds the pages and the API to mux.
func (d *Dashboard) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", d.serveIndex)
	mux.HandleFunc("GET /dashboard/{file}", d.serveStatic)
	mux.HandleFunc("GET "+HostPath, d.serveHost)
	mux.HandleFunc("GET "+StatePath, d.serveState)
	mux.HandleFunc("GET "+EventsPath, d.serveEvents)
}

// Memory is a host's memory.
type Memory struct {
	Kind      string `json:"kind"` // "system memory", "unified memory"
	Total     uint64 `json:"total_bytes"`
	Used      uint64 `json:"used_bytes"`
	Available uint64 `json:"available_bytes"`
}

// RunnerView is one runner with what the dashboard derives for it.
type RunnerView struct {
	Spec   config.Runner  `json:"spec"`
	Status process.Status `json:"status"`
	// LoadETA is the predicted time left loading (download and load), from
	// the progress made since loading began; 0 when not loading or unknown.
	LoadETA float64 `json:"load_eta_s,omitempty"`
	// History is its recent state changes, oldest first.
	History []Transition `json:"history,omitempty"`
	// EngineMemory is a decode runner's own account of its engine's memory
	// (MLX: active, cache, peak), from its journal; nil where the backend
	// keeps none (cpu).
	EngineMemory *EngineMemory `json:"engine_memory,omitempty"`
}

// EngineMemory is a runner's engine memory (runners/decode.EngineMemory).
type EngineMemory struct {
	Active  int64     `json:"active_bytes"`
	Cache   int64     `json:"cache_bytes"`
	Peak    int64     `json:"peak_bytes"`
	Sampled time.Time `json:"sampled"`
}

// Request is one request a decode runner served: its journal record
// (runners/decode.RequestRecord's fields) with where it ran.
type Request struct {
	Key              string    `json:"key"` // unique in the cluster: host/runner/pid/seq
	Host             string    `json:"host"`
	Runner           string    `json:"runner"`
	Seq              uint64    `json:"seq"`
	ID               string    `json:"id"`
	Model            string    `json:"model"`
	Start            time.Time `json:"start"`
	Done             bool      `json:"done"`
	PromptTokens     int       `json:"prompt_tokens"`
	CachedTokens     int       `json:"cached_tokens"`
	CompletionTokens int       `json:"completion_tokens"`
	Route            string    `json:"route"`
	Reason           string    `json:"reason,omitempty"`
	Outcome          string    `json:"outcome,omitempty"`
	Endpoint         string    `json:"endpoint,omitempty"`
	PrefillHost      string    `json:"prefill_host,omitempty"`
	PredictedFill    float64   `json:"predicted_fill_s,omitempty"`
	Fill             float64   `json:"fill_s,omitempty"`
	TTFT             float64   `json:"ttft_s,omitempty"`
	KVBytes          int64     `json:"kv_bytes,omitempty"`
	KVTransfer       float64   `json:"kv_transfer_s,omitempty"`
	TokensPerSecond  float64   `json:"tokens_per_s,omitempty"`
	Duration         float64   `json:"duration_s,omitempty"`
	FinishReason     string    `json:"finish_reason,omitempty"`
	Error            string    `json:"error,omitempty"`
}

// Link is a decode runner's link to one prefill endpoint.
type Link struct {
	DecodeHost  string  `json:"decode_host"`
	Runner      string  `json:"runner"`
	Model       string  `json:"model"`
	PrefillHost string  `json:"prefill_host,omitempty"`
	Endpoint    string  `json:"endpoint"`
	Goodput     float64 `json:"goodput_bytes_per_s"`
	LastGoodput float64 `json:"last_goodput_bytes_per_s,omitempty"`
	Kind        string  `json:"kind"`
	Interface   string  `json:"interface,omitempty"`
	Up          bool    `json:"up"`
}

// HostView is one host as its own supervisor reports it (HostPath).
type HostView struct {
	Cluster     string                    `json:"cluster"`
	Name        string                    `json:"name"`
	Address     string                    `json:"address"`
	Backend     string                    `json:"backend"`
	Config      string                    `json:"config"`
	Digest      string                    `json:"config_sha256"`
	API         string                    `json:"api"`
	Time        time.Time                 `json:"time"` // its clock when it answered
	Started     time.Time                 `json:"started"`
	LastReload  Reload                    `json:"last_reload"`
	Memory      *Memory                   `json:"memory,omitempty"`
	MemoryError string                    `json:"memory_error,omitempty"`
	GPUs        []gpu.Sample              `json:"gpus,omitempty"`
	Runners     []RunnerView              `json:"runners"`
	Decode      map[string]gateway.Health `json:"decode_health"`
	Requests    []Request                 `json:"requests"`
	Links       []Link                    `json:"links"`
}

// HostState is one host of the cluster file as the answering gateway
// reached it.
type HostState struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	Backend string `json:"backend"`
	// Up: its supervisor answered HostPath through its gateway.
	Up    bool   `json:"up"`
	Error string `json:"error,omitempty"`
	// ClockOffset is its clock minus the answering host's, seconds, within
	// ±ClockUncertainty (half the round trip).
	ClockOffset      float64 `json:"clock_offset_s"`
	ClockUncertainty float64 `json:"clock_uncertainty_s"`
	// SameConfig: it runs the same cluster file as the answering host.
	SameConfig bool `json:"same_config"`
	// View is what it reported (its requests and links are in State's).
	View *HostView `json:"view,omitempty"`
}

// ModelRunner is one runner of a model, wherever it runs.
type ModelRunner struct {
	Host    string `json:"host"`
	Runner  string `json:"runner"`
	Role    string `json:"role"`
	Source  string `json:"source"`
	Address string `json:"address"`
	// Stage ("I/N") and Layers ("A:B") of a pipeline stage; empty for a
	// whole copy.
	Stage  string `json:"stage,omitempty"`
	Layers string `json:"layers,omitempty"`
	// Tensor ("I/N") of a tensor-parallel rank; empty otherwise.
	Tensor string `json:"tensor,omitempty"`
	// State is the runner's process state (starting, ready, unhealthy,
	// backoff, crashloop, stopped), "unknown" when its host's supervisor
	// does not answer, or "waiting" for a pipeline stage not started yet
	// (LastError says why: its split waits for the hosts' memory).
	State            string                    `json:"state"`
	Since            time.Time                 `json:"since,omitzero"`
	PID              int                       `json:"pid,omitempty"`
	Restarts         int                       `json:"restarts"`
	LastExit         string                    `json:"last_exit,omitempty"`
	LastError        string                    `json:"last_error,omitempty"`
	NextStart        time.Time                 `json:"next_start,omitzero"`
	Health           string                    `json:"health,omitempty"` // its /health status: ok, loading, …
	Waiting          int                       `json:"waiting"`
	Running          int                       `json:"running"`
	Progress         float64                   `json:"progress,omitempty"` // loading, 0..1
	Phase            string                    `json:"phase,omitempty"`    // loading: download or load
	DoneBytes        int64                     `json:"done_bytes,omitempty"`
	TotalBytes       int64                     `json:"total_bytes,omitempty"`
	LoadETA          float64                   `json:"load_eta_s,omitempty"`
	PrefillEndpoints []process.PrefillEndpoint `json:"prefill_endpoints,omitempty"`
	// StageTransport: a pipeline stage's, where its hidden states go.
	StageTransport *process.StageTransport `json:"stage_transport,omitempty"`
	History        []Transition            `json:"history,omitempty"`
	EngineMemory   *EngineMemory           `json:"engine_memory,omitempty"`
}

// ModelState is one model of the cluster file and its runners.
type ModelState struct {
	Name string `json:"name"`
	// Runners are its runners, and (state "waiting") the stages of a
	// pipeline whose split waits for its hosts' memory.
	Runners []ModelRunner `json:"runners"`
	// Placements are its pipelines' and tensor groups' placement as the
	// answering host computed it: each group's stages and layer ranges,
	// the memory each host counted, and whom a split waits for.
	Placements []config.Placement `json:"placements,omitempty"`
	// Ready counts its decode runners that are ready (requests need one).
	ReadyDecode int `json:"ready_decode"`
	Decode      int `json:"decode"`
}

// State is the whole cluster (StatePath).
type State struct {
	Cluster string       `json:"cluster"`
	Host    string       `json:"host"` // the host that answered
	Time    time.Time    `json:"time"`
	Hosts   []HostState  `json:"hosts"`
	Models  []ModelState `json:"models"`
	Links   []Link       `json:"links"`
	// Requests are the recent requests of every decode runner, oldest
	// first, at most 200.
	Requests []Request `json:"requests"`
}

// Local returns this host's view.
func (d *Dashboard) Local(ctx context.Context) HostView {
	l := d.o.Local()
	c := l.Config
	h := c.Hosts[l.Host]
	v := HostView{Cluster: c.Cluster.Name, Name: l.Host, Address: h.Address, Backend: string(h.Backend), Config: c.Path,
		Digest: l.Digest, API: l.API, Started: l.Started, LastReload: l.LastReload, Decode: l.Decode}
	if m, err := readMemory(); err != nil {
		v.MemoryError = err.Error()
	} else {
		v.Memory = &m
	}
	if d.o.GPU != nil {
		if s, err := d.o.GPU(); err == nil {
			v.GPUs = s
		}
	}
	now := time.Now()
	var mems map[string]*EngineMemory
	v.Requests, v.Links, mems = d.pollJournals(ctx, l)
	for _, r := range l.Runners {
		v.Runners = append(v.Runners, RunnerView{Spec: r.Spec, Status: r.Status, LoadETA: d.eta(r, now), History: d.o.History.Of(r.Spec.Name),
			EngineMemory: mems[r.Spec.Name]})
	}
	for i := range v.Links {
		v.Links[i].PrefillHost = hostOfEndpoint(c, v.Links[i].Endpoint)
	}
	for i := range v.Requests {
		v.Requests[i].PrefillHost = hostOfEndpoint(c, v.Requests[i].Endpoint)
	}
	v.Time = time.Now()
	return v
}

// hostOfEndpoint names the host whose prefill runner listens on addr.
func hostOfEndpoint(c *config.Config, addr string) string {
	if addr == "" {
		return ""
	}
	for _, r := range c.AllRunners() {
		if r.Role == config.Prefill && r.Listen == addr {
			return r.Host
		}
	}
	return ""
}

type loadSample struct {
	at    time.Time
	phase string
	done  float64 // bytes of the phase when the runner reports them, else progress
}

// eta predicts the time left loading from the rate since the first sample
// of this start: of the current phase's bytes when the runner reports them
// (the download and the load go at different rates; an ETA during the
// download covers the download), else of its overall progress.
func (d *Dashboard) eta(r Runner, now time.Time) float64 {
	h := r.Status.Health
	key := r.Spec.Name + "/" + strconv.Itoa(r.Status.PID)
	d.emu.Lock()
	defer d.emu.Unlock()
	if h == nil || h.Status != "loading" {
		delete(d.load, key)
		return 0
	}
	done, left := h.Progress, 1-h.Progress
	if h.TotalBytes > 0 {
		done, left = float64(h.DoneBytes), float64(h.TotalBytes-h.DoneBytes)
	}
	first, ok := d.load[key]
	if !ok || first.phase != h.Phase {
		d.load[key] = loadSample{now, h.Phase, done}
		return 0
	}
	dx, dt := done-first.done, now.Sub(first.at).Seconds()
	if dx <= 0 || dt <= 0 {
		return 0
	}
	return left * dt / dx
}

// runnerJournal is what this host has read of one decode runner's journal.
type runnerJournal struct {
	reqs  []Request // oldest first
	links []Link
	mem   *EngineMemory
}

// pollJournals reads every local decode runner's new journal records (at
// most every 400 ms whoever asks) and returns the recent requests and links.
func (d *Dashboard) pollJournals(ctx context.Context, l Local) ([]Request, []Link, map[string]*EngineMemory) {
	d.jmu.Lock()
	defer d.jmu.Unlock()
	if time.Since(d.jAt) >= 400*time.Millisecond {
		var wg sync.WaitGroup
		for _, r := range l.Runners {
			if r.Spec.Role != config.Decode || r.Status.PID == 0 || r.Status.State == process.Starting {
				continue
			}
			j := d.journals[r.Spec.Name]
			if j == nil {
				j = &runnerJournal{}
				d.journals[r.Spec.Name] = j
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.pollJournal(ctx, l.Host, r, j)
			}()
		}
		wg.Wait()
		d.jAt = time.Now()
	}
	reqs, links, mems := []Request{}, []Link{}, map[string]*EngineMemory{}
	for _, r := range l.Runners {
		if j := d.journals[r.Spec.Name]; j != nil && r.Spec.Role == config.Decode {
			reqs = append(reqs, j.reqs...)
			if r.Status.State == process.Ready {
				links = append(links, j.links...)
				mems[r.Spec.Name] = j.mem
			}
		}
	}
	sortRequests(reqs)
	return reqs, links, mems
}

// journalAnswer is a decode runner's journal (runners/decode.Journal).
type journalAnswer struct {
	Requests []Request `json:"requests"`
	Links    []struct {
		Endpoint    string  `json:"endpoint"`
		Goodput     float64 `json:"goodput_bytes_per_s"`
		LastGoodput float64 `json:"last_goodput_bytes_per_s"`
		Up          bool    `json:"up"`
		Kind        string  `json:"kind"`
		Interface   string  `json:"interface"`
	} `json:"links"`
	Memory *EngineMemory `json:"engine_memory"`
}

func (d *Dashboard) pollJournal(ctx context.Context, host string, r Runner, j *runnerJournal) {
	pid := r.Status.PID
	prefix := fmt.Sprintf("%s/%s/%d/", host, r.Spec.Name, pid)
	// Ask again for the oldest record of this start still running, else
	// only for newer ones.
	var newest, oldestOpen uint64
	for _, q := range j.reqs {
		if !strings.HasPrefix(q.Key, prefix) {
			continue
		}
		newest = max(newest, q.Seq)
		if !q.Done && (oldestOpen == 0 || q.Seq < oldestOpen) {
			oldestOpen = q.Seq
		}
	}
	since := newest
	if oldestOpen > 0 {
		since = oldestOpen - 1
	}
	url := "http://" + r.Spec.HealthAddr() + journalPath + "?since=" + strconv.FormatUint(since, 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := d.o.Client.Do(req)
	if err != nil {
		d.log.Debug("decode runner's journal unreadable", "runner", r.Spec.Name, "err", err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return // a runner of another version: no journal
	}
	var a journalAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&a); err != nil {
		d.log.Debug("decode runner's journal undecodable", "runner", r.Spec.Name, "err", err)
		return
	}
	at := map[string]int{}
	for i, q := range j.reqs {
		at[q.Key] = i
	}
	for _, q := range a.Requests {
		q.Key, q.Host, q.Runner = prefix+strconv.FormatUint(q.Seq, 10), host, r.Spec.Name
		if i, ok := at[q.Key]; ok {
			j.reqs[i] = q
		} else {
			j.reqs = append(j.reqs, q)
		}
	}
	sortRequests(j.reqs)
	if len(j.reqs) > maxRequests {
		j.reqs = slices.Delete(j.reqs, 0, len(j.reqs)-maxRequests)
	}
	j.mem = a.Memory
	j.links = j.links[:0]
	for _, l := range a.Links {
		j.links = append(j.links, Link{DecodeHost: host, Runner: r.Spec.Name, Model: r.Spec.Model, Endpoint: l.Endpoint,
			Goodput: l.Goodput, LastGoodput: l.LastGoodput, Kind: l.Kind, Interface: l.Interface, Up: l.Up})
	}
}

func sortRequests(rs []Request) {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Start.Before(rs[j].Start) })
}

// State returns the cluster's state, computed at most every 400 ms
// whoever asks.
func (d *Dashboard) State(ctx context.Context) *State {
	d.smu.Lock()
	defer d.smu.Unlock()
	if d.state != nil && time.Since(d.sAt) < 400*time.Millisecond {
		return d.state
	}
	d.state, d.sAt = d.collect(ctx), time.Now()
	return d.state
}

func (d *Dashboard) collect(ctx context.Context) *State {
	l := d.o.Local()
	c := l.Config
	st := &State{Cluster: c.Cluster.Name, Host: l.Host, Links: []Link{}, Requests: []Request{}}
	names := c.HostNames()
	st.Hosts = make([]HostState, len(names))
	var wg sync.WaitGroup
	for i, hn := range names {
		h := c.Hosts[hn]
		hs := &st.Hosts[i]
		*hs = HostState{Name: hn, Address: h.Address, Backend: string(h.Backend)}
		if hn == l.Host {
			v := d.Local(ctx)
			hs.Up, hs.SameConfig, hs.View = true, true, &v
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			v, err := d.peer(ctx, net.JoinHostPort(h.Address, strconv.Itoa(d.o.Port)))
			rtt := time.Since(t0)
			if err != nil {
				hs.Error = err.Error()
				return
			}
			hs.Up, hs.View, hs.SameConfig = true, v, v.Digest == l.Digest
			hs.ClockOffset = v.Time.Sub(t0.Add(rtt / 2)).Seconds()
			hs.ClockUncertainty = (rtt / 2).Seconds()
		}()
	}
	wg.Wait()
	st.Time = time.Now()
	for i := range st.Hosts {
		if v := st.Hosts[i].View; v != nil {
			st.Requests = append(st.Requests, v.Requests...)
			st.Links = append(st.Links, v.Links...)
			v.Requests, v.Links = nil, nil
		}
	}
	sortRequests(st.Requests)
	if len(st.Requests) > maxRequests {
		st.Requests = st.Requests[len(st.Requests)-maxRequests:]
	}
	st.Models = models(c, st.Hosts)
	return st
}

// peer asks another host's supervisor for its view, through its gateway.
func (d *Dashboard) peer(ctx context.Context, addr string) (*HostView, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+HostPath, nil)
	if err != nil {
		return nil, err
	}
	if d.o.Key != nil {
		if k := d.o.Key(); k != nil {
			req.Header.Set("Authorization", "Bearer "+string(k))
		}
	}
	resp, err := d.o.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("no supervisor answering at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("%s refuses this host's API key: put the same key in [api] api_key_file on every host", addr)
	case http.StatusNotFound:
		return nil, fmt.Errorf("%s has no %s (an older exo there?)", addr, HostPath)
	default:
		return nil, fmt.Errorf("%s: %s", addr, resp.Status)
	}
	var v HostView
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("%s%s: %w", addr, HostPath, err)
	}
	return &v, nil
}

// models lists every model of the file with each of its runners as its
// host reported it.
func models(c *config.Config, hosts []HostState) []ModelState {
	views := map[string]*HostView{}
	for _, h := range hosts {
		if h.View != nil {
			views[h.Name] = h.View
		}
	}
	var out []ModelState
	for _, m := range c.Models {
		ms := ModelState{Name: m.Name, Runners: []ModelRunner{}}
		for _, r := range c.AllRunners() {
			if r.Model != m.Name {
				continue
			}
			mr := ModelRunner{Host: r.Host, Runner: r.Name, Role: r.Role, Source: r.Source, Address: r.HealthAddr(), State: "unknown",
				Stage: r.Stage, Layers: r.Layers, Tensor: r.Tensor}
			if r.Role == config.Prefill {
				mr.Address = r.Listen
			}
			if v := views[r.Host]; v != nil {
				mr.State = "not running" // the host's supervisor runs another file
				for _, rv := range v.Runners {
					if rv.Spec.Name != r.Name {
						continue
					}
					s := rv.Status
					mr.State, mr.Since, mr.PID, mr.Restarts = string(s.State), s.Since, s.PID, s.Restarts
					mr.LastExit, mr.LastError, mr.NextStart, mr.LoadETA = s.LastExit, s.LastError, s.NextStart, rv.LoadETA
					mr.History, mr.EngineMemory = rv.History, rv.EngineMemory
					if h := s.Health; h != nil {
						mr.Health, mr.Waiting, mr.Running, mr.Progress = h.Status, h.Waiting, h.Running, h.Progress
						mr.PrefillEndpoints, mr.StageTransport = h.PrefillEndpoints, h.StageTransport
						mr.Phase, mr.DoneBytes, mr.TotalBytes = h.Phase, h.DoneBytes, h.TotalBytes
					}
				}
			}
			if r.Role == config.Decode {
				ms.Decode++
				if mr.State == string(process.Ready) {
					ms.ReadyDecode++
				}
			}
			ms.Runners = append(ms.Runners, mr)
		}
		for _, p := range c.Placements() {
			if p.Model != m.Name {
				continue
			}
			ms.Placements = append(ms.Placements, p)
			if p.Waiting == nil {
				continue
			}
			r := m.Decode
			if p.Role == config.Prefill {
				r = m.Prefill
			}
			for i, hn := range p.Hosts {
				ms.Runners = append(ms.Runners, ModelRunner{Host: hn, Runner: config.StageRunnerName(m.Name, p.Role, r != nil && r.Groups != nil, p.Group, i),
					Role: p.Role, Source: r.Source, State: "waiting", Stage: fmt.Sprintf("%d/%d", i, len(p.Hosts)), LastError: p.Note})
				if p.Role == config.Decode {
					ms.Decode++
				}
			}
		}
		out = append(out, ms)
	}
	return out
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (d *Dashboard) serveHost(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, d.Local(r.Context()))
}

func (d *Dashboard) serveState(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, d.State(r.Context()))
}

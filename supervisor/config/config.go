// Package config owns the cluster file: its schema, defaults, loading,
// validation (every error with file:line:column and a reason), the
// placement of sharded models (Place, Split: pipeline stages by hand or by
// memory, tensor ranks, from facts its caller reads with internal/modelinfo),
// the plan of runners each host must run (with deterministic ports), host
// identity and Diff between two plans. It is pure: it starts no processes,
// opens no sockets and reads no model files, and it must not import
// runners/ or any other supervisor package.
package config

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Defaults.
const (
	DefaultPath                   = "/etc/exo/cluster.toml"
	DefaultAPIPort                = 52415
	DefaultRunnerPortBase         = 52500
	DefaultRemotePrefillMinTokens = 256
	// PortsPerModel is the stride of automatically assigned ports: model i
	// (0-based, file order) gets base+10i (decode HTTP), base+10i+1 (prefill
	// KV wire) and base+10i+2 (prefill /health and /metrics).
	PortsPerModel = 10
)

//go:embed default.toml
var defaultTOML string

// DefaultName is the Path of the embedded default config.
const DefaultName = "(embedded default)"

// Backend is what a host computes on.
type Backend string

// Backends.
const (
	CUDA  Backend = "cuda"
	Metal Backend = "metal"
	CPU   Backend = "cpu"
	// MLXCPU is MLX on the host's CPU device (runners get --backend mlx
	// --device cpu): hosts without a GPU, and tests of the MLX path.
	MLXCPU Backend = "mlx-cpu"
)

// Shard modes of a model's decode or prefill hosts.
const (
	// ShardReplicas: every listed host runs a whole copy (the default).
	ShardReplicas = "replicas"
	// ShardPipeline: the listed hosts are the stages, in order, each
	// holding a range of the layers.
	ShardPipeline = "pipeline"
	// ShardTensor: the listed hosts are tensor-parallel ranks, in rank
	// order, each holding 1/N of every layer (decode, or prefill: each
	// prefill rank serves its KV heads).
	ShardTensor = "tensor"
)

// StageLinkPortOffset is the offset, within a model's block of
// PortsPerModel ports, of a pipeline decode stage's link port (contract C1:
// runner_port_base + 10*i + 3).
const StageLinkPortOffset = 3

// TensorLinkPortOffset is the offset of a tensor-parallel decode rank's
// link port (contract C3: runner_port_base + 10*i + 4; MLX's ring takes the
// port after it).
const TensorLinkPortOffset = 4

// PrefillStageLinkPortOffset is the offset of a pipeline prefill stage's
// link port (contract C4: runner_port_base + 10*i + 6).
const PrefillStageLinkPortOffset = 6

// PrefillTensorLinkPortOffset is the offset of a tensor-parallel prefill
// rank's link port (runner_port_base + 10*i + 8; MLX's ring, or NCCL's
// rendezvous on CUDA hosts, takes the port after it).
const PrefillTensorLinkPortOffset = 8

// Config is a loaded, defaulted and validated cluster file.
type Config struct {
	Path    string  `toml:"-"`
	Cluster Cluster `toml:"cluster"`
	API     API     `toml:"api"`
	// Supervisor tunes the supervisor itself (liveness limits).
	Supervisor Supervisor       `toml:"supervisor"`
	Hosts      map[string]*Host `toml:"hosts"`
	Models     []*Model         `toml:"models"`

	pos []keyPos
	// stages holds each pipeline group's placement, keyed by
	// stageKey(model, role, group): from layers by hand at load, or from
	// Place.
	stages map[string][]Stage
	// placed is what the last Place found.
	placed []Placement
}

// Cluster holds cluster-wide settings.
type Cluster struct {
	Name string `toml:"name"`
	// SecretFile authenticates the KV channel; passed to every runner.
	SecretFile string `toml:"secret_file"`
	// ModelsDir is the model store passed to runners (--models-dir).
	ModelsDir string `toml:"models_dir"`
	// RunnerPortBase is where automatic runner ports start.
	RunnerPortBase int `toml:"runner_port_base"`
	// Offline forbids runners to download models (--offline).
	Offline bool `toml:"offline"`
	// Insecure allows a cluster whose runners listen beyond loopback to run
	// without secret_file (anyone who reaches a KV port gets prefill).
	Insecure bool `toml:"insecure"`
}

// API is the gateway every supervisor serves.
type API struct {
	Listen string `toml:"listen"` // interface to bind; "" = all
	Port   int    `toml:"port"`
	// APIKeyFile holds the bearer token every request to the gateway must
	// carry ("Authorization: Bearer <key>"); "" = no key.
	APIKeyFile string `toml:"api_key_file"`
	// OpenPaths are served without the key when APIKeyFile is set: a subset
	// of /health and /metrics (default both).
	OpenPaths []string `toml:"open_paths"`
	// CORSOrigins are the origins browsers may call the gateway from
	// ("https://app.example", or "*" for any); empty: no CORS headers.
	CORSOrigins []string `toml:"cors_origins"`
}

// Supervisor is the [supervisor] table: how long a runner's /health may
// stay unanswered before the supervisor restarts it. Values are Go
// durations ("10s", "2m"); a negative one ("-1s") turns that check off, 0 is
// refused; unset keys keep the defaults (10 s, 2 min). The supervise flags
// --liveness and --liveness-starting, when given, win over the file.
type Supervisor struct {
	LivenessTimeout         string `toml:"liveness_timeout"`
	LivenessStartingTimeout string `toml:"liveness_starting_timeout"`
	// Liveness and LivenessStarting are the parsed values (0 = unset).
	Liveness         time.Duration `toml:"-"`
	LivenessStarting time.Duration `toml:"-"`
}

// KeyExemptPaths are the paths [api] open_paths may name.
var KeyExemptPaths = []string{"/health", "/metrics"}

// Host is one machine of the cluster.
type Host struct {
	Name    string  `toml:"-"`
	Address string  `toml:"address"`
	Backend Backend `toml:"backend"`
	// Threads is the cpu backend's thread count (--threads; 0 = all cores).
	Threads int `toml:"threads"`
	// MemoryGiB is the memory the host gives to weights and KV, in GiB
	// (nil: unset). Pipeline placement splits layers in proportion to it.
	MemoryGiB *float64 `toml:"memory_gib"`
	// RDMA names, per peer host, the RDMA device of this host that is
	// cabled to that peer over Thunderbolt 5 (e.g. rdma = { m2 =
	// "rdma_en3" }; `ibv_devices` lists them). A tensor group whose hosts
	// are all metal and name RDMA devices joins MLX's JACCL backend
	// instead of the ring: every pair must then be cabled (a full mesh).
	// Metal hosts only.
	RDMA map[string]string `toml:"rdma"`
}

// Model is one served model: its decode runners and optional prefill runners.
type Model struct {
	Name string `toml:"name"`
	// Source is the default weight source of both roles.
	Source                 string `toml:"source"`
	Decode                 *Role  `toml:"decode"`
	Prefill                *Role  `toml:"prefill"`
	RemotePrefillMinTokens int    `toml:"remote_prefill_min_tokens"`
	// RemotePrefillRoute is how a long prompt picks local or remote
	// prefill (--remote-prefill-route): "cost" (predicted time from
	// measured rates, queues and links) or "floor" (the min tokens alone);
	// "" = the runner's default: cost, but floor for pipelined or
	// tensor-parallel models (validate refuses "cost" there).
	RemotePrefillRoute string `toml:"remote_prefill_route"`
	// KVWireDType is the KV dtype the decode runners ask of prefill runners
	// (--kv-wire-dtype): "fp8" (E4M3 with per-head scales, half of bf16's
	// bytes; opt-in, lossy) or "" = the decode cache's own dtype.
	KVWireDType string `toml:"kv_wire_dtype"`
	// KVStreams is how many TCP connections the decode runners stripe
	// each KV transfer over (--kv-streams, 1 to 16; nil = 1).
	KVStreams *int `toml:"kv_streams"`
	MaxQueue  int  `toml:"max_queue"`
	// MaxBatch is how many generations a decode runner runs at once, their
	// steps batched (--max-batch; 0 = the runner's default, 4).
	MaxBatch int `toml:"max_batch"`
	// PrefillChunk is the prefill chunk in tokens (--prefill-chunk; 0 = the runners' default).
	PrefillChunk int `toml:"prefill_chunk"`
	// PrefillConnectTimeoutMs bounds a decode runner's connect + hello to a
	// prefill endpoint (--prefill-connect-timeout; 0 = the runner's
	// default, 1000). A prefill runner that does not answer in time is
	// skipped until it answers a probe.
	PrefillConnectTimeoutMs int `toml:"prefill_connect_timeout_ms"`
	// Defaults are sampling defaults over the model's own
	// (generation_config.json, GGUF general.sampling.*), under each
	// request's fields (decode runners' --default-*).
	Defaults *SamplingDefaults `toml:"defaults"`
	// Speculative is the decode runners' speculative decoding
	// ([models.speculative]; nil = off).
	Speculative *Speculative `toml:"speculative"`
}

// Speculative is a model's [models.speculative] table.
type Speculative struct {
	// Mode is "off", "prompt-lookup" or "draft" (--speculative; "" = off).
	Mode string `toml:"mode"`
	// Tokens is the most tokens drafted per step (--speculative-tokens,
	// 1 to 64; 0 = the runner's default, 8).
	Tokens int `toml:"tokens"`
	// Draft is the draft model's source (--draft), for mode "draft" only.
	Draft string `toml:"draft"`
}

// SamplingDefaults is a model's [models.defaults] table; unset keys keep
// the model's own default.
type SamplingDefaults struct {
	Temperature       *float64 `toml:"temperature"`
	TopP              *float64 `toml:"top_p"`
	TopK              *int     `toml:"top_k"`
	MinP              *float64 `toml:"min_p"`
	RepetitionPenalty *float64 `toml:"repetition_penalty"`
}

// Role is the decode or prefill part of a model.
type Role struct {
	Hosts  []string `toml:"hosts"`
	Source string   `toml:"source"`
	// Port is the decode runner's HTTP port, or the prefill runner's KV port.
	Port int `toml:"port"`
	// MetricsPort is the prefill runner's HTTP port (/health, /metrics).
	MetricsPort int `toml:"metrics_port"`
	// PrefixCacheMiB bounds the prefill runner's prefix cache
	// (--prefix-cache-mib; 0 = off; unset = the runner's default).
	PrefixCacheMiB *int `toml:"prefix_cache_mib"`
	// Shard is how the hosts share the model: ShardReplicas ("" = it),
	// ShardPipeline or ShardTensor.
	Shard string `toml:"shard"`
	// Layers fixes a pipeline's split by hand: layer counts per stage, in
	// host order, summing to the model's layers (nil: split by memory).
	// With Groups, every group is split so; with Tensor, one count per
	// stage.
	Layers []int `toml:"layers"`
	// Tensor makes each stage of a decode pipeline a tensor-parallel
	// group of this many ranks (0: one host per stage): the hosts, in
	// order, form the stages Tensor at a time (stage I: hosts
	// [I·Tensor, (I+1)·Tensor)), the first of each its rank 0.
	Tensor int `toml:"tensor"`
	// Groups makes a decode or prefill pipeline several pipeline groups,
	// replicas of each other: each inner list is one group's stage hosts
	// in order (instead of hosts). Validation sets Hosts to every
	// group's hosts, group after group.
	Groups [][]string `toml:"groups"`
}

// Pipeline reports whether the role's hosts are pipeline stages.
func (r *Role) Pipeline() bool { return r != nil && r.Shard == ShardPipeline }

// StageRanks is how many tensor ranks each pipeline stage has (1: one
// host per stage).
func (r *Role) StageRanks() int {
	if r == nil || !r.Pipeline() || r.Tensor < 2 {
		return 1
	}
	return r.Tensor
}

// StageLeads returns the hosts of a pipeline group (hosts) that lead its
// stages: every host, or with Tensor each stage's rank 0.
func (r *Role) StageLeads(hosts []string) []string {
	m := r.StageRanks()
	if m == 1 {
		return hosts
	}
	var out []string
	for i := 0; i < len(hosts); i += m {
		out = append(out, hosts[i])
	}
	return out
}

// StageGroups returns a pipeline's groups of stage hosts: Groups, else
// Hosts as the one group.
func (r *Role) StageGroups() [][]string {
	if r.Groups != nil {
		return r.Groups
	}
	return [][]string{r.Hosts}
}

// Error is one problem in a cluster file.
type Error struct {
	File string
	Pos  Pos
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Pos.Line, e.Pos.Col, e.Msg)
}

// Errors is every problem found in a file, in file order.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// ErrInvalid is wrapped by every load error caused by the file's content.
var ErrInvalid = errors.New("invalid cluster file")

// Is lets errors.Is(err, ErrInvalid) match.
func (es Errors) Is(target error) bool { return target == ErrInvalid }

// Load reads, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster file: %w", err)
	}
	return Parse(path, data)
}

// Default returns the embedded one-host default config: host "local" on
// 127.0.0.1, cpu backend, SmolLM2-135M-Instruct served with decode and
// prefill both on it.
func Default() *Config {
	c, err := Parse(DefaultName, []byte(defaultTOML))
	if err != nil {
		panic("embedded default config is invalid: " + err.Error())
	}
	return c
}

// DefaultText is the embedded default config as TOML.
func DefaultText() string { return defaultTOML }

var typeErrRe = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)

// Parse decodes, defaults and validates data; name is used in messages.
func Parse(name string, data []byte) (*Config, error) {
	c := &Config{Path: name}
	src := string(data)
	md, err := toml.Decode(src, c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, Errors{{name, offsetPos(src, pe.Position.Start), pe.Message}}
		}
		if m := typeErrRe.FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, Errors{{name, Pos{line, keyCol(src, line, m[2])}, fmt.Sprintf("%s: %s", lastComponent(m[2]), m[3])}}
		}
		return nil, Errors{{name, Pos{1, 1}, err.Error()}}
	}
	c.pos = scanPositions(src)
	var errs Errors
	// Unknown keys: report each topmost undecoded key at every place it occurs.
	undecoded := map[string]bool{}
	for _, k := range md.Undecoded() {
		undecoded[k.String()] = true
	}
	seen := map[Pos]bool{}
	for _, kp := range c.pos {
		st := stripIdx(kp.path)
		if !undecoded[st] || seen[kp.pos] {
			continue
		}
		parentUnknown := false
		for i := 1; i < len(kp.path); i++ {
			if undecoded[stripIdx(kp.path[:i])] {
				parentUnknown = true
			}
		}
		if parentUnknown {
			continue
		}
		seen[kp.pos] = true
		errs = append(errs, &Error{name, kp.pos, fmt.Sprintf("unknown key %q%s", lastComponent(st), knownKeysHint(kp.path))})
	}
	c.applyDefaults()
	if !md.IsDefined("api", "open_paths") {
		c.API.OpenPaths = append([]string(nil), KeyExemptPaths...)
	}
	errs = append(errs, c.validate()...)
	if len(errs) > 0 {
		sort.SliceStable(errs, func(i, j int) bool {
			a, b := errs[i].Pos, errs[j].Pos
			return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
		})
		return nil, errs
	}
	return c, nil
}

// offsetPos converts a byte offset into a line and column.
func offsetPos(src string, off int) Pos {
	off = min(max(off, 0), len(src))
	line := 1 + strings.Count(src[:off], "\n")
	start := strings.LastIndexByte(src[:off], '\n') + 1
	return Pos{line, 1 + len([]rune(src[start:off]))}
}

func lastComponent(k string) string {
	if i := strings.LastIndexByte(k, '.'); i >= 0 {
		return k[i+1:]
	}
	return k
}

// keyCol finds the column of key's last component on line (1 if unknown).
func keyCol(src string, line int, key string) int {
	lines := strings.Split(src, "\n")
	if line < 1 || line > len(lines) {
		return 1
	}
	if i := strings.Index(lines[line-1], lastComponent(key)); i >= 0 {
		return len([]rune(lines[line-1][:i])) + 1
	}
	return 1
}

var knownKeys = map[string][]string{
	"":                   {"cluster", "api", "supervisor", "hosts", "models"},
	"cluster":            {"name", "secret_file", "models_dir", "runner_port_base", "offline", "insecure"},
	"api":                {"listen", "port", "api_key_file", "open_paths", "cors_origins"},
	"supervisor":         {"liveness_timeout", "liveness_starting_timeout"},
	"hosts.*":            {"address", "backend", "threads", "memory_gib", "rdma"},
	"models":             {"name", "source", "decode", "prefill", "remote_prefill_min_tokens", "remote_prefill_route", "kv_wire_dtype", "kv_streams", "max_queue", "max_batch", "prefill_chunk", "prefill_connect_timeout_ms", "defaults", "speculative"},
	"models.defaults":    {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"},
	"models.speculative": {"mode", "tokens", "draft"},
	"models.decode":      {"hosts", "groups", "source", "port", "shard", "layers", "tensor"},
	"models.prefill":     {"hosts", "groups", "source", "port", "metrics_port", "prefix_cache_mib", "shard", "layers"},
}

func knownKeysHint(path []string) string {
	var parent []string
	for _, p := range path[:len(path)-1] {
		if !strings.HasPrefix(p, idxMark) {
			parent = append(parent, p)
		}
	}
	k := joinPath(parent)
	if len(parent) == 2 && parent[0] == "hosts" {
		k = "hosts.*"
	}
	if ks, ok := knownKeys[k]; ok {
		return " (known keys here: " + strings.Join(ks, ", ") + ")"
	}
	return ""
}

// at returns the position of the key path (components as strings, indexes
// as ints), falling back to the nearest enclosing key that has one.
func (c *Config) at(path ...any) Pos {
	p := make([]string, len(path))
	for i, x := range path {
		switch v := x.(type) {
		case int:
			p[i] = idx(v)
		case string:
			p[i] = v
		}
	}
	for n := len(p); n > 0; n-- {
		want := joinPath(p[:n])
		for _, kp := range c.pos {
			if joinPath(kp.path) == want {
				return kp.pos
			}
		}
	}
	return Pos{1, 1}
}

func (c *Config) applyDefaults() {
	if c.API.Port == 0 {
		c.API.Port = DefaultAPIPort
	}
	if c.Cluster.RunnerPortBase == 0 {
		c.Cluster.RunnerPortBase = DefaultRunnerPortBase
	}
	if c.Hosts == nil {
		c.Hosts = map[string]*Host{}
	}
	for name, h := range c.Hosts {
		if h == nil {
			h = &Host{}
			c.Hosts[name] = h
		}
		h.Name = name
	}
	for i, m := range c.Models {
		if m == nil {
			continue
		}
		if m.RemotePrefillMinTokens == 0 {
			m.RemotePrefillMinTokens = DefaultRemotePrefillMinTokens
		}
		base := c.Cluster.RunnerPortBase + PortsPerModel*i
		if m.Decode != nil {
			if m.Decode.Source == "" {
				m.Decode.Source = m.Source
			}
			if m.Decode.Port == 0 {
				m.Decode.Port = base
			}
		}
		if m.Prefill != nil {
			if m.Prefill.Source == "" {
				m.Prefill.Source = m.Source
			}
			if m.Prefill.Port == 0 {
				m.Prefill.Port = base + 1
			}
			if m.Prefill.MetricsPort == 0 {
				m.Prefill.MetricsPort = base + 2
			}
		}
	}
}

// HostNames returns the hosts' names, sorted.
func (c *Config) HostNames() []string {
	names := make([]string, 0, len(c.Hosts))
	for n := range c.Hosts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Model returns the model called name, or nil.
func (c *Config) Model(name string) *Model {
	for _, m := range c.Models {
		if m.Name == name {
			return m
		}
	}
	return nil
}

package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Roles.
const (
	Decode  = "decode"
	Prefill = "prefill"
)

// Runner is one runner process as the cluster file defines it. Two Runners
// with equal fields are the same process; any difference means a restart.
type Runner struct {
	Name    string `json:"name"` // "<model>-<role>", unique on a host
	Host    string `json:"host"`
	Address string `json:"address"` // the host's address
	Model   string `json:"model"`
	Role    string `json:"role"` // Decode or Prefill
	Source  string `json:"source"`
	// Listen is the decode runner's HTTP address or the prefill runner's KV
	// wire address; Metrics is the prefill runner's HTTP address.
	Listen                 string   `json:"listen"`
	Metrics                string   `json:"metrics,omitempty"`
	Prefill                []string `json:"prefill,omitempty"`        // decode: prefill KV endpoints, file order
	PrefillHealth          []string `json:"prefill_health,omitempty"` // decode: those prefill runners' /health addresses, same order
	RemotePrefillMinTokens int      `json:"remote_prefill_min_tokens,omitempty"`
	RemotePrefillRoute     string   `json:"remote_prefill_route,omitempty"` // decode: cost or floor; "" = the runner's default
	KVWireDType            string   `json:"kv_wire_dtype,omitempty"`        // decode: fp8; "" = the cache's dtype
	KVStreams              int      `json:"kv_streams,omitempty"`           // decode: connections per KV transfer; 0 = 1
	// PrefillConnectTimeoutMs: decode only; 0 = the runner's default.
	PrefillConnectTimeoutMs int    `json:"prefill_connect_timeout_ms,omitempty"`
	SecretFile              string `json:"secret_file,omitempty"`
	ModelsDir               string `json:"models_dir,omitempty"`
	Backend                 string `json:"backend"`
	Device                  string `json:"device,omitempty"`
	MaxQueue                int    `json:"max_queue,omitempty"`
	MaxBatch                int    `json:"max_batch,omitempty"` // decode only
	PrefillChunk            int    `json:"prefill_chunk,omitempty"`
	PrefixCacheMiB          *int   `json:"prefix_cache_mib,omitempty"` // prefill only
	Threads                 int    `json:"threads,omitempty"`
	Offline                 bool   `json:"offline,omitempty"`
	// Defaults: decode runners' sampling defaults (--default-*).
	Defaults *SamplingDefaults `json:"defaults,omitempty"`
	// Speculative and SpecTokens: decode runners' --speculative and
	// --speculative-tokens ("" and 0: the runner's defaults).
	Speculative string `json:"speculative,omitempty"`
	SpecTokens  int    `json:"speculative_tokens,omitempty"`
	Draft       string `json:"draft,omitempty"` // --draft (mode draft)
	// Pipeline stage (contract C1), decode only; zero for a whole copy.
	// Layers is "A:B" (half-open, 0-based), Stage "I/N", StageListen
	// where this stage takes the link from the one before, StageNext the
	// next stage's StageListen (the last stage's is stage 0's). Group is
	// the whole split ("0:12,12:24"): a change anywhere restarts every
	// stage.
	Layers      string `json:"layers,omitempty"`
	Stage       string `json:"stage,omitempty"`
	StageListen string `json:"stage_listen,omitempty"`
	StageNext   string `json:"stage_next,omitempty"`
	Group       string `json:"group,omitempty"`
	// Tensor-parallel rank (contract C3), decode only: Tensor is "I/N",
	// TensorPeers every rank's tensor link address in rank order (rank 0
	// listens on the first). Group then names the whole group.
	Tensor      string   `json:"tensor,omitempty"`
	TensorPeers []string `json:"tensor_peers,omitempty"`
	// TensorRDMA is a JACCL group's RDMA device matrix (--tensor-rdma,
	// JSON, rank order, null on the diagonal; "" = MLX's ring).
	TensorRDMA string `json:"tensor_rdma,omitempty"`
	// RingHostfile is MLX's ring hostfile (JSON, one ["IP:PORT"] per
	// rank: each stage host's address at its stage link port + 1) of a
	// decode pipeline whose stages are all on MLX hosts, one runner per
	// stage, or of a prefill pipeline (group) whose stages all are; ""
	// otherwise. The supervisor writes it to a file and starts
	// the runner with MLX_HOSTFILE naming it and MLX_RANK = RingRank (its
	// stage index). Every supervisor computes it from the same file.
	RingHostfile string `json:"ring_hostfile,omitempty"`
	RingRank     int    `json:"ring_rank,omitempty"`
}

// Env is what the runner's environment adds for its MLX ring (hostfile:
// the path RingHostfile was written to): MLX_HOSTFILE and MLX_RANK, or
// nil without a ring.
func (r Runner) Env(hostfile string) []string {
	if r.RingHostfile == "" {
		return nil
	}
	return []string{"MLX_HOSTFILE=" + hostfile, "MLX_RANK=" + strconv.Itoa(r.RingRank)}
}

// ringHostfile is MLX's ring hostfile for a decode or prefill pipeline
// group's stages on port (each stage's link port; its ring takes port + 1), or
// "" unless every stage is one MLX runner (a tensor stage's process joins
// its ranks' group, and a cpu stage has no distributed engine: those
// stages keep the hidden states on the stage link).
func (c *Config) ringHostfile(stages []Stage, ranks, port int) string {
	if ranks != 1 || len(stages) < 2 {
		return ""
	}
	hosts := make([][]string, len(stages))
	for i, st := range stages {
		h := c.Hosts[st.Host]
		if h == nil || h.Backend == CPU {
			return ""
		}
		hosts[i] = []string{net.JoinHostPort(h.Address, strconv.Itoa(port+1))}
	}
	b, err := json.Marshal(hosts)
	if err != nil {
		return ""
	}
	return string(b)
}

// Stage is one pipeline stage: the host and its layer range [Start, End)
// of the whole model, with the placement's estimates (0 when the split was
// made by hand without the model's facts).
type Stage struct {
	Host  string `json:"host"`
	Start int    `json:"layer_start"`
	End   int    `json:"layer_end"`
	// WeightBytes are the stage's weights (its layers, plus the embedding
	// on stage 0 and the head on the last); KVBytes its KV reserve for the
	// model's context.
	WeightBytes int64 `json:"weight_bytes,omitempty"`
	KVBytes     int64 `json:"kv_bytes,omitempty"`
}

// TensorLinkPort is the port model i's tensor-parallel decode ranks take
// their tensor link on (contract C3; MLX's ring uses the next one).
func (c *Config) TensorLinkPort(i int) int {
	return c.Cluster.RunnerPortBase + PortsPerModel*i + TensorLinkPortOffset
}

// PrefillTensorLinkPort is the port model i's tensor-parallel prefill
// ranks take their tensor link on (MLX's ring or NCCL the next one).
func (c *Config) PrefillTensorLinkPort(i int) int {
	return c.Cluster.RunnerPortBase + PortsPerModel*i + PrefillTensorLinkPortOffset
}

// StageLinkPort is the port model i's pipeline decode stages take their
// stage link on (contract C1).
func (c *Config) StageLinkPort(i int) int {
	return c.Cluster.RunnerPortBase + PortsPerModel*i + StageLinkPortOffset
}

// PrefillStageLinkPort is the port model i's pipeline prefill stages take
// their stage link on (contract C4).
func (c *Config) PrefillStageLinkPort(i int) int {
	return c.Cluster.RunnerPortBase + PortsPerModel*i + PrefillStageLinkPortOffset
}

func stageKey(model, role string, group int) string {
	return model + "\x00" + role + "\x00" + strconv.Itoa(group)
}

func (c *Config) setStages(model, role string, group int, st []Stage) {
	if c.stages == nil {
		c.stages = map[string][]Stage{}
	}
	c.stages[stageKey(model, role, group)] = st
}

// Stages returns the placement of model's role when it is a pipeline whose
// split is known (by hand, or from Place), else nil; with several groups,
// the first group's (StageGroup, RunnerStages for the others).
func (c *Config) Stages(model, role string) []Stage { return c.StageGroup(model, role, 0) }

// StageGroup returns the placement of group g of model's role's pipeline
// groups (0 when it has one), or nil where it is not known.
func (c *Config) StageGroup(model, role string, g int) []Stage {
	return slices.Clone(c.stages[stageKey(model, role, g)])
}

// RunnerStages returns the stages of the pipeline group that runner r is
// a stage of (nil when it is none, or not placed).
func (c *Config) RunnerStages(r Runner) []Stage {
	m := c.Model(r.Model)
	if m == nil || r.Stage == "" {
		return nil
	}
	role := m.Decode
	if r.Role == Prefill {
		role = m.Prefill
	}
	if role == nil {
		return nil
	}
	for g, hosts := range role.StageGroups() {
		if slices.Contains(hosts, r.Host) {
			return c.StageGroup(r.Model, r.Role, g)
		}
	}
	return nil
}

func groupString(st []Stage) string {
	s := ""
	for i, x := range st {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%d:%d", x.Start, x.End)
	}
	return s
}

// StageRunnerName is the name of stage i of a pipeline of model's role:
// "<model>-<role>-stage<I>", or with groups (decode.groups)
// "<model>-<role>-group<G>-stage<I>".
func StageRunnerName(model, role string, grouped bool, g, i int) string {
	if grouped {
		return fmt.Sprintf("%s-%s-group%d-stage%d", model, role, g, i)
	}
	return fmt.Sprintf("%s-%s-stage%d", model, role, i)
}

// HealthAddr is the HOST:PORT serving the runner's /health and /metrics.
func (r Runner) HealthAddr() string {
	if r.Role == Prefill {
		return r.Metrics
	}
	return r.Listen
}

// Args is the runner's command line after the executable:
// "runner decode …" or "runner prefill …" exactly as runners accept them.
func (r Runner) Args() []string {
	a := []string{"runner", r.Role, "--model", r.Source, "--served-name", r.Model, "--listen", r.Listen}
	if r.Stage != "" {
		a = append(a, "--layers", r.Layers, "--stage", r.Stage)
		if r.StageListen != "" { // not a tensor stage's rank > 0: it talks to its rank 0 only
			a = append(a, "--stage-listen", r.StageListen, "--stage-next", r.StageNext)
		}
	}
	if r.Tensor != "" {
		a = append(a, "--tensor", r.Tensor, "--tensor-peers", joinComma(r.TensorPeers))
		if r.TensorRDMA != "" {
			a = append(a, "--tensor-rdma", r.TensorRDMA)
		}
	}
	if r.Role == Prefill {
		a = append(a, "--metrics", r.Metrics)
	} else {
		if len(r.Prefill) > 0 {
			a = append(a, "--prefill", joinComma(r.Prefill))
		}
		if len(r.PrefillHealth) > 0 {
			a = append(a, "--prefill-health", joinComma(r.PrefillHealth))
		}
		a = append(a, "--remote-prefill-min-tokens", strconv.Itoa(r.RemotePrefillMinTokens))
		if r.RemotePrefillRoute != "" {
			a = append(a, "--remote-prefill-route", r.RemotePrefillRoute)
		}
		if r.KVWireDType != "" {
			a = append(a, "--kv-wire-dtype", r.KVWireDType)
		}
		if r.KVStreams > 1 {
			a = append(a, "--kv-streams", strconv.Itoa(r.KVStreams))
		}
		if r.PrefillConnectTimeoutMs > 0 {
			a = append(a, "--prefill-connect-timeout", strconv.Itoa(r.PrefillConnectTimeoutMs)+"ms")
		}
		if d := r.Defaults; d != nil {
			f := func(flag string, v *float64) {
				if v != nil {
					a = append(a, flag, strconv.FormatFloat(*v, 'g', -1, 64))
				}
			}
			f("--default-temperature", d.Temperature)
			f("--default-top-p", d.TopP)
			if d.TopK != nil {
				a = append(a, "--default-top-k", strconv.Itoa(*d.TopK))
			}
			f("--default-min-p", d.MinP)
			f("--default-repetition-penalty", d.RepetitionPenalty)
		}
		if r.Speculative != "" {
			a = append(a, "--speculative", r.Speculative)
		}
		if r.SpecTokens > 0 {
			a = append(a, "--speculative-tokens", strconv.Itoa(r.SpecTokens))
		}
		if r.Draft != "" {
			a = append(a, "--draft", r.Draft)
		}
	}
	if r.SecretFile != "" {
		a = append(a, "--secret-file", r.SecretFile)
	}
	a = append(a, "--backend", r.Backend)
	if r.Device != "" {
		a = append(a, "--device", r.Device)
	}
	if r.MaxQueue > 0 {
		a = append(a, "--max-queue", strconv.Itoa(r.MaxQueue))
	}
	if r.Role == Decode && r.MaxBatch > 0 {
		a = append(a, "--max-batch", strconv.Itoa(r.MaxBatch))
	}
	if r.PrefillChunk > 0 {
		a = append(a, "--prefill-chunk", strconv.Itoa(r.PrefillChunk))
	}
	if r.Role == Prefill && r.PrefixCacheMiB != nil {
		a = append(a, "--prefix-cache-mib", strconv.Itoa(*r.PrefixCacheMiB))
	}
	if r.Threads > 0 {
		a = append(a, "--threads", strconv.Itoa(r.Threads))
	}
	if r.Offline {
		a = append(a, "--offline")
	}
	if r.ModelsDir != "" {
		a = append(a, "--models-dir", r.ModelsDir)
	}
	return a
}

// Equal reports whether two runner specs describe the same process.
func (r Runner) Equal(o Runner) bool {
	return r.Name == o.Name && r.Host == o.Host && r.Group == o.Group && slices.Equal(r.Args(), o.Args()) &&
		r.RingHostfile == o.RingHostfile && r.RingRank == o.RingRank
}

// LogValue makes runners log as their name, role, model and address.
func (r Runner) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", r.Name), slog.String("role", r.Role),
		slog.String("model", r.Model), slog.String("host", r.Host), slog.String("addr", r.HealthAddr()))
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

// runnerBackend maps a host backend to the runner's --backend and --device.
func runnerBackend(b Backend) (backend, device string) {
	switch b {
	case CUDA, Metal:
		return "mlx", "gpu"
	case MLXCPU:
		return "mlx", "cpu"
	default:
		return "cpu", ""
	}
}

// AllRunners returns every runner of the cluster, sorted by host then name.
func (c *Config) AllRunners() []Runner {
	var out []Runner
	for mi, m := range c.Models {
		// pfEntries and pfHealth are the prefill endpoints, one list per
		// prefill group (one for whole runners, tensor ranks or a single
		// pipeline); a decode runner gets every group, its own rotation
		// first (prefillFor).
		var pfEntries [][]string
		var pfHealth []string
		if r := m.Prefill; r != nil {
			// A pipeline prefill's stages are ADDR@A:B (contract C4), and
			// only once its group's split is known (else decode prefills
			// locally). With prefill.groups every group's stage i serves
			// the same layers (Place refuses groups split differently), so
			// decode takes them as replicas of that range.
			groups := [][]string{r.Hosts}
			if r.Pipeline() {
				groups = r.StageGroups()
			}
			for g, hosts := range groups {
				pst := c.stages[stageKey(m.Name, Prefill, g)]
				if r.Pipeline() && pst == nil {
					continue
				}
				var kvs, hs []string
				for si, hn := range hosts {
					h := c.Hosts[hn]
					kv := net.JoinHostPort(h.Address, strconv.Itoa(r.Port))
					if r.Pipeline() {
						kv += fmt.Sprintf("@%d:%d", pst[si].Start, pst[si].End)
					}
					if r.Shard == ShardTensor { // rank si of the group serves its KV heads
						kv += fmt.Sprintf("#%d/%d", si, len(hosts))
					}
					kvs = append(kvs, kv)
					hs = append(hs, net.JoinHostPort(h.Address, strconv.Itoa(r.MetricsPort)))
				}
				pfEntries, pfHealth = append(pfEntries, kvs), append(pfHealth, hs...)
			}
		}
		// prefillFor is decode runner k's --prefill list: every prefill
		// group, group k mod G first, so decode replicas (or decode
		// groups) prefer different prefill groups and each range's other
		// groups are its failover (runners/decode tries a range's
		// endpoints in order).
		prefillFor := func(k int) []string {
			var out []string
			for j := range pfEntries {
				out = append(out, pfEntries[(k+j)%len(pfEntries)]...)
			}
			return out
		}
		health := pfHealth
		var addGroup func(role string, r *Role, g int, hosts []string, stages []Stage, peers []string)
		add := func(role string, r *Role) {
			if r == nil {
				return
			}
			var peers []string
			if r.Shard == ShardTensor {
				port := c.TensorLinkPort(mi)
				if role == Prefill {
					port = c.PrefillTensorLinkPort(mi)
				}
				for _, hn := range r.Hosts {
					peers = append(peers, net.JoinHostPort(c.Hosts[hn].Address, strconv.Itoa(port)))
				}
			}
			groups := [][]string{r.Hosts}
			if r.Pipeline() {
				groups = r.StageGroups()
			}
			for g, hosts := range groups {
				var stages []Stage
				if r.Pipeline() {
					// A pipeline group runs only once its split is known.
					if stages = c.stages[stageKey(m.Name, role, g)]; stages == nil {
						continue
					}
				}
				addGroup(role, r, g, hosts, stages, peers)
			}
		}
		addGroup = func(role string, r *Role, g int, hosts []string, stages []Stage, peers []string) {
			var ring string
			switch {
			case role == Decode && stages != nil:
				ring = c.ringHostfile(stages, r.StageRanks(), c.StageLinkPort(mi))
			case role == Prefill && stages != nil:
				ring = c.ringHostfile(stages, 1, c.PrefillStageLinkPort(mi))
			}
			for si, hn := range hosts {
				h := c.Hosts[hn]
				be, dev := runnerBackend(h.Backend)
				ru := Runner{
					Name: m.Name + "-" + role, Host: hn, Address: h.Address, Model: m.Name, Role: role,
					Source: r.Source, Listen: net.JoinHostPort(h.Address, strconv.Itoa(r.Port)),
					SecretFile: c.Cluster.SecretFile, ModelsDir: c.Cluster.ModelsDir,
					Backend: be, Device: dev, MaxQueue: m.MaxQueue, MaxBatch: m.MaxBatch,
					PrefillChunk: m.PrefillChunk, Threads: h.Threads, Offline: c.Cluster.Offline,
				}
				if stages != nil {
					// With decode.tensor, host si is rank j of stage s.
					M := r.StageRanks()
					s, j := si/M, si%M
					next := c.Hosts[stages[(s+1)%len(stages)].Host]
					ru.Name = StageRunnerName(m.Name, role, r.Groups != nil, g, s)
					ru.Layers = fmt.Sprintf("%d:%d", stages[s].Start, stages[s].End)
					ru.Stage = fmt.Sprintf("%d/%d", s, len(stages))
					port := c.StageLinkPort(mi)
					if role == Prefill {
						port = c.PrefillStageLinkPort(mi)
					}
					if j == 0 { // a stage's rank 0 alone is on the ring
						ru.StageListen = net.JoinHostPort(h.Address, strconv.Itoa(port))
						ru.StageNext = net.JoinHostPort(next.Address, strconv.Itoa(port))
					}
					ru.Group = groupString(stages)
					if ring != "" {
						ru.RingHostfile, ru.RingRank = ring, s
					}
					if M > 1 {
						ranks := hosts[s*M : (s+1)*M]
						ru.Name += fmt.Sprintf("-rank%d", j)
						ru.Tensor = fmt.Sprintf("%d/%d", j, M)
						for _, rh := range ranks {
							ru.TensorPeers = append(ru.TensorPeers, net.JoinHostPort(c.Hosts[rh].Address, strconv.Itoa(c.TensorLinkPort(mi))))
						}
						ru.TensorRDMA = c.rdmaMatrix(ranks)
						ru.Group += fmt.Sprintf(" × tensor %d: %s", M, joinComma(hosts))
					}
				}
				if peers != nil {
					ru.Name = fmt.Sprintf("%s-%s-rank%d", m.Name, role, si)
					ru.Tensor = fmt.Sprintf("%d/%d", si, len(peers))
					ru.TensorPeers = slices.Clone(peers)
					ru.TensorRDMA = c.rdmaMatrix(r.Hosts)
					ru.Group = "tensor " + joinComma(peers)
				}
				// Every stage and rank gets the model's flags: each
				// pipeline stage fetches its own layer range from its
				// --prefill endpoints (the one stage 0's fill names first), each tensor
				// rank its own KV heads; a later stage logs and ignores
				// --speculative (stage 0 decides, and a pipeline does not
				// speculate) and loads no --draft.
				if role == Prefill {
					ru.Metrics = net.JoinHostPort(h.Address, strconv.Itoa(r.MetricsPort))
					if r.PrefixCacheMiB != nil {
						v := *r.PrefixCacheMiB
						ru.PrefixCacheMiB = &v
					}
				} else {
					k := si // a whole decode runner: its replica index
					if stages != nil {
						k = g // every stage of a decode group: the same order
					}
					if peers != nil {
						k = 0 // every rank of a tensor decode (one replica): the same order
					}
					ru.Prefill = prefillFor(k)
					ru.PrefillHealth = slices.Clone(health)
					ru.RemotePrefillMinTokens = m.RemotePrefillMinTokens
					ru.RemotePrefillRoute = m.RemotePrefillRoute
					ru.KVWireDType = m.KVWireDType
					if m.KVStreams != nil {
						ru.KVStreams = *m.KVStreams
					}
					ru.PrefillConnectTimeoutMs = m.PrefillConnectTimeoutMs
					if m.Defaults != nil {
						d := *m.Defaults
						ru.Defaults = &d
					}
					if sp := m.Speculative; sp != nil {
						ru.Speculative, ru.SpecTokens, ru.Draft = sp.Mode, sp.Tokens, sp.Draft
					}
				}
				out = append(out, ru)
			}
		}
		add(Decode, m.Decode)
		add(Prefill, m.Prefill)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Host != out[j].Host {
			return out[i].Host < out[j].Host
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Runners returns the runners host must run, sorted by name.
func (c *Config) Runners(host string) []Runner {
	var out []Runner
	for _, r := range c.AllRunners() {
		if r.Host == host {
			out = append(out, r)
		}
	}
	return out
}

// ServesAPI reports whether the runner serves the API: every decode runner
// but a pipeline's later stages and a tensor group's ranks after 0 (which
// serve only /health and /metrics).
func (r Runner) ServesAPI() bool {
	return (r.Stage == "" || strings.HasPrefix(r.Stage, "0/")) && (r.Tensor == "" || strings.HasPrefix(r.Tensor, "0/"))
}

// DecodeRunners returns every decode runner of model, in host order.
func (c *Config) DecodeRunners(model string) []Runner {
	var out []Runner
	for _, r := range c.AllRunners() {
		if r.Model == model && r.Role == Decode {
			out = append(out, r)
		}
	}
	return out
}

// Changes is what turns one host's running set into another.
type Changes struct {
	Start   []Runner // new runners
	Stop    []Runner // runners no longer wanted
	Restart []Runner // runners whose spec changed (the new spec)
	Keep    []string // names of untouched runners
}

// Empty reports whether nothing changes.
func (ch Changes) Empty() bool { return len(ch.Start)+len(ch.Stop)+len(ch.Restart) == 0 }

func (ch Changes) String() string {
	names := func(rs []Runner) []string {
		var s []string
		for _, r := range rs {
			s = append(s, r.Name)
		}
		return s
	}
	return fmt.Sprintf("start %v, stop %v, restart %v, keep %v", names(ch.Start), names(ch.Stop), names(ch.Restart), ch.Keep)
}

// Diff computes the minimal change from old to new (both one host's runners).
func Diff(old, new []Runner) Changes {
	var ch Changes
	byName := map[string]Runner{}
	for _, r := range old {
		byName[r.Name] = r
	}
	wanted := map[string]bool{}
	for _, n := range new {
		wanted[n.Name] = true
		o, ok := byName[n.Name]
		switch {
		case !ok:
			ch.Start = append(ch.Start, n)
		case o.Equal(n):
			ch.Keep = append(ch.Keep, n.Name)
		default:
			ch.Restart = append(ch.Restart, n)
		}
	}
	for _, o := range old {
		if !wanted[o.Name] {
			ch.Stop = append(ch.Stop, o)
		}
	}
	return ch
}

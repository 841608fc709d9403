package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
)

var (
	nameRe       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	corsOriginRe = regexp.MustCompile(`^https?://[^/\s]+$`)
)

func (c *Config) validate() Errors {
	var errs Errors
	bad := func(p Pos, format string, args ...any) {
		errs = append(errs, &Error{c.Path, p, fmt.Sprintf(format, args...)})
	}
	for _, d := range []struct {
		key string
		src string
		dst *time.Duration
	}{
		{"liveness_timeout", c.Supervisor.LivenessTimeout, &c.Supervisor.Liveness},
		{"liveness_starting_timeout", c.Supervisor.LivenessStartingTimeout, &c.Supervisor.LivenessStarting},
	} {
		if d.src == "" {
			continue
		}
		v, err := time.ParseDuration(d.src)
		switch {
		case err != nil:
			bad(c.at("supervisor", d.key), "%s %q is not a duration (write e.g. \"10s\" or \"2m\"; negative turns the check off)", d.key, d.src)
		case v == 0:
			bad(c.at("supervisor", d.key), "%s must not be 0 (negative turns the check off)", d.key)
		default:
			*d.dst = v
		}
	}
	if c.Cluster.Name != "" && !nameRe.MatchString(c.Cluster.Name) {
		bad(c.at("cluster", "name"), "cluster name %q: use letters, digits, '.', '_' and '-'", c.Cluster.Name)
	}
	if c.Cluster.SecretFile != "" && !strings.HasPrefix(c.Cluster.SecretFile, "/") {
		bad(c.at("cluster", "secret_file"), "secret_file %q must be an absolute path", c.Cluster.SecretFile)
	}
	if c.Cluster.SecretFile == "" && !c.Cluster.Insecure {
		if beyond := c.beyondLoopback(); beyond != "" {
			bad(c.at("cluster"), "%s and [cluster] has no secret_file: anyone who reaches a KV port gets prefill and can feed decode runners; "+
				"create one secret for all hosts (head -c 32 /dev/urandom | base64 > /etc/exo/secret), copy it to every host and set "+
				"secret_file = \"/etc/exo/secret\" under [cluster], or write insecure = true there to run open", beyond)
		}
	}
	if f := c.API.APIKeyFile; f != "" && !strings.HasPrefix(f, "/") {
		bad(c.at("api", "api_key_file"), "api_key_file %q must be an absolute path", f)
	}
	for i, p := range c.API.OpenPaths {
		if !slices.Contains(KeyExemptPaths, p) {
			bad(c.at("api", "open_paths", i), "open_paths: %q cannot be served without the API key (allowed: %s)", p, strings.Join(KeyExemptPaths, ", "))
		}
	}
	if b := c.Cluster.RunnerPortBase; b < 1024 || b > 65000 {
		bad(c.at("cluster", "runner_port_base"), "runner_port_base %d must be between 1024 and 65000", b)
	}
	for j, o := range c.API.CORSOrigins {
		if o != "*" && !corsOriginRe.MatchString(o) {
			bad(c.at("api", "cors_origins", j), "cors_origins[%d] %q: an origin is scheme://host[:port] with no path (or \"*\" for any)", j, o)
		}
	}
	if p := c.API.Port; p < 1 || p > 65535 {
		bad(c.at("api", "port"), "api port %d out of range 1-65535", p)
	}
	if l := c.API.Listen; l != "" && net.ParseIP(l) == nil && !nameRe.MatchString(l) {
		bad(c.at("api", "listen"), "api listen %q is neither an IP address nor a host name", l)
	}
	if len(c.Hosts) == 0 {
		bad(Pos{1, 1}, "no hosts: add at least one [hosts.NAME] table with address and backend")
	}
	for _, name := range c.HostNames() {
		h := c.Hosts[name]
		if !nameRe.MatchString(name) {
			bad(c.at("hosts", name), "host name %q: use letters, digits, '.', '_' and '-'", name)
		}
		if h.Address == "" {
			bad(c.at("hosts", name), "host %s has no address (how other hosts reach it, e.g. address = \"10.0.0.10\")", name)
		} else if net.ParseIP(h.Address) == nil && !nameRe.MatchString(h.Address) {
			bad(c.at("hosts", name, "address"), "host %s: address %q is neither an IP address nor a host name", name, h.Address)
		}
		if h.Threads < 0 {
			bad(c.at("hosts", name, "threads"), "host %s: threads must not be negative", name)
		}
		switch h.Backend {
		case CUDA, Metal, CPU, MLXCPU:
		case "":
			bad(c.at("hosts", name), "host %s has no backend (cuda, metal, cpu or mlx-cpu)", name)
		default:
			bad(c.at("hosts", name, "backend"), "host %s: unknown backend %q (want cuda, metal, cpu or mlx-cpu)", name, h.Backend)
		}
		if m := h.MemoryGiB; m != nil && (*m != *m || *m <= 0 || *m > 1<<20) {
			bad(c.at("hosts", name, "memory_gib"), "host %s: memory_gib must be a positive number of GiB (what the host gives to weights and KV), got %v", name, *m)
		}
		c.validateRDMA(name, h, bad)
	}
	if len(c.Models) == 0 {
		bad(Pos{1, 1}, "no models: add at least one [[models]] table")
	}
	names := map[string]int{}
	for i, m := range c.Models {
		if m == nil {
			continue
		}
		label := fmt.Sprintf("models[%d]", i)
		switch {
		case m.Name == "":
			bad(c.at("models", i), "%s has no name (what clients send as \"model\")", label)
		case !nameRe.MatchString(m.Name):
			bad(c.at("models", i, "name"), "model name %q: use letters, digits, '.', '_' and '-'", m.Name)
		default:
			if j, dup := names[m.Name]; dup {
				bad(c.at("models", i, "name"), "model %q is defined twice (first as models[%d])", m.Name, j)
			}
			names[m.Name] = i
			label = fmt.Sprintf("model %s", m.Name)
		}
		if m.RemotePrefillMinTokens < 1 {
			bad(c.at("models", i, "remote_prefill_min_tokens"), "%s: remote_prefill_min_tokens must be at least 1", label)
		}
		if r := m.RemotePrefillRoute; r != "" && r != "cost" && r != "floor" {
			bad(c.at("models", i, "remote_prefill_route"), "%s: remote_prefill_route %q: want \"cost\" or \"floor\"", label, r)
		} else if why := noCostRoute(m); r == "cost" && why != "" {
			bad(c.at("models", i, "remote_prefill_route"), "%s: remote_prefill_route \"cost\": %s: leave it out (they route by remote_prefill_min_tokens) or set \"floor\"", label, why)
		}
		if d := m.KVWireDType; d != "" && d != "fp8" {
			bad(c.at("models", i, "kv_wire_dtype"), "%s: kv_wire_dtype %q: want \"fp8\" (or leave it out for the cache's dtype)", label, d)
		}
		if m.KVWireDType != "" && m.Prefill == nil {
			bad(c.at("models", i, "kv_wire_dtype"), "%s: kv_wire_dtype needs [models.prefill] runners", label)
		}
		if n := m.KVStreams; n != nil && (*n < 1 || *n > 16) {
			bad(c.at("models", i, "kv_streams"), "%s: kv_streams %d: want 1 to 16 (TCP connections per KV transfer)", label, *n)
		} else if n != nil && *n > 1 && m.Prefill == nil {
			bad(c.at("models", i, "kv_streams"), "%s: kv_streams needs [models.prefill] runners", label)
		}
		if m.MaxQueue < 0 {
			bad(c.at("models", i, "max_queue"), "%s: max_queue must not be negative", label)
		}
		if m.MaxBatch < 0 || m.MaxBatch > 256 {
			bad(c.at("models", i, "max_batch"), "%s: max_batch must be between 0 (the runner's default) and 256", label)
		}
		if m.PrefillChunk < 0 {
			bad(c.at("models", i, "prefill_chunk"), "%s: prefill_chunk must not be negative", label)
		}
		if m.PrefillConnectTimeoutMs < 0 || m.PrefillConnectTimeoutMs > 60000 {
			bad(c.at("models", i, "prefill_connect_timeout_ms"), "%s: prefill_connect_timeout_ms must be between 0 (the runner's default, 1000) and 60000", label)
		}
		if d := m.Defaults; d != nil {
			rng := func(key string, v *float64, lo, hi float64, loOpen bool, what string) {
				if v != nil && (*v != *v || *v > hi || *v < lo || (loOpen && *v == lo)) {
					bad(c.at("models", i, "defaults", key), "%s: defaults.%s must be %s, got %v", label, key, what, *v)
				}
			}
			rng("temperature", d.Temperature, 0, 2, false, "between 0 and 2")
			rng("top_p", d.TopP, 0, 1, true, "in (0, 1]")
			rng("min_p", d.MinP, 0, 1, false, "in [0, 1]")
			rng("repetition_penalty", d.RepetitionPenalty, 0, 10, true, "in (0, 10]")
			if d.TopK != nil && *d.TopK < -1 {
				bad(c.at("models", i, "defaults", "top_k"), "%s: defaults.top_k must be -1 or 0 (off) or positive, got %d", label, *d.TopK)
			}
		}
		if sp := m.Speculative; sp != nil {
			switch sp.Mode {
			case "", "off", "prompt-lookup", "draft":
			default:
				bad(c.at("models", i, "speculative", "mode"), "%s: speculative.mode %q: want \"off\", \"prompt-lookup\" or \"draft\"", label, sp.Mode)
			}
			if sp.Tokens < 0 || sp.Tokens > 64 {
				bad(c.at("models", i, "speculative", "tokens"), "%s: speculative.tokens %d: want 1 to 64 (0: the runner's default, 8)", label, sp.Tokens)
			} else if sp.Tokens != 0 && (sp.Mode == "" || sp.Mode == "off") {
				bad(c.at("models", i, "speculative", "tokens"), "%s: speculative.tokens %d with mode %q: tokens bounds the drafts of mode \"prompt-lookup\" or \"draft\"", label, sp.Tokens, sp.Mode)
			}
			if (sp.Mode == "draft") != (sp.Draft != "") {
				bad(c.at("models", i, "speculative", "draft"), "%s: speculative.draft %q with mode %q: draft names the draft model of mode \"draft\", and that mode needs it", label, sp.Draft, sp.Mode)
			} else if strings.IndexFunc(sp.Draft, unicode.IsControl) >= 0 {
				bad(c.at("models", i, "speculative", "draft"), "%s: speculative.draft %q has a control character", label, sp.Draft)
			}
		}
		if m.Prefill != nil && m.Prefill.PrefixCacheMiB != nil && *m.Prefill.PrefixCacheMiB < 0 {
			bad(c.at("models", i, "prefill", "prefix_cache_mib"), "%s: prefix_cache_mib must not be negative (0 turns the cache off)", label)
		}
		if m.Decode == nil {
			bad(c.at("models", i), "%s has no decode = { hosts = [...] }: every model needs at least one decode runner", label)
		}
		for _, rr := range []struct {
			role string
			r    *Role
		}{{"decode", m.Decode}, {"prefill", m.Prefill}} {
			r := rr.r
			if r == nil {
				continue
			}
			if r.Groups != nil {
				c.validateGroups(i, label, rr.role, r, bad)
			}
			if len(r.Hosts) == 0 && r.Groups == nil {
				bad(c.at("models", i, rr.role), "%s: %s.hosts is empty", label, rr.role)
			}
			if r.Source == "" {
				bad(c.at("models", i, rr.role), "%s: %s has no source (set source on the model or %s.source)", label, rr.role, rr.role)
			} else if strings.IndexFunc(r.Source, unicode.IsControl) >= 0 {
				// Neither a path an operator means nor a Hugging Face id
				// (the runner's resolver refuses it too, but only once it
				// runs, as a crash loop).
				bad(c.at("models", i, rr.role), "%s: %s source %q has a control character", label, rr.role, r.Source)
			}
			seen := map[string]bool{}
			for j, hn := range r.Hosts {
				p := c.hostPos(i, rr.role, r, j)
				_, ok := c.Hosts[hn]
				if !ok {
					bad(p, "%s: %s on unknown host %q (hosts: %s)", label, rr.role, hn, strings.Join(c.HostNames(), ", "))
					continue
				}
				if seen[hn] {
					if r.Groups != nil {
						bad(p, "%s: host %q listed twice in %s.groups: a host runs one stage of one group", label, hn, rr.role)
					} else {
						bad(p, "%s: host %q listed twice in %s.hosts", label, hn, rr.role)
					}
					continue
				}
				seen[hn] = true
			}
			c.validateShard(i, label, rr.role, r, bad)
		}
	}
	c.validatePorts(bad)
	return errs
}

// validatePorts refuses a port out of range and two listeners on one port
// of a host, at the key that chooses the later one (portClaims: the
// ports HostPorts and openFirewall give).
func (c *Config) validatePorts(bad func(Pos, string, ...any)) {
	for _, host := range c.HostNames() {
		first := map[int]string{} // port → what claimed it first
		for j, p := range c.portClaims(host) {
			if j > 0 && (p.Port < 1 || p.Port > 65535) { // the API port's range is checked at [api]
				bad(c.at(p.key...), "%s: port %d out of range 1-65535", p.What, p.Port)
				continue
			}
			if u, ok := first[p.Port]; ok {
				bad(c.at(p.key...), "two runners on one port: %s and %s both use port %d on host %s", u, p.What, p.Port, host)
				continue
			}
			first[p.Port] = p.What
		}
	}
}

// beyondLoopback says why the cluster's runners are reachable from other
// machines ("" when they are not): several hosts, or one host whose address
// is not a loopback address.
func (c *Config) beyondLoopback() string {
	if len(c.Hosts) > 1 {
		return fmt.Sprintf("the cluster has %d hosts", len(c.Hosts))
	}
	for _, name := range c.HostNames() {
		a := c.Hosts[name].Address
		if ip := net.ParseIP(a); a != "" && a != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Sprintf("host %s listens on %s, beyond loopback,", name, a)
		}
	}
	return ""
}

// validateRDMA checks a host's rdma table: peers that are other hosts,
// device names, and a metal backend (JACCL is macOS's RDMA over
// Thunderbolt).
func (c *Config) validateRDMA(name string, h *Host, bad func(Pos, string, ...any)) {
	if h.RDMA == nil {
		return
	}
	if h.Backend != Metal {
		bad(c.at("hosts", name, "rdma"), "host %s: rdma names Thunderbolt RDMA devices for MLX's JACCL backend (macOS): it needs backend = \"metal\", not %q", name, h.Backend)
		return
	}
	for _, peer := range slices.Sorted(maps.Keys(h.RDMA)) {
		dev := h.RDMA[peer]
		p := c.at("hosts", name, "rdma", peer)
		switch _, ok := c.Hosts[peer]; {
		case peer == name:
			bad(p, "host %s: rdma names a device toward itself (%q): name one per other host of its tensor groups", name, dev)
		case !ok:
			bad(p, "host %s: rdma names unknown host %q (hosts: %s)", name, peer, strings.Join(c.HostNames(), ", "))
		case !rdmaDevRe.MatchString(dev):
			bad(p, "host %s: rdma device toward %s is %q: want an ibverbs device name as ibv_devices lists it, e.g. \"rdma_en3\"", name, peer, dev)
		}
	}
}

var rdmaDevRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// jacclGroup says whether a tensor group joins JACCL: every host metal
// and at least one naming RDMA devices.
func (c *Config) jacclGroup(hosts []string) bool {
	any := false
	for _, hn := range hosts {
		h, ok := c.Hosts[hn]
		if !ok || h.Backend != Metal {
			return false
		}
		any = any || len(h.RDMA) > 0
	}
	return any
}

// rdmaMatrix is a JACCL group's --tensor-rdma: the JSON N×N matrix of
// device names in rank order, null on the diagonal ("" when the group does
// not join JACCL).
func (c *Config) rdmaMatrix(hosts []string) string {
	if !c.jacclGroup(hosts) {
		return ""
	}
	m := make([][]*string, len(hosts))
	for i, a := range hosts {
		m[i] = make([]*string, len(hosts))
		for j, b := range hosts {
			if d, ok := c.Hosts[a].RDMA[b]; ok && i != j {
				m[i][j] = &d
			}
		}
	}
	out, _ := json.Marshal(m) // strings and nulls always marshal
	return string(out)
}

// validateShard checks a role's shard and layers keys and, for a pipeline
// split by hand, records its stages.
func (c *Config) validateShard(i int, label, role string, r *Role, bad func(Pos, string, ...any)) {
	switch r.Shard {
	case "", ShardReplicas, ShardPipeline, ShardTensor:
	default:
		bad(c.at("models", i, role, "shard"), "%s: %s.shard %q: want \"replicas\" (every host a whole copy, the default), \"pipeline\" (the hosts are stages, in order) or \"tensor\"", label, role, r.Shard)
		return
	}
	if (r.Shard == ShardPipeline || r.Shard == ShardTensor) && len(r.Hosts) == 1 && r.Groups == nil {
		bad(c.at("models", i, role, "hosts"), "%s: %s.shard %q needs at least 2 hosts (one host holds the whole model: leave shard out)", label, role, r.Shard)
	}
	if r.Shard == ShardTensor {
		c.checkMesh(r.Hosts, fmt.Sprintf("%s: %s.shard \"tensor\"", label, role), bad)
	}
	stages := 1 // hosts per stage
	if r.Tensor != 0 {
		tp := c.at("models", i, role, "tensor")
		switch {
		case role != Decode:
			bad(tp, "%s: %s.tensor is not supported (stages of tensor ranks decode; a tensor-parallel prefill is shard = \"tensor\")", label, role)
			return
		case r.Shard != ShardPipeline:
			bad(tp, "%s: %s.tensor makes each pipeline stage a tensor group: it needs shard = \"pipeline\" (one tensor group over every host: shard = \"tensor\" without this key)", label, role)
			return
		case r.Tensor < 2:
			bad(tp, "%s: %s.tensor = %d: want 2 or more ranks per stage (leave it out for one host per stage)", label, role, r.Tensor)
			return
		}
		// Every pipeline group (hosts, or each of groups) is stages of
		// r.Tensor consecutive hosts.
		for g, hosts := range r.StageGroups() {
			key, what := c.at("models", i, role, "hosts"), role+".hosts has"
			if r.Groups != nil {
				key, what = c.at("models", i, role, "groups", g), fmt.Sprintf("%s.groups[%d] has", role, g)
			}
			if len(hosts)%r.Tensor != 0 || len(hosts) < 2*r.Tensor {
				bad(key, "%s: %s %d host(s), but with tensor = %d each stage takes %d consecutive hosts (its ranks, rank 0 first) and a pipeline has 2 or more stages: list a multiple of %d, at least %d",
					label, what, len(hosts), r.Tensor, r.Tensor, r.Tensor, 2*r.Tensor)
				return
			}
			for k := 0; k < len(hosts); k += r.Tensor {
				c.checkMesh(hosts[k:k+r.Tensor], fmt.Sprintf("%s: %s.tensor stage %d", label, role, k/r.Tensor), bad)
			}
		}
		stages = r.Tensor
	}
	if r.Layers != nil {
		if r.Shard != ShardPipeline {
			bad(c.at("models", i, role, "layers"), "%s: %s.layers splits a pipeline: it needs shard = \"pipeline\"", label, role)
			return
		}
		for g, hosts := range r.StageGroups() {
			if len(r.Layers)*stages == len(hosts) {
				continue
			}
			if stages > 1 {
				bad(c.at("models", i, role, "layers"), "%s: %s.layers has %d stage(s) but %s.hosts makes %d stages of %d ranks (tensor = %d): give one layer count per stage, in stage order", label, role, len(r.Layers), role, len(hosts)/stages, stages, stages)
			} else if r.Groups != nil {
				bad(c.at("models", i, role, "layers"), "%s: %s.layers has %d stage(s) but group %d of %s.groups has %d: every group is split by layers, so every group needs that many hosts", label, role, len(r.Layers), g, role, len(hosts))
			} else {
				bad(c.at("models", i, role, "layers"), "%s: %s.layers has %d stage(s) but %s.hosts has %d: give one layer count per host, in host order", label, role, len(r.Layers), role, len(r.Hosts))
			}
			return
		}
		ok := true
		for j, n := range r.Layers {
			if n < 1 {
				bad(c.at("models", i, role, "layers", j), "%s: %s.layers[%d] = %d: every stage needs at least one layer", label, role, j, n)
				ok = false
			}
		}
		if ok && len(r.Hosts) > 0 {
			for g, hosts := range r.StageGroups() {
				c.setStages(c.Models[i].Name, role, g, handStages(r.StageLeads(hosts), r.Layers))
			}
		}
		return
	}
}

// checkMesh refuses, by name, the first missing cable of a tensor group
// (hosts, rank order) that joins JACCL, which needs a full mesh; what
// names the group in the message.
func (c *Config) checkMesh(hosts []string, what string, bad func(Pos, string, ...any)) {
	if !c.jacclGroup(hosts) {
		return
	}
	for _, a := range hosts {
		for _, b := range hosts {
			if a != b && c.Hosts[a].RDMA[b] == "" {
				bad(c.at("hosts", a, "rdma"), "%s on metal hosts %s joins MLX's JACCL, which needs a full mesh: host %s names no rdma device toward %s (cable them with Thunderbolt 5 and add %s = \"rdma_enN\" to [hosts.%s] rdma; `ibv_devices` lists the devices)",
					what, strings.Join(hosts, ", "), a, b, b, a)
				return
			}
		}
	}
}

// validateGroups checks a role's groups key (replicas of a pipeline: a
// list of groups of stage hosts) and sets Hosts to every group's hosts.
func (c *Config) validateGroups(i int, label, role string, r *Role, bad func(Pos, string, ...any)) {
	p := c.at("models", i, role, "groups")
	switch {
	case len(r.Hosts) > 0:
		bad(p, "%s: %s has both hosts and groups: groups lists every pipeline group's hosts; drop hosts", label, role)
	case r.Shard != ShardPipeline:
		bad(p, "%s: %s.groups makes replicas of a pipeline group: it needs shard = \"pipeline\" (for whole copies list the hosts in hosts)", label, role)
	case len(r.Groups) == 0:
		bad(p, "%s: %s.groups is empty", label, role)
	}
	for g, hosts := range r.Groups {
		if len(hosts) < 2 {
			bad(c.at("models", i, role, "groups", g), "%s: %s.groups[%d] has %d host(s): a pipeline group needs at least 2 stages", label, role, g, len(hosts))
		}
	}
	if len(r.Hosts) == 0 {
		for _, hosts := range r.Groups {
			r.Hosts = append(r.Hosts, hosts...)
		}
	}
}

// hostPos is the position of the j-th host of r.Hosts: in hosts, or in
// groups when r has groups.
func (c *Config) hostPos(i int, role string, r *Role, j int) Pos {
	if r.Groups == nil {
		return c.at("models", i, role, "hosts", j)
	}
	for g, hosts := range r.Groups {
		if j < len(hosts) {
			return c.at("models", i, role, "groups", g, j)
		}
		j -= len(hosts)
	}
	return c.at("models", i, role, "groups")
}

// handStages turns a by-hand layers list into one group's stages.
func handStages(hosts []string, layers []int) []Stage {
	st := make([]Stage, len(layers))
	a := 0
	for j, n := range layers {
		st[j] = Stage{Host: hosts[j], Start: a, End: a + n}
		a += n
	}
	return st
}

// noCostRoute says why m's decode runners cannot route remote prefill by
// cost ("": they can): the cost model calibrates on a whole model's local
// prefill and measures whole prefill runners, so pipeline stages, tensor
// ranks and runners fed by prefill stages or ranks route by the floor
// (the runner refuses --remote-prefill-route cost there).
func noCostRoute(m *Model) string {
	switch {
	case m.Decode.Pipeline():
		return "the decode runners are pipeline stages"
	case m.Decode != nil && m.Decode.Shard == ShardTensor:
		return "the decode runners are tensor ranks"
	case m.Prefill.Pipeline():
		return "the prefill runners are pipeline stages"
	case m.Prefill != nil && m.Prefill.Shard == ShardTensor:
		return "the prefill runners are tensor ranks"
	}
	return ""
}

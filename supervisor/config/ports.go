package config

import "sort"

// HostPort is one TCP port a host listens on, and what for.
type HostPort struct {
	Port int    `json:"port"`
	What string `json:"what"`
	// Ring marks a port MLX's ring (or JACCL's coordinator, or NCCL's
	// rendezvous) listens on only while a group joins.
	Ring bool `json:"ring,omitempty"`
}

// HostPorts returns every TCP port host listens on, sorted by port: the
// API gateway, and for each model whose runners it holds (whether or not
// a pipeline's split is known yet) with base = runner_port_base + 10·i:
//   - decode HTTP (decode.port, base); prefill KV (prefill.port, base+1)
//     and /health + /metrics (prefill.metrics_port, base+2);
//   - a decode pipeline stage's lead: the stage link (base+3); with one
//     host per stage, on an MLX host (backend not cpu), MLX's ring on the
//     next port (base+4);
//   - a tensor group's rank 0 (decode.shard "tensor", or each stage of
//     decode.tensor = M): the tensor link (base+4); every MLX rank: MLX's
//     ring or JACCL's coordinator (base+5);
//   - a prefill pipeline stage: its stage link (base+6); on MLX, MLX's
//     ring (base+7);
//   - a tensor prefill's rank 0: its tensor link (base+8); every MLX rank:
//     MLX's ring or NCCL's rendezvous (base+9).
//
// nix/lib/default.nix (hostPorts, the modules' openFirewall) lists the
// same ports; TestHostPortsMatchNix holds the two together.
func (c *Config) HostPorts(host string) []HostPort {
	out := []HostPort{{c.API.Port, "API gateway", false}}
	h := c.Hosts[host]
	mlx := h != nil && h.Backend != CPU
	for i, m := range c.Models {
		if m == nil {
			continue
		}
		if r := m.Decode; r != nil {
			if k := indexOf(r.Hosts, host); k >= 0 {
				what := m.Name + " decode"
				out = append(out, HostPort{r.Port, what + " HTTP", false})
				ranks := r.StageRanks() // ranks per tensor group
				if r.Shard == ShardTensor {
					ranks = len(r.Hosts)
				}
				lead := k%ranks == 0 // a stage's or a tensor group's rank 0
				if r.Pipeline() && lead {
					out = append(out, HostPort{c.StageLinkPort(i), what + " stage link", false})
				}
				if r.Pipeline() && ranks == 1 && mlx {
					out = append(out, HostPort{c.StageLinkPort(i) + 1, what + " stage MLX ring", true})
				}
				if ranks > 1 && lead {
					out = append(out, HostPort{c.TensorLinkPort(i), what + " tensor link", false})
				}
				if ranks > 1 && mlx {
					out = append(out, HostPort{c.TensorLinkPort(i) + 1, what + " tensor MLX ring", true})
				}
			}
		}
		if r := m.Prefill; r != nil {
			if k := indexOf(r.Hosts, host); k >= 0 {
				what := m.Name + " prefill"
				out = append(out, HostPort{r.Port, what + " KV", false}, HostPort{r.MetricsPort, what + " health/metrics", false})
				if r.Pipeline() {
					out = append(out, HostPort{c.PrefillStageLinkPort(i), what + " stage link", false})
				}
				if r.Pipeline() && mlx {
					out = append(out, HostPort{c.PrefillStageLinkPort(i) + 1, what + " stage MLX ring", true})
				}
				if r.Shard == ShardTensor && k == 0 {
					out = append(out, HostPort{c.PrefillTensorLinkPort(i), what + " tensor link", false})
				}
				if r.Shard == ShardTensor && mlx {
					out = append(out, HostPort{c.PrefillTensorLinkPort(i) + 1, what + " tensor MLX ring or NCCL", true})
				}
			}
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Port < out[b].Port })
	return out
}

func indexOf(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}

package config

import (
	"fmt"
	"sort"
)

// HostPort is one TCP port a host listens on, and what for.
type HostPort struct {
	Port int    `json:"port"`
	What string `json:"what"`
	// Ring marks a port MLX's ring (or JACCL's coordinator, or NCCL's
	// rendezvous) listens on only while a group joins.
	Ring bool `json:"ring,omitempty"`
}

// HostPorts returns every TCP port host listens on, sorted by port (the
// ports portClaims gives; validate refuses a file where two of a host's
// claims share a port, so each port appears once).
//
// nix/lib/default.nix (hostPorts, the modules' openFirewall) lists the
// same ports; TestHostPortsMatchNix holds the two together.
func (c *Config) HostPorts(host string) []HostPort {
	claims := c.portClaims(host)
	out := make([]HostPort, len(claims))
	for i, p := range claims {
		out[i] = p.HostPort
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Port < out[b].Port })
	return out
}

// portClaim is a port a host listens on and the cluster-file key that
// chooses it (a path for Config.at: where validate reports a clash).
type portClaim struct {
	HostPort
	key []any
}

// portClaims returns every TCP port host listens on, in file order (the
// API gateway first, then model by model, decode before prefill): the one
// list that validate's port checks, HostPorts (so openFirewall) and exo
// doctor read. With base = runner_port_base + 10·i for model i, whether
// or not a pipeline's split is known yet:
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
// A rank after 0 takes no link port, and a cpu host no ring port: nothing
// listens there.
func (c *Config) portClaims(host string) []portClaim {
	out := []portClaim{{HostPort{c.API.Port, "the API gateway ([api] port)", false}, []any{"api", "port"}}}
	h := c.Hosts[host]
	mlx := h != nil && h.Backend != CPU
	for i, m := range c.Models {
		if m == nil {
			continue
		}
		label := fmt.Sprintf("models[%d]", i)
		if nameRe.MatchString(m.Name) {
			label = "model " + m.Name
		}
		for _, rr := range []struct {
			role string
			r    *Role
		}{{Decode, m.Decode}, {Prefill, m.Prefill}} {
			r := rr.r
			if r == nil {
				continue
			}
			k := indexOf(r.Hosts, host)
			if k < 0 {
				continue
			}
			what := label + " " + rr.role
			add := func(port int, what string, ring bool, key string) {
				out = append(out, portClaim{HostPort{port, what, ring}, []any{"models", i, rr.role, key}})
			}
			add(r.Port, what, false, "port")
			if rr.role == Prefill {
				add(r.MetricsPort, what+" metrics", false, "metrics_port")
			}
			switch {
			case rr.role == Decode && r.Pipeline():
				ranks := r.StageRanks() // ranks per stage
				lead := k%ranks == 0    // a stage's rank 0
				if lead {
					add(c.StageLinkPort(i), what+" stage link", false, "shard")
				}
				if ranks == 1 && mlx {
					add(c.StageLinkPort(i)+1, what+" stage MLX ring", true, "shard")
				}
				// A stage of tensor ranks: rank 0 on the stage link, the
				// ranks on their tensor link and MLX's ring after it; the
				// stage's hidden states stay on TCP.
				if ranks > 1 && lead {
					add(c.TensorLinkPort(i), what+" stage tensor link", false, "tensor")
				}
				if ranks > 1 && mlx {
					add(c.TensorLinkPort(i)+1, what+" stage tensor MLX ring", true, "tensor")
				}
			case rr.role == Decode && r.Shard == ShardTensor && len(r.Hosts) > 1:
				if k == 0 {
					add(c.TensorLinkPort(i), what+" tensor link", false, "shard")
				}
				if mlx {
					add(c.TensorLinkPort(i)+1, what+" tensor MLX ring", true, "shard")
				}
			case rr.role == Prefill && r.Pipeline():
				add(c.PrefillStageLinkPort(i), what+" stage link", false, "shard")
				if mlx {
					add(c.PrefillStageLinkPort(i)+1, what+" stage MLX ring", true, "shard")
				}
			case rr.role == Prefill && r.Shard == ShardTensor:
				if k == 0 {
					add(c.PrefillTensorLinkPort(i), what+" tensor link", false, "shard")
				}
				if mlx {
					add(c.PrefillTensorLinkPort(i)+1, what+" tensor MLX ring or NCCL", true, "shard")
				}
			}
		}
	}
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

package config

import (
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/modelinfo"
)

// TestTensorPrefillPlan: prefill.shard "tensor" makes the prefill hosts
// ranks in order (<model>-prefill-rank<I>, --tensor I/N with the prefill
// tensor link port base+10i+8 on every rank's host, the next port claimed
// for MLX's ring or NCCL), and every decode runner, a tensor decode's
// ranks included, names the prefill ranks as ADDR#I/N; a port clash on the
// ring's port is refused by name; Place accepts it beside replicas and a
// tensor decode and a pipeline decode (every stage, and every rank of a
// tensor stage, names the prefill ranks), refuses it on a model with
// recurrent layers, and head counts the prefill ranks cannot divide.
func TestTensorPrefillPlan(t *testing.T) {
	parse := func(decode string, extra string) *Config {
		t.Helper()
		c, err := Parse("f.toml", []byte(threeHosts+`
[[models]]
name = "m"
source = "s"
decode = `+decode+`
prefill = { hosts = ["b", "a"], shard = "tensor" }
`+extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := parse(`{ hosts = ["c"] }`, "")
	peers := "127.0.0.3:52508,127.0.0.2:52508"
	for host, want := range map[string][]string{
		"b": {"m-prefill-rank0", "--tensor", "0/2", "--tensor-peers", peers},
		"a": {"m-prefill-rank1", "--tensor", "1/2", "--tensor-peers", peers},
	} {
		rs := c.Runners(host)
		if len(rs) != 1 || rs[0].Name != want[0] || rs[0].Role != Prefill {
			t.Fatalf("host %s runs %+v", host, rs)
		}
		args := rs[0].Args()
		if i := slices.Index(args, "--tensor"); i < 0 || !slices.Equal(args[i:i+4], want[1:]) {
			t.Errorf("host %s: %v, want %v", host, args, want[1:])
		}
	}
	list := "127.0.0.3:52501#0/2,127.0.0.2:52501#1/2"
	dec := c.Runners("c")
	if len(dec) != 1 {
		t.Fatalf("host c runs %+v", dec)
	}
	if args := dec[0].Args(); !slices.Contains(args, list) {
		t.Errorf("decode runner: %v, want --prefill %s", args, list)
	}
	even := func(string) (*modelinfo.Facts, error) { return facts(8, gib, gib, false), nil }
	if _, err := c.Place(even, "c", 0); err != nil {
		t.Errorf("Place beside replicas: %v", err)
	}

	// A tensor decode on the same hosts: each rank gets the list; the two
	// groups' link ports differ.
	c = parse(`{ hosts = ["a", "b"], shard = "tensor" }`, "")
	for _, h := range []string{"a", "b"} {
		var dr *Runner
		for _, r := range c.Runners(h) {
			if r.Role == Decode {
				dr = &r
			}
		}
		if dr == nil || !slices.Contains(dr.Args(), list) {
			t.Errorf("host %s: decode rank %+v, want --prefill %s", h, dr, list)
		}
	}
	if _, err := c.Place(even, "a", 0); err != nil {
		t.Errorf("Place beside a tensor decode: %v", err)
	}

	// The ring's (NCCL's) port is claimed on an MLX rank (b, rank 0, with
	// the tensor link), not on a cpu one (a).
	for _, tc := range []struct{ host, port, want string }{
		{"b", "52508", "two runners on one port: model m prefill tensor link and model n decode both use port 52508 on host b"},
		{"b", "52509", "two runners on one port: model m prefill tensor MLX ring or NCCL and model n decode both use port 52509 on host b"},
		{"a", "52509", ""},
	} {
		_, err := Parse("f.toml", []byte(threeHosts+`
[[models]]
name = "m"
source = "s"
decode = { hosts = ["c"] }
prefill = { hosts = ["b", "a"], shard = "tensor" }

[[models]]
name = "n"
source = "s"
decode = { hosts = ["`+tc.host+`"], port = `+tc.port+` }
`))
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("port %s on %s: %v, want %q", tc.port, tc.host, err, tc.want)
		}
	}

	// Beside a pipeline decode: every stage names the prefill ranks.
	c = parse(`{ hosts = ["a", "c"], shard = "pipeline", layers = [4, 4] }`, "")
	if _, err := c.Place(even, "a", 0); err != nil {
		t.Errorf("beside a pipeline decode: %v", err)
	}
	for _, r := range c.DecodeRunners("m") {
		if !slices.Contains(r.Args(), list) {
			t.Errorf("decode stage %s: %v, want --prefill %s", r.Name, r.Args(), list)
		}
	}
	// Heads 2 ranks cannot divide: refused.
	c = parse(`{ hosts = ["c"] }`, "")
	smol := func(string) (*modelinfo.Facts, error) {
		return &modelinfo.Facts{Heads: 9, KVHeads: 3, Intermediate: 1536, Layers: 30, LayerBytes: make([]int64, 30), KVLayer: make([]bool, 30)}, nil
	}
	if _, err := c.Place(smol, "c", 0); err == nil || !strings.Contains(err.Error(), `model m: prefill.shard "tensor": 2 hosts: num_attention_heads 9 is not divisible by 2`) {
		t.Errorf("heads 2 ranks cannot divide: %v", err)
	}
	hybrid := func(string) (*modelinfo.Facts, error) {
		f := facts(8, gib, gib, false)
		f.LinearKeyHeads, f.LinearValueHeads, f.LinearValueDim = 4, 8, 64
		return f, nil
	}
	if _, err := c.Place(hybrid, "c", 0); err == nil || !strings.Contains(err.Error(), `prefill.shard "tensor" on a model with recurrent (Gated DeltaNet) layers is not supported`) {
		t.Errorf("a hybrid model: %v", err)
	}
}

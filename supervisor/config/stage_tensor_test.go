package config

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/modelinfo"
)

// fourCPUHosts are four cpu hosts with the memory each gives.
const fourCPUHosts = `[cluster]
secret_file = "/etc/exo/secret"

[hosts.a]
address = "127.0.0.2"
backend = "cpu"
memory_gib = 40

[hosts.b]
address = "127.0.0.3"
backend = "cpu"
memory_gib = 20

[hosts.c]
address = "127.0.0.4"
backend = "cpu"
memory_gib = 20

[hosts.d]
address = "127.0.0.5"
backend = "cpu"
memory_gib = 20
`

// TestStageTensorInvalid: decode.tensor is refused at its key (or at
// hosts, layers) when it cannot make stages of tensor ranks.
func TestStageTensorInvalid(t *testing.T) {
	for _, tt := range []struct{ name, decode, want string }{
		{"not a pipeline", `{ hosts = ["a", "b", "c", "d"], shard = "tensor", tensor = 2 }`,
			`f.toml:27:60: model m: decode.tensor makes each pipeline stage a tensor group: it needs shard = "pipeline" (one tensor group over every host: shard = "tensor" without this key)`},
		{"one rank", `{ hosts = ["a", "b", "c", "d"], shard = "pipeline", tensor = 1 }`,
			`f.toml:27:62: model m: decode.tensor = 1: want 2 or more ranks per stage (leave it out for one host per stage)`},
		{"hosts not a multiple", `{ hosts = ["a", "b", "c"], shard = "pipeline", tensor = 2 }`,
			`f.toml:27:12: model m: decode.hosts has 3 host(s), but with tensor = 2 each stage takes 2 consecutive hosts (its ranks, rank 0 first) and a pipeline has 2 or more stages: list a multiple of 2, at least 4`},
		{"one stage", `{ hosts = ["a", "b"], shard = "pipeline", tensor = 2 }`,
			`f.toml:27:12: model m: decode.hosts has 2 host(s), but with tensor = 2 each stage takes 2 consecutive hosts (its ranks, rank 0 first) and a pipeline has 2 or more stages: list a multiple of 2, at least 4`},
		{"layers per stage", `{ hosts = ["a", "b", "c", "d"], shard = "pipeline", tensor = 2, layers = [1, 1, 1, 1] }`,
			`f.toml:27:74: model m: decode.layers has 4 stage(s) but decode.hosts makes 2 stages of 2 ranks (tensor = 2): give one layer count per stage, in stage order`},
		{"groups", `{ groups = [["a", "b"], ["c", "d"]], shard = "pipeline", tensor = 2 }`,
			`f.toml:27:22: model m: decode.groups[0] has 2 host(s), but with tensor = 2 each stage takes 2 consecutive hosts (its ranks, rank 0 first) and a pipeline has 2 or more stages: list a multiple of 2, at least 4`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := fourCPUHosts + "\n[[models]]\nname = \"m\"\nsource = \"s\"\ndecode = " + tt.decode + "\n"
			_, err := Parse("f.toml", []byte(src))
			if err == nil || err.Error() != tt.want {
				t.Errorf("got  %v\nwant %s", err, tt.want)
			}
		})
	}
	_, err := Parse("f.toml", []byte(fourCPUHosts+"\n[[models]]\nname = \"m\"\nsource = \"s\"\ndecode = { hosts = [\"a\"] }\nprefill = { hosts = [\"b\"], tensor = 2 }\n"))
	if err == nil || !strings.Contains(err.Error(), `f.toml:28:28: model m: prefill.tensor is not supported`) {
		t.Errorf("prefill.tensor: %v", err)
	}
}

// TestStageTensorPlan: four hosts, tensor = 2: stages [a, b] and [c, d];
// each stage's rank 0 gets the stage flags, every rank --layers, --stage
// and its stage's --tensor flags; the split by memory counts each stage
// as 2 × its ranks' least memory; heads that 2 ranks cannot divide are
// refused at the tensor key; a third stage's ports clash-checked.
func TestStageTensorPlan(t *testing.T) {
	src := fourCPUHosts + `
[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["a", "b", "c", "d"], shard = "pipeline", tensor = 2 }
prefill = { hosts = ["a"] }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	f := facts(12, gib, gib, false)
	ps, err := c.Place(func(string) (*modelinfo.Facts, error) { return f, nil }, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	WritePlacement(&out, ps)
	for _, w := range []string{"stage 0  hosts a+b  layers 0:6  per rank: weights", "stage 1  hosts c+d  layers 6:12  per rank: weights",
		"memory: a 40.00 GiB (memory_gib), b 20.00 GiB (memory_gib), c 20.00 GiB (memory_gib), d 20.00 GiB (memory_gib); layers split in proportion to 2 × each stage's least"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("config check's placement lacks %q:\n%s", w, out.String())
		}
	}
	// Stage 0 counts 2 × 20 GiB (b's), stage 1 2 × 20: an even split.
	if st := c.Stages("m", Decode); len(st) != 2 || st[0].Host != "a" || st[1].Host != "c" || counts(st)[0] != 6 {
		t.Fatalf("stages %+v", st)
	}
	s0peers, s1peers := "127.0.0.2:52504,127.0.0.3:52504", "127.0.0.4:52504,127.0.0.5:52504"
	for host, want := range map[string][]string{
		"a": {"m-decode-stage0-rank0", "--layers", "0:6", "--stage", "0/2", "--stage-listen", "127.0.0.2:52503", "--stage-next", "127.0.0.4:52503", "--tensor", "0/2", "--tensor-peers", s0peers},
		"b": {"m-decode-stage0-rank1", "--layers", "0:6", "--stage", "0/2", "--tensor", "1/2", "--tensor-peers", s0peers},
		"c": {"m-decode-stage1-rank0", "--layers", "6:12", "--stage", "1/2", "--stage-listen", "127.0.0.4:52503", "--stage-next", "127.0.0.2:52503", "--tensor", "0/2", "--tensor-peers", s1peers},
		"d": {"m-decode-stage1-rank1", "--layers", "6:12", "--stage", "1/2", "--tensor", "1/2", "--tensor-peers", s1peers},
	} {
		var got Runner
		for _, r := range c.Runners(host) {
			if r.Role == Decode {
				got = r
			}
		}
		if got.Name != want[0] {
			t.Fatalf("host %s: %q, want %q", host, got.Name, want[0])
		}
		args := got.Args()
		i := slices.Index(args, "--layers")
		if i < 0 || len(args) < i+len(want)-1 || !slices.Equal(args[i:i+len(want)-1], want[1:]) {
			t.Errorf("host %s: %v, want %v", host, args, want[1:])
		}
		if got.ServesAPI() != (host == "a") {
			t.Errorf("host %s: ServesAPI %v", host, got.ServesAPI())
		}
		if j := slices.Index(args, "--prefill"); j < 0 || args[j+1] != "127.0.0.2:52501" {
			t.Errorf("host %s: every rank gets --prefill: %v", host, args)
		}
	}
	// A stage counts 2 × its ranks' least memory: a rank 0 with more
	// does not move the split; both of stage 1's ranks with more do.
	for _, tc := range []struct {
		mem  [4]int // a, b, c, d
		want []int
	}{{[4]int{80, 20, 20, 20}, []int{6, 6}}, {[4]int{20, 20, 40, 40}, []int{4, 8}}} {
		parts := strings.Split(src, "memory_gib = ") // hosts a, b, c, d in file order
		s2 := parts[0]
		for k, p := range parts[1:] {
			s2 += fmt.Sprintf("memory_gib = %d", tc.mem[k]) + p[2:] // each was 2 digits
		}
		c2, err := Parse("f.toml", []byte(s2))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c2.Place(func(string) (*modelinfo.Facts, error) { return f, nil }, "a", 0); err != nil {
			t.Fatal(err)
		}
		if got := counts(c2.Stages("m", Decode)); !slices.Equal(got, tc.want) {
			t.Errorf("memory %v: split %v, want %v", tc.mem, got, tc.want)
		}
	}
	smol := func(string) (*modelinfo.Facts, error) {
		return &modelinfo.Facts{Heads: 9, KVHeads: 3, Intermediate: 1536, Layers: 30, LayerBytes: make([]int64, 30), KVLayer: make([]bool, 30)}, nil
	}
	if _, err := c.Place(smol, "a", 0); err == nil || !strings.Contains(err.Error(), `f.toml:27:62: model m: decode.tensor = 2: 2 hosts: num_attention_heads 9 is not divisible by 2`) {
		t.Errorf("heads 2 ranks cannot divide: %v", err)
	}
	// A stage's rank 0 holds the tensor link; on these cpu hosts no rank
	// has MLX's ring after it, and rank 1 (d) no link: nothing listens.
	_, err = Parse("f.toml", []byte(src+`
[[models]]
name = "n"
source = "s"
decode = { hosts = ["c"], port = 52504 }
`))
	if err == nil || !strings.Contains(err.Error(), "model m decode stage tensor link and model n decode both use port 52504 on host c") {
		t.Errorf("port clash: %v", err)
	}
	for _, port := range []string{"52504", "52505"} {
		if _, err := Parse("f.toml", []byte(src+`
[[models]]
name = "n"
source = "s"
decode = { hosts = ["d"], port = `+port+` }
`)); err != nil {
			t.Errorf("port %s on cpu rank 1 (nothing of m listens there): %v", port, err)
		}
	}
}

// TestStageTensorGroupsPlan: decode.groups of tensor stages: each group of
// four hosts is two stages of two ranks, its runners named by group,
// stage and rank, each stage's ranks its own tensor group.
func TestStageTensorGroupsPlan(t *testing.T) {
	src := fourCPUHosts
	for i, n := range []string{"e", "f", "g", "h"} {
		src += fmt.Sprintf("\n[hosts.%s]\naddress = \"127.0.0.%d\"\nbackend = \"cpu\"\nmemory_gib = 20\n", n, 6+i)
	}
	src += `
[[models]]
name = "m"
source = "org/m"
decode = { groups = [["a", "b", "c", "d"], ["e", "f", "g", "h"]], shard = "pipeline", tensor = 2, layers = [5, 7] }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string][]string{
		"b": {"m-decode-group0-stage0-rank1", "--layers", "0:5", "--stage", "0/2", "--tensor", "1/2", "--tensor-peers", "127.0.0.2:52504,127.0.0.3:52504"},
		"g": {"m-decode-group1-stage1-rank0", "--layers", "5:12", "--stage", "1/2", "--stage-listen", "127.0.0.8:52503", "--stage-next", "127.0.0.6:52503",
			"--tensor", "0/2", "--tensor-peers", "127.0.0.8:52504,127.0.0.9:52504"},
	} {
		rs := c.Runners(host)
		if len(rs) != 1 || rs[0].Name != want[0] {
			t.Fatalf("host %s runs %+v", host, rs)
		}
		args := rs[0].Args()
		i := slices.Index(args, "--layers")
		if i < 0 || len(args) < i+len(want)-1 || !slices.Equal(args[i:i+len(want)-1], want[1:]) {
			t.Errorf("host %s: %v, want %v", host, args, want[1:])
		}
	}
	if st := c.RunnerStages(c.Runners("h")[0]); len(st) != 2 || st[0].Host != "e" || st[1].Host != "g" {
		t.Errorf("group 1's stages as h's runner sees them: %+v", st)
	}
	// Split by memory instead: each group's stages count 2 × their
	// ranks' least (group 0's stage 0 has a at 40, b at 20: 40 in all).
	c, err = Parse("f.toml", []byte(strings.Replace(src, ", layers = [5, 7]", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := c.Place(func(string) (*modelinfo.Facts, error) { return facts(12, gib, gib, false), nil }, "a", 0)
	if err != nil || len(ps) != 2 || ps[0].Ranks != 2 || ps[1].Group != 1 {
		t.Fatalf("placement %+v %v", ps, err)
	}
	for g := range 2 {
		if got := counts(c.StageGroup("m", Decode, g)); !slices.Equal(got, []int{6, 6}) {
			t.Errorf("group %d split %v, want 6 and 6", g, got)
		}
	}
}

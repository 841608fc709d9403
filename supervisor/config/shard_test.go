package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
)

const threeHosts = `[cluster]
secret_file = "/etc/exo/secret"

[hosts.a]
address = "127.0.0.2"
backend = "cpu"

[hosts.b]
address = "127.0.0.3"
backend = "mlx-cpu"

[hosts.c]
address = "127.0.0.4"
backend = "metal"
`

func TestShardKeysInvalid(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"bad shard", `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], shard = "layers" }
`, []string{`f.toml:19:32: model m: decode.shard "layers": want "replicas" (every host a whole copy, the default), "pipeline" (the hosts are stages, in order) or "tensor"`}},
		{"one stage", `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a"], shard = "pipeline" }
`, []string{`f.toml:19:12: model m: decode.shard "pipeline" needs at least 2 hosts (one host holds the whole model: leave shard out)`}},
		{"layers without pipeline", `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], layers = [1, 1] }
`, []string{`f.toml:19:32: model m: decode.layers splits a pipeline: it needs shard = "pipeline"`}},
		{"layers count", `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], shard = "pipeline", layers = [1, 1, 1] }
`, []string{`f.toml:19:52: model m: decode.layers has 3 stage(s) but decode.hosts has 2: give one layer count per host, in host order`}},
		{"empty stage", `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], shard = "pipeline", layers = [3, 0] }
`, []string{`f.toml:19:65: model m: decode.layers[1] = 0: every stage needs at least one layer`}},
		{"bad memory", `
[hosts.d]
address = "127.0.0.5"
backend = "cpu"
memory_gib = -3
`, nil},
		{"stage link port clash", `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], shard = "pipeline", layers = [1, 1] }
[[models]]
name = "n"
source = "s"
decode = { hosts = ["a"], port = 52503 }
`, []string{`f.toml:23:27: two runners on one port: model m decode stage link and model n decode both use port 52503 on host a`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := threeHosts + tt.src
			switch tt.name {
			case "bad memory":
				src += "[[models]]\nname = \"m\"\nsource = \"s\"\ndecode = { hosts = [\"d\"] }\n"
				tt.want = []string{`f.toml:19:1: host d: memory_gib must be a positive number of GiB (what the host gives to weights and KV), got -3`}
			}
			_, err := Parse("f.toml", []byte(src))
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			if got := strings.Split(err.Error(), "\n"); !slices.Equal(got, tt.want) {
				t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(tt.want, "\n      "))
			}
		})
	}
}

func TestPipelinePlanByHand(t *testing.T) {
	src := threeHosts + `
[[models]]
name = "other"
source = "s"
decode = { hosts = ["a"] }

[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["c", "a", "b"], shard = "pipeline", layers = [10, 12, 8] }
prefill = { hosts = ["a"] }
speculative = { mode = "prompt-lookup" }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"a": {"m-decode-stage1", "--layers", "10:22", "--stage", "1/3", "--stage-listen", "127.0.0.2:52513", "--stage-next", "127.0.0.3:52513"},
		"b": {"m-decode-stage2", "--layers", "22:30", "--stage", "2/3", "--stage-listen", "127.0.0.3:52513", "--stage-next", "127.0.0.4:52513"},
		"c": {"m-decode-stage0", "--layers", "0:10", "--stage", "0/3", "--stage-listen", "127.0.0.4:52513", "--stage-next", "127.0.0.2:52513"},
	}
	for host, w := range want {
		var got Runner
		for _, r := range c.Runners(host) {
			if r.Model == "m" && r.Role == Decode {
				got = r
			}
		}
		if got.Name != w[0] {
			t.Fatalf("host %s: runner %q, want %q (runners %v)", host, got.Name, w[0], c.Runners(host))
		}
		args := got.Args()
		i := slices.Index(args, "--layers")
		if i < 0 || !slices.Equal(args[i:i+8], w[1:]) {
			t.Errorf("host %s: args %v, want %v", host, args, w[1:])
		}
		if got.ServesAPI() != (host == "c") {
			t.Errorf("host %s: StageZero = %v", host, got.ServesAPI())
		}
		// Every stage gets the model's flags: each fetches its own layer
		// range from the prefill runners (a later stage ignores
		// --speculative with a log line).
		for _, flag := range []string{"--prefill", "--prefill-health", "--speculative"} {
			if i := slices.Index(args, flag); i < 0 {
				t.Errorf("host %s: no %s in %v", host, flag, args)
			} else if want := map[string]string{"--prefill": "127.0.0.2:52511", "--prefill-health": "127.0.0.2:52512", "--speculative": "prompt-lookup"}[flag]; args[i+1] != want {
				t.Errorf("host %s: %s %s, want %s", host, flag, args[i+1], want)
			}
		}
	}
	if b := c.Runners("b"); len(b) != 1 || !slices.Contains(b[0].Args(), "--device") || !slices.Contains(b[0].Args(), "mlx") {
		t.Errorf("mlx-cpu host b: %v", b[0].Args())
	} else if i := slices.Index(b[0].Args(), "--device"); b[0].Args()[i+1] != "cpu" {
		t.Errorf("mlx-cpu host b: --device %s, want cpu", b[0].Args()[i+1])
	}
	// Moving one layer between the last two stages restarts every stage,
	// the untouched first one included.
	c2, err := Parse("f.toml", []byte(strings.Replace(src, "[10, 12, 8]", "[10, 11, 9]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"a", "b", "c"} {
		ch := Diff(c.Runners(host), c2.Runners(host))
		want := []string{"m-decode-stage0", "m-decode-stage1", "m-decode-stage2"}
		if len(ch.Restart) != 1 || !slices.Contains(want, ch.Restart[0].Name) || len(ch.Start)+len(ch.Stop) != 0 {
			t.Errorf("host %s: %v, want the stage restarted", host, ch)
		}
	}
}

func TestTensorPlan(t *testing.T) {
	src := threeHosts + `
[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["b", "a"], shard = "tensor" }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	peers := "127.0.0.3:52504,127.0.0.2:52504"
	for host, want := range map[string][]string{
		"b": {"m-decode-rank0", "--tensor", "0/2", "--tensor-peers", peers},
		"a": {"m-decode-rank1", "--tensor", "1/2", "--tensor-peers", peers},
	} {
		rs := c.Runners(host)
		if len(rs) != 1 || rs[0].Name != want[0] {
			t.Fatalf("host %s runs %+v", host, rs)
		}
		args := rs[0].Args()
		i := slices.Index(args, "--tensor")
		if i < 0 || !slices.Equal(args[i:i+4], want[1:]) {
			t.Errorf("host %s: %v, want %v", host, args, want[1:])
		}
		if rs[0].ServesAPI() != (host == "b") {
			t.Errorf("host %s: ServesAPI %v", host, rs[0].ServesAPI())
		}
	}
	// A third rank restarts the group: the peers change for every rank.
	c2, err := Parse("f.toml", []byte(strings.Replace(src, `["b", "a"]`, `["b", "a", "c"]`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if ch := Diff(c.Runners("b"), c2.Runners("b")); len(ch.Restart) != 1 {
		t.Errorf("rank 0 on b: %v, want a restart", ch)
	}
	// Rank 0's host (b, mlx-cpu) holds the tensor link and MLX's ring
	// after it; rank 1's (a, cpu) neither: nothing listens there.
	for _, tc := range []struct{ host, port, want string }{
		{"b", "52504", "two runners on one port: model m decode tensor link and model n decode both use port 52504 on host b"},
		{"b", "52505", "two runners on one port: model m decode tensor MLX ring and model n decode both use port 52505 on host b"},
		{"a", "52504", ""},
		{"a", "52505", ""},
	} {
		_, err = Parse("f.toml", []byte(src+`
[[models]]
name = "n"
source = "s"
decode = { hosts = ["`+tc.host+`"], port = `+tc.port+` }
`))
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("port %s on %s: %v, want %q", tc.port, tc.host, err, tc.want)
		}
	}
}

const fourHosts = threeHosts + `
[hosts.d]
address = "127.0.0.5"
backend = "cpu"
`

func TestPipelineGroupsInvalid(t *testing.T) {
	tests := []struct {
		name, decode string
		want         []string
	}{
		{"hosts and groups", `{ hosts = ["a"], groups = [["a", "b"]], shard = "pipeline" }`,
			[]string{`f.toml:23:27: model m: decode has both hosts and groups: groups lists every pipeline group's hosts; drop hosts`}},
		{"groups of replicas", `{ groups = [["a", "b"], ["c", "d"]] }`,
			[]string{`f.toml:23:12: model m: decode.groups makes replicas of a pipeline group: it needs shard = "pipeline" (for whole copies list the hosts in hosts)`}},
		{"a group of one", `{ groups = [["a", "b"], ["c"]], shard = "pipeline" }`,
			[]string{`f.toml:23:34: model m: decode.groups[1] has 1 host(s): a pipeline group needs at least 2 stages`}},
		{"a host in two groups", `{ groups = [["a", "b"], ["c", "a"]], shard = "pipeline" }`,
			[]string{`f.toml:23:40: model m: host "a" listed twice in decode.groups: a host runs one stage of one group`}},
		{"unknown host", `{ groups = [["a", "b"], ["c", "e"]], shard = "pipeline" }`,
			[]string{`f.toml:23:40: model m: decode on unknown host "e" (hosts: a, b, c, d)`}},
		{"layers per group", `{ groups = [["a", "b"], ["c", "d", "e"]], shard = "pipeline", layers = [1, 1] }`,
			[]string{`f.toml:23:45: model m: decode on unknown host "e" (hosts: a, b, c, d)`,
				`f.toml:23:72: model m: decode.layers has 2 stage(s) but group 1 of decode.groups has 3: every group is split by layers, so every group needs that many hosts`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := fourHosts + "\n[[models]]\nname = \"m\"\nsource = \"s\"\ndecode = " + tt.decode + "\n"
			_, err := Parse("f.toml", []byte(src))
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			if got := strings.Split(err.Error(), "\n"); !slices.Equal(got, tt.want) {
				t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(tt.want, "\n      "))
			}
		})
	}
	// Prefill groups are checked as decode's.
	for _, tt := range []struct{ name, prefill, want string }{
		{"prefill groups of replicas", `{ groups = [["b", "c"]] }`,
			`f.toml:24:13: model m: prefill.groups makes replicas of a pipeline group: it needs shard = "pipeline"`},
		{"prefill group of one", `{ groups = [["b", "c"], ["d"]], shard = "pipeline" }`,
			`f.toml:24:35: model m: prefill.groups[1] has 1 host(s): a pipeline group needs at least 2 stages`},
		{"prefill host in two groups", `{ groups = [["b", "c"], ["c", "d"]], shard = "pipeline" }`,
			`f.toml:24:36: model m: host "c" listed twice in prefill.groups`},
	} {
		src := fourHosts + "\n[[models]]\nname = \"m\"\nsource = \"s\"\ndecode = { hosts = [\"a\"] }\nprefill = " + tt.prefill + "\n"
		if _, err := Parse("f.toml", []byte(src)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %s", tt.name, err, tt.want)
		}
	}
}

const sixHosts = fourHosts + `
[hosts.e]
address = "127.0.0.6"
backend = "cpu"
[hosts.f]
address = "127.0.0.7"
backend = "cpu"
`

// stageWant is how one host's only runner is planned as a pipeline stage.
type stageWant struct{ name, stage, layers, next string }

// parseStages parses src and checks that each host of want runs exactly
// one runner, the stage want says (name, --stage, --layers, --stage-next).
func parseStages(t *testing.T, src string, want map[string]stageWant) *Config {
	t.Helper()
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	for h, w := range want {
		rs := c.Runners(h)
		if len(rs) != 1 {
			t.Fatalf("host %s runs %+v", h, rs)
		}
		r := rs[0]
		if r.Name != w.name || r.Stage != w.stage || r.Layers != w.layers || r.StageNext != w.next {
			t.Errorf("host %s: %s stage %s layers %s next %s, want %+v", h, r.Name, r.Stage, r.Layers, r.StageNext, w)
		}
	}
	return c
}

// TestPrefillGroupsPlan: prefill.groups plans each group as a prefill
// pipeline of its own (runners <model>-prefill-group<G>-stage<S>, the ring
// within the group), and every decode runner gets every group's stages as
// ADDR@A:B replicas of their ranges, decode replica k's list starting at
// group k mod G.
func TestPrefillGroupsPlan(t *testing.T) {
	src := sixHosts + `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "f"] }
prefill = { groups = [["b", "c"], ["d", "e"]], shard = "pipeline", layers = [1, 3] }
`
	c := parseStages(t, src, map[string]stageWant{
		"b": {"m-prefill-group0-stage0", "0/2", "0:1", "127.0.0.4:52506"},
		"c": {"m-prefill-group0-stage1", "1/2", "1:4", "127.0.0.3:52506"},
		"d": {"m-prefill-group1-stage0", "0/2", "0:1", "127.0.0.6:52506"},
		"e": {"m-prefill-group1-stage1", "1/2", "1:4", "127.0.0.5:52506"},
	})
	g0 := []string{"127.0.0.3:52501@0:1", "127.0.0.4:52501@1:4"}
	g1 := []string{"127.0.0.5:52501@0:1", "127.0.0.6:52501@1:4"}
	for h, w := range map[string][]string{"a": append(slices.Clone(g0), g1...), "f": append(slices.Clone(g1), g0...)} {
		rs := c.Runners(h)
		if len(rs) != 1 || !slices.Equal(rs[0].Prefill, w) {
			t.Errorf("decode on %s: --prefill %v, want %v", h, rs, w)
		}
		if len(rs) == 1 && len(rs[0].PrefillHealth) != 4 {
			t.Errorf("decode on %s: --prefill-health %v, want every stage's", h, rs[0].PrefillHealth)
		}
	}
}

// TestPipelineGroupsPlan: decode.groups plans each group as a pipeline of
// its own (runners <model>-decode-group<G>-stage<S>, the ring within the
// group), and the API is served by every group's stage 0, as replicas.
func TestPipelineGroupsPlan(t *testing.T) {
	src := fourHosts + `
[[models]]
name = "m"
source = "s"
decode = { groups = [["a", "b"], ["c", "d"]], shard = "pipeline", layers = [1, 3] }
`
	c := parseStages(t, src, map[string]stageWant{
		"a": {"m-decode-group0-stage0", "0/2", "0:1", "127.0.0.3:52503"},
		"b": {"m-decode-group0-stage1", "1/2", "1:4", "127.0.0.2:52503"},
		"c": {"m-decode-group1-stage0", "0/2", "0:1", "127.0.0.5:52503"},
		"d": {"m-decode-group1-stage1", "1/2", "1:4", "127.0.0.4:52503"},
	})
	for _, h := range []string{"a", "b", "c", "d"} {
		r := c.Runners(h)[0]
		if st := c.RunnerStages(r); len(st) != 2 || (st[0].Host != "a" && st[0].Host != "c") || st[0].Host != map[string]string{"a": "a", "b": "a", "c": "c", "d": "c"}[h] {
			t.Errorf("RunnerStages(%s) = %+v", r.Name, st)
		}
	}
	var api []string
	for _, r := range c.DecodeRunners("m") {
		if r.ServesAPI() {
			api = append(api, r.Host+"/"+r.Name)
		}
	}
	if !slices.Equal(api, []string{"a/m-decode-group0-stage0", "c/m-decode-group1-stage0"}) {
		t.Errorf("API served by %v, want each group's stage 0", api)
	}
	// A change to one group's hosts restarts only that group's stages.
	src2 := strings.Replace(src, `["c", "d"]`, `["d", "c"]`, 1)
	c2, err := Parse("f.toml", []byte(src2))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"a", "b"} {
		if ch := Diff(c.Runners(h), c2.Runners(h)); !ch.Empty() {
			t.Errorf("host %s of the untouched group: %s", h, ch)
		}
	}
	for _, h := range []string{"c", "d"} {
		if ch := Diff(c.Runners(h), c2.Runners(h)); ch.Empty() {
			t.Errorf("host %s of the changed group kept its stage", h)
		}
	}
}

// TestStageRingPortClash: a decode pipeline's stage on an MLX host takes
// the stage link port + 1 for MLX's ring; another runner there is refused.
func TestStageRingPortClash(t *testing.T) {
	src := threeHosts + `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["b", "c"], shard = "pipeline", layers = [1, 1] }
[[models]]
name = "n"
source = "s"
decode = { hosts = ["b"], port = 52504 }
`
	_, err := Parse("f.toml", []byte(src))
	if err == nil || !strings.Contains(err.Error(), "model m decode stage MLX ring and model n decode both use port 52504 on host b") {
		t.Errorf("Parse: %v", err)
	}
	// On a cpu host the port is free.
	if _, err := Parse("f.toml", []byte(strings.ReplaceAll(src, `"b"`, `"a"`))); err != nil {
		t.Errorf("cpu hosts: %v", err)
	}
}

// TestPrefillGroupsIntoDecodeGroups: every stage of decode group k gets
// the same --prefill list, starting at prefill group k mod G (a decode
// group's stages fetch one prompt: they prefer the same prefill group).
func TestPrefillGroupsIntoDecodeGroups(t *testing.T) {
	src := sixHosts + `
[hosts.g]
address = "127.0.0.8"
backend = "cpu"
[hosts.h]
address = "127.0.0.9"
backend = "cpu"

[[models]]
name = "m"
source = "s"
decode = { groups = [["a", "b"], ["c", "d"]], shard = "pipeline", layers = [1, 3] }
prefill = { groups = [["e", "f"], ["g", "h"]], shard = "pipeline", layers = [2, 2] }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	g0 := []string{"127.0.0.6:52501@0:2", "127.0.0.7:52501@2:4"}
	g1 := []string{"127.0.0.8:52501@0:2", "127.0.0.9:52501@2:4"}
	first, second := append(slices.Clone(g0), g1...), append(slices.Clone(g1), g0...)
	for h, w := range map[string][]string{"a": first, "b": first, "c": second, "d": second} {
		rs := c.Runners(h)
		if len(rs) != 1 || !slices.Equal(rs[0].Prefill, w) {
			t.Errorf("decode stage on %s: --prefill %v, want %v", h, rs, w)
		}
	}
}

// TestCostRouteRefused: remote_prefill_route = "cost" is refused, saying
// why, where the runners would route by the floor (the cost model needs
// whole decode and prefill runners); floor and the default are not.
func TestCostRouteRefused(t *testing.T) {
	for _, tc := range []struct{ roles, why string }{
		{`decode = { hosts = ["a", "b"], shard = "pipeline", layers = [1, 1] }`, "the decode runners are pipeline stages"},
		{`decode = { hosts = ["a", "b"], shard = "tensor" }`, "the decode runners are tensor ranks"},
		{"decode = { hosts = [\"a\"] }\nprefill = { hosts = [\"b\", \"c\"], shard = \"pipeline\", layers = [1, 1] }", "the prefill runners are pipeline stages"},
		{"decode = { hosts = [\"a\"] }\nprefill = { hosts = [\"b\", \"c\"], shard = \"tensor\" }", "the prefill runners are tensor ranks"},
	} {
		for _, route := range []string{"cost", "floor", ""} {
			src := threeHosts + "\n[[models]]\nname = \"m\"\nsource = \"s\"\n"
			if route != "" {
				src += "remote_prefill_route = \"" + route + "\"\n" // line 19
			}
			src += tc.roles + "\n"
			_, err := Parse("f.toml", []byte(src))
			want := ""
			if route == "cost" {
				want = `f.toml:19:1: model m: remote_prefill_route "cost": ` + tc.why + `: leave it out (they route by remote_prefill_min_tokens) or set "floor"`
			}
			if got := fmt.Sprint(err); (want == "" && err != nil) || (want != "" && got != want) {
				t.Errorf("%s, route %q: %v\nwant: %s", tc.roles, route, err, cmp.Or(want, "no error"))
			}
		}
	}
}

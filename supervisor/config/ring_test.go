package config

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

const mlxHosts = `[cluster]
secret_file = "/etc/exo/secret"
[hosts.m1]
address = "10.0.0.1"
backend = "metal"
[hosts.m2]
address = "10.0.0.2"
backend = "mlx-cpu"
[hosts.m3]
address = "10.0.0.3"
backend = "metal"
[hosts.m4]
address = "10.0.0.4"
backend = "cuda"
[hosts.c1]
address = "10.0.0.9"
backend = "cpu"
`

// TestRingHostfilePlan: a decode pipeline (or pipeline group) whose stages
// are all single MLX runners gets MLX's ring hostfile (each stage host's
// address at its stage link port + 1, in stage order) and each stage its
// rank; so does a prefill pipeline's (its stage link port + 1); a cpu
// stage and tensor stages get none.
func TestRingHostfilePlan(t *testing.T) {
	ring := func(addrs ...string) string {
		s := "["
		for i, a := range addrs {
			if i > 0 {
				s += ","
			}
			s += fmt.Sprintf(`["%s:52504"]`, a)
		}
		return s + "]"
	}
	pring := func(addrs ...string) string { return strings.ReplaceAll(ring(addrs...), ":52504", ":52507") }
	tests := []struct {
		name, model string
		want        map[string]string // host → hostfile ("" none)
		rank        map[string]int
	}{
		{"2 stages", `decode = { hosts = ["m2", "m1"], shard = "pipeline", layers = [1, 1] }`,
			map[string]string{"m2": ring("10.0.0.2", "10.0.0.1"), "m1": ring("10.0.0.2", "10.0.0.1")},
			map[string]int{"m2": 0, "m1": 1}},
		{"3 stages", `decode = { hosts = ["m1", "m2", "m3"], shard = "pipeline", layers = [1, 1, 1] }`,
			map[string]string{"m1": ring("10.0.0.1", "10.0.0.2", "10.0.0.3"), "m2": ring("10.0.0.1", "10.0.0.2", "10.0.0.3"), "m3": ring("10.0.0.1", "10.0.0.2", "10.0.0.3")},
			map[string]int{"m1": 0, "m2": 1, "m3": 2}},
		{"4 stages", `decode = { hosts = ["m4", "m3", "m2", "m1"], shard = "pipeline", layers = [1, 1, 1, 1] }`,
			map[string]string{"m4": ring("10.0.0.4", "10.0.0.3", "10.0.0.2", "10.0.0.1"), "m3": ring("10.0.0.4", "10.0.0.3", "10.0.0.2", "10.0.0.1"),
				"m2": ring("10.0.0.4", "10.0.0.3", "10.0.0.2", "10.0.0.1"), "m1": ring("10.0.0.4", "10.0.0.3", "10.0.0.2", "10.0.0.1")},
			map[string]int{"m4": 0, "m3": 1, "m2": 2, "m1": 3}},
		{"groups", `decode = { groups = [["m1", "m2"], ["m4", "m3"]], shard = "pipeline", layers = [1, 1] }`,
			map[string]string{"m1": ring("10.0.0.1", "10.0.0.2"), "m2": ring("10.0.0.1", "10.0.0.2"), "m4": ring("10.0.0.4", "10.0.0.3"), "m3": ring("10.0.0.4", "10.0.0.3")},
			map[string]int{"m1": 0, "m2": 1, "m4": 0, "m3": 1}},
		{"a group with a cpu stage", `decode = { groups = [["m1", "m2"], ["m3", "c1"]], shard = "pipeline", layers = [1, 1] }`,
			map[string]string{"m1": ring("10.0.0.1", "10.0.0.2"), "m2": ring("10.0.0.1", "10.0.0.2"), "m3": "", "c1": ""},
			map[string]int{"m1": 0, "m2": 1}},
		{"a cpu stage", `decode = { hosts = ["m1", "c1", "m3"], shard = "pipeline", layers = [1, 1, 1] }`,
			map[string]string{"m1": "", "c1": "", "m3": ""}, nil},
		{"tensor stages", `decode = { hosts = ["m1", "m2", "m3", "m4"], shard = "pipeline", tensor = 2, layers = [1, 1] }`,
			map[string]string{"m1": "", "m2": "", "m3": "", "m4": ""}, nil},
		{"replicas", `decode = { hosts = ["m1", "m2"] }`,
			map[string]string{"m1": "", "m2": ""}, nil},
		{"a prefill pipeline", "decode = { hosts = [\"m1\"] }\nprefill = { hosts = [\"m2\", \"m3\"], shard = \"pipeline\", layers = [1, 1] }",
			map[string]string{"m1": "", "m2": pring("10.0.0.2", "10.0.0.3"), "m3": pring("10.0.0.2", "10.0.0.3")},
			map[string]int{"m2": 0, "m3": 1}},
		{"a prefill pipeline with a cpu stage", "decode = { hosts = [\"m1\"] }\nprefill = { hosts = [\"m2\", \"c1\"], shard = \"pipeline\", layers = [1, 1] }",
			map[string]string{"m1": "", "m2": "", "c1": ""}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("f.toml", []byte(mlxHosts+"[[models]]\nname = \"m\"\nsource = \"s\"\n"+tt.model+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			for host, want := range tt.want {
				rs := c.Runners(host)
				if len(rs) == 0 {
					t.Fatalf("host %s runs nothing", host)
				}
				for _, r := range rs {
					if r.RingHostfile != want {
						t.Errorf("host %s: %s's hostfile %q, want %q", host, r.Name, r.RingHostfile, want)
					}
					env := r.Env("/state/h.json")
					if want == "" {
						if env != nil {
							t.Errorf("host %s: %s's env %v without a ring", host, r.Name, env)
						}
						continue
					}
					if w := []string{"MLX_HOSTFILE=/state/h.json", fmt.Sprintf("MLX_RANK=%d", tt.rank[host])}; !slices.Equal(env, w) {
						t.Errorf("host %s: %s's env %v, want %v", host, r.Name, env, w)
					}
				}
			}
		})
	}
}

// TestRingHostfileRestart: a stage whose ring hostfile changes restarts
// although its own command line does not (a host's address far down the
// ring changed).
func TestRingHostfileRestart(t *testing.T) {
	src := mlxHosts + "[[models]]\nname = \"m\"\nsource = \"s\"\n" + `decode = { hosts = ["m1", "m2", "m3", "m4"], shard = "pipeline", layers = [1, 1, 1, 1] }` + "\n"
	c1, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Parse("f.toml", []byte(strings.Replace(src, `address = "10.0.0.3"`, `address = "10.0.0.33"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	// Stage 0 (m1) does not see stage 2's address in its flags.
	r1, r2 := c1.Runners("m1")[0], c2.Runners("m1")[0]
	if !slices.Equal(r1.Args(), r2.Args()) {
		t.Fatalf("stage 0's flags changed: %v → %v", r1.Args(), r2.Args())
	}
	if ch := Diff(c1.Runners("m1"), c2.Runners("m1")); len(ch.Restart) != 1 {
		t.Errorf("stage 0 with a new ring hostfile: %s, want a restart", ch)
	}
}

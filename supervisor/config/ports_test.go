package config

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// portsCluster is the cluster file nix/tests/eval.nix also reads.
func portsCluster(t *testing.T) *Config {
	t.Helper()
	b, err := os.ReadFile("../../nix/tests/ports-cluster.toml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("ports-cluster.toml", b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func portNumbers(ps []HostPort) []int {
	var out []int
	for _, p := range ps {
		if !slices.Contains(out, p.Port) {
			out = append(out, p.Port)
		}
	}
	return out
}

// TestHostPortsMatchNix: Config.HostPorts gives, for every host of
// nix/tests/ports-cluster.toml, the ports nix/lib's hostPorts gives (the
// modules' openFirewall): nix/tests/check.sh writes and checks
// fixtures/ports-cluster.json from the Nix side, this test from Go's.
func TestHostPortsMatchNix(t *testing.T) {
	c := portsCluster(t)
	got := map[string][]int{}
	for _, h := range c.HostNames() {
		got[h] = portNumbers(c.HostPorts(h))
	}
	b, err := os.ReadFile("../../nix/tests/fixtures/ports-cluster.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string][]int
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		t.Errorf("Go's ports differ from Nix's (nix/tests/fixtures/ports-cluster.json):\n go: %s\nnix: %s", g, b)
	}
}

// TestHostPorts: the rules by example (model i's block is 40000 + 10i):
// a tensor rank after 0 takes no link port but, on MLX, the ring's; a cpu
// host no ring port; the prefill tensor rank 0 its link.
func TestHostPorts(t *testing.T) {
	c := portsCluster(t)
	for _, tc := range []struct {
		host      string
		has, lack []int
	}{
		{"m2", []int{40020, 40025}, []int{40023, 40024}},                        // stage 0's rank 1 (metal)
		{"cpu2", []int{40020, 41000}, []int{40023, 40024, 40025, 40034, 40035}}, // cpu ranks 1
		{"cpu1", []int{40013, 41001, 41002}, []int{40014, 40038, 40039}},        // cpu stage, cpu prefill rank 2
		{"m1", []int{40013, 40014, 40023, 40024, 40025}, nil},                   // MLX stage and tensor stage lead
		{"mini", []int{41000, 40034, 40035, 40013, 40014}, []int{40030}},        // port override replaces base
		{"m3", []int{40038, 40039, 41001, 41002}, []int{40031, 40032}},          // prefill tensor rank 0 (mlx-cpu)
		{"spark", []int{40016, 40039}, []int{40038}},                            // prefill stage, cuda rank 1
		{"idle", []int{8000}, []int{40000}},
	} {
		ps := portNumbers(c.HostPorts(tc.host))
		for _, p := range tc.has {
			if !slices.Contains(ps, p) {
				t.Errorf("%s: ports %v lack %d", tc.host, ps, p)
			}
		}
		for _, p := range tc.lack {
			if slices.Contains(ps, p) {
				t.Errorf("%s: ports %v have %d", tc.host, ps, p)
			}
		}
	}
}

// TestHostPortsCoverRunners: every address the planned runners listen on
// (decode HTTP, prefill KV and metrics, stage links, rank 0's tensor link,
// the MLX ring hostfile's entry for the runner's rank) is among its host's
// HostPorts.
func TestHostPortsCoverRunners(t *testing.T) {
	c := portsCluster(t)
	runners := c.AllRunners()
	stages := 0
	for _, r := range runners {
		ports := portNumbers(c.HostPorts(r.Host))
		var listens []string
		listens = append(listens, r.Listen)
		if r.Metrics != "" {
			listens = append(listens, r.Metrics)
		}
		if r.StageListen != "" {
			listens = append(listens, r.StageListen)
			stages++
		}
		if len(r.TensorPeers) > 0 && (r.Tensor == "" || r.Tensor[:2] == "0/") {
			listens = append(listens, r.TensorPeers[0])
		}
		if r.RingHostfile != "" {
			var hosts [][]string
			if err := json.Unmarshal([]byte(r.RingHostfile), &hosts); err != nil {
				t.Fatal(err)
			}
			listens = append(listens, hosts[r.RingRank][0])
		}
		for _, a := range listens {
			h, p, err := net.SplitHostPort(a)
			n, _ := strconv.Atoi(p)
			if err != nil || h != r.Address || !slices.Contains(ports, n) {
				t.Errorf("%s on %s listens on %s: not among its host's ports %v", r.Name, r.Host, a, ports)
			}
		}
	}
	if stages == 0 {
		t.Fatal("no pipeline stage planned: the fixture's hand splits were not placed")
	}
}

// portHosts: four MLX hosts and a cpu one.
const portHosts = `[cluster]
secret_file = "/etc/exo/secret"
[hosts.a]
address = "127.0.0.2"
backend = "mlx-cpu"
[hosts.b]
address = "127.0.0.3"
backend = "mlx-cpu"
[hosts.c]
address = "127.0.0.4"
backend = "mlx-cpu"
[hosts.d]
address = "127.0.0.5"
backend = "mlx-cpu"
[hosts.e]
address = "127.0.0.6"
backend = "cpu"
`

// TestPortClaims: every kind of port a host listens on (model m is
// models[1]: its block is 52510 + k) is claimed once, by the same list
// that HostPorts gives openFirewall, and validate refuses another runner
// on it at the key that chooses it (the key written in m's role table, or
// the table itself where the port is the default). A port nothing listens
// on (a cpu host's ring, a rank after 0's link) is not claimed.
func TestPortClaims(t *testing.T) {
	for _, tc := range []struct {
		kind, roles, host string
		port              int
		key               string // the key in m's roles that the clash names ("": the role table's own)
	}{
		{"model m decode", `decode = { hosts = ["a"] }`, "a", 52510, ""},
		{"model m prefill", `decode = { hosts = ["b"] }` + "\n" + `prefill = { hosts = ["a"] }`, "a", 52511, ""},
		{"model m prefill metrics", `decode = { hosts = ["b"] }` + "\n" + `prefill = { hosts = ["a"] }`, "a", 52512, ""},
		{"model m decode", `decode = { hosts = ["a"], port = 9000 }`, "a", 9000, "port"},
		{"model m prefill metrics", `decode = { hosts = ["b"] }` + "\n" + `prefill = { hosts = ["a"], metrics_port = 9001 }`, "a", 9001, "metrics_port"},
		{"model m decode stage link", `decode = { hosts = ["a", "b"], shard = "pipeline", layers = [1, 1] }`, "b", 52513, "shard"},
		{"model m decode stage MLX ring", `decode = { hosts = ["a", "b"], shard = "pipeline", layers = [1, 1] }`, "a", 52514, "shard"},
		{"model m decode tensor link", `decode = { hosts = ["a", "b"], shard = "tensor" }`, "a", 52514, "shard"},
		{"model m decode tensor MLX ring", `decode = { hosts = ["a", "b"], shard = "tensor" }`, "b", 52515, "shard"},
		{"model m decode stage tensor link", `decode = { hosts = ["a", "b", "c", "d"], shard = "pipeline", tensor = 2 }`, "c", 52514, "tensor"},
		{"model m decode stage tensor MLX ring", `decode = { hosts = ["a", "b", "c", "d"], shard = "pipeline", tensor = 2 }`, "d", 52515, "tensor"},
		{"model m prefill stage link", `decode = { hosts = ["c"] }` + "\n" + `prefill = { hosts = ["a", "b"], shard = "pipeline", layers = [1, 1] }`, "b", 52516, "shard"},
		{"model m prefill stage MLX ring", `decode = { hosts = ["c"] }` + "\n" + `prefill = { hosts = ["a", "b"], shard = "pipeline", layers = [1, 1] }`, "a", 52517, "shard"},
		{"model m prefill tensor link", `decode = { hosts = ["c"] }` + "\n" + `prefill = { hosts = ["a", "b"], shard = "tensor" }`, "a", 52518, "shard"},
		{"model m prefill tensor MLX ring or NCCL", `decode = { hosts = ["c"] }` + "\n" + `prefill = { hosts = ["a", "b"], shard = "tensor" }`, "b", 52519, "shard"},
		// Not claimed: nothing listens there.
		{"", `decode = { hosts = ["e", "a"], shard = "pipeline", layers = [1, 1] }`, "e", 52514, ""},      // a cpu stage's ring
		{"", `decode = { hosts = ["a", "b"], shard = "tensor" }`, "b", 52514, ""},                         // rank 1's tensor link
		{"", `decode = { hosts = ["a", "b", "c", "d"], shard = "pipeline", tensor = 2 }`, "b", 52513, ""}, // rank 1 of stage 0: no stage link
	} {
		name := fmt.Sprintf("%s/%s:%d", tc.kind, tc.host, tc.port)
		t.Run(name, func(t *testing.T) {
			m := "\n[[models]]\nname = \"m\"\nsource = \"s\"\n" + tc.roles + "\n"
			n := fmt.Sprintf("\n[[models]]\nname = \"n\"\nsource = \"s\"\ndecode = { hosts = [%q], port = %d }\n", tc.host, tc.port)
			if tc.kind == "" {
				// Claimed by no kind: another runner may take it.
				if _, err := Parse("f.toml", []byte(portHosts+n+m)); err != nil {
					t.Fatalf("model n on port %d of %s: %v", tc.port, tc.host, err)
				}
				return
			}
			// Model m alone (a filler first, so that m is models[1]).
			filler := "\n[[models]]\nname = \"n\"\nsource = \"s\"\ndecode = { hosts = [\"e\"] }\n"
			c, err := Parse("f.toml", []byte(portHosts+filler+m))
			if err != nil {
				t.Fatal(err)
			}
			var claims []HostPort
			for _, p := range c.HostPorts(tc.host) {
				if p.Port == tc.port {
					claims = append(claims, p)
				}
			}
			if len(claims) != 1 || claims[0].What != tc.kind {
				t.Fatalf("%s's claims of port %d: %+v, want one: %s", tc.host, tc.port, claims, tc.kind)
			}
			// Model n first on that port: m's claim is refused at its key.
			src := portHosts + n + m
			_, err = Parse("f.toml", []byte(src))
			want := fmt.Sprintf("f.toml:%s: two runners on one port: model n decode and %s both use port %d on host %s", roleKeyPos(t, src, tc.key), tc.kind, tc.port, tc.host)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("clash: %v\nwant %s", err, want)
			}
		})
	}
}

// roleKeyPos is LINE:COL of key in model m's last role line of src (key "":
// that line's role key).
func roleKeyPos(t *testing.T, src, key string) string {
	t.Helper()
	lines := strings.Split(src, "\n")
	at := slices.Index(lines, `name = "m"`)
	line := -1
	for i := at; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "decode = ") || strings.HasPrefix(lines[i], "prefill = ") {
			if key == "" || strings.Contains(lines[i], key+" = ") {
				line = i
			}
		}
	}
	if at < 0 || line < 0 {
		t.Fatalf("no role line with %q for model m", key)
	}
	col := 1
	if key != "" {
		col = strings.Index(lines[line], key+" = ") + 1
	}
	return fmt.Sprintf("%d:%d", line+1, col)
}

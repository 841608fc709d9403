package config

import (
	"encoding/json"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
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

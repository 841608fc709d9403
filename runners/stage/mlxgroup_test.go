package stage

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/backend"
)

// TestMLXGroupPlan: which stages offer MLX's ring, and why not. On the
// cpu backend never; with MLX (EXO_MLXC_PATH, by hand) two stages plan
// their own hostfile, three need MLX_HOSTFILE with their own MLX_RANK.
func TestMLXGroupPlan(t *testing.T) {
	cpu, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if g, why := MLXGroup(cpu, MLXPlan{Stage: 0, Stages: 2, Listen: "127.0.0.1:1", Next: "127.0.0.1:3"}); g != nil || why.Transport != TransportTCP || why.Reason != ReasonCPUBackend || !strings.Contains(why.Detail, "cpu backend") {
		t.Errorf("cpu backend: %v, %+v", g, why)
	}
	lib := os.Getenv("EXO_MLXC_PATH")
	if lib == "" {
		t.Skip("the MLX cases by hand: set EXO_MLXC_PATH to libmlxc.so")
	}
	b, err := backend.Open("mlx", backend.Options{LibPath: lib, Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MLX_HOSTFILE", "")
	t.Setenv("MLX_RANK", "")
	two := MLXPlan{Stage: 1, Stages: 2, Listen: "127.0.0.1:8013", Next: "127.0.0.1:8003"}
	if g, why := MLXGroup(b, two); g == nil || g.Transport != "mlx" || g.Join == nil || why != Offered() {
		t.Errorf("two MLX stages: no group (%+v)", why)
	}
	bad := two
	bad.Listen = "127.0.0.1:65535"
	if g, why := MLXGroup(b, bad); g != nil || why.Reason != ReasonRingPlan || !strings.Contains(why.Detail, "--stage-listen") {
		t.Errorf("a stage link on the last port: %v, %+v", g, why)
	}
	three := MLXPlan{Stage: 1, Stages: 3, Listen: "127.0.0.1:8013", Next: "127.0.0.1:8023"}
	if g, why := MLXGroup(b, three); g != nil || why.Reason != ReasonRingPlan || !strings.Contains(why.Detail, "MLX_HOSTFILE") {
		t.Errorf("three stages without MLX_HOSTFILE: %v, %+v", g, why)
	}
	hf := filepath.Join(t.TempDir(), "hosts.json")
	if err := os.WriteFile(hf, []byte(`[["127.0.0.1:8004"],["127.0.0.1:8014"],["127.0.0.1:8024"]]`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MLX_HOSTFILE", hf)
	t.Setenv("MLX_RANK", "2")
	if g, why := MLXGroup(b, three); g != nil || why.Reason != ReasonRingPlan || !strings.Contains(why.Detail, "MLX_RANK") {
		t.Errorf("MLX_RANK of another stage: %v, %+v", g, why)
	}
	t.Setenv("MLX_RANK", "1")
	if g, why := MLXGroup(b, three); g == nil || !g.Whole {
		t.Errorf("three stages with MLX_HOSTFILE and this MLX_RANK: no whole group (%v, %+v)", g, why)
	}
}

// TestRingPlan: where a stage's rank of MLX's ring comes from. The
// supervisor's hostfile (MLX_HOSTFILE with this stage's MLX_RANK, listing
// every stage) serves any number of stages and marks the group whole;
// without it only two stages write their own; a hostfile of another
// rank, another length, or not a hostfile keeps the stage on the link,
// saying why.
func TestRingPlan(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ranks := func(n int) string {
		s := "["
		for i := range n {
			if i > 0 {
				s += ","
			}
			s += fmt.Sprintf(`["10.0.0.%d:52504"]`, i+1)
		}
		return s + "]"
	}
	three, four, five := file("3.json", ranks(3)), file("4.json", ranks(4)), file("5.json", ranks(5))
	garbage := file("bad.json", `{"hosts": 1}`)
	plan := func(stage, stages int) MLXPlan {
		return MLXPlan{Stage: stage, Stages: stages, Listen: "127.0.0.1:8003", Next: "127.0.0.2:8003"}
	}
	for _, tc := range []struct {
		name           string
		p              MLXPlan
		hostfile, rank string
		write          []string
		whole          bool
		why            string // "" = offers the ring
	}{
		{"2 stages write their own (stage 0)", plan(0, 2), "", "", []string{"127.0.0.1:8004", "127.0.0.2:8004"}, false, ""},
		{"2 stages write their own (stage 1)", plan(1, 2), "", "", []string{"127.0.0.2:8004", "127.0.0.1:8004"}, false, ""},
		{"3 stages without a hostfile", plan(1, 3), "", "", nil, false, "3 stages need MLX_HOSTFILE"},
		{"4 stages without a hostfile", plan(3, 4), "", "", nil, false, "4 stages need MLX_HOSTFILE"},
		{"3 stages, the supervisor's hostfile", plan(2, 3), three, "2", nil, true, ""},
		{"4 stages, the supervisor's hostfile", plan(1, 4), four, "1", nil, true, ""},
		{"5 stages, the supervisor's hostfile", plan(4, 5), five, "4", nil, true, ""},
		{"2 stages, a hostfile of 3", plan(0, 2), three, "0", nil, false, "lists 3 ranks; this pipeline has 2 stages"},
		{"another stage's rank", plan(1, 4), four, "2", nil, false, `MLX_RANK "2", not this stage's index 1`},
		{"no MLX_RANK", plan(0, 3), three, "", nil, false, `MLX_RANK ""`},
		{"a missing hostfile", plan(0, 3), filepath.Join(dir, "none.json"), "0", nil, false, "MLX_HOSTFILE: open"},
		{"not a hostfile", plan(0, 3), garbage, "0", nil, false, "not MLX's ring hostfile"},
		{"no ring port", MLXPlan{Stage: 0, Stages: 2, Listen: "127.0.0.1:65535", Next: "127.0.0.2:8003"}, "", "", nil, false, "--stage-listen"},
	} {
		write, whole, why := ringPlan(tc.p, tc.hostfile, tc.rank)
		if !slices.Equal(write, tc.write) || whole != tc.whole || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("%s: write %v whole %v why %q; want %v %v %q", tc.name, write, whole, why, tc.write, tc.whole, tc.why)
		}
	}
}

package stage

import (
	"os"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/backend"
)

// TestRingAddr: MLX's ring listens on a stage link's port + 1.
func TestRingAddr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:8003", "127.0.0.1:8004"},
		{"[::1]:9", "[::1]:10"},
		{"host:65535", ""},
		{"host:0", ""},
		{"nohost", ""},
		{"h:x", ""},
	} {
		got, err := ringAddr(tc.in)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("ringAddr(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestMLXGroupPlan: which stages offer MLX's ring, and why not. On the
// cpu backend never; with MLX (EXO_MLXC_PATH, by hand) two stages plan
// their own hostfile, three need MLX_HOSTFILE with their own MLX_RANK.
func TestMLXGroupPlan(t *testing.T) {
	cpu, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if g, why := MLXGroup(cpu, MLXPlan{Stage: 0, Stages: 2, Listen: "127.0.0.1:1", Next: "127.0.0.1:3"}); g != nil || !strings.Contains(why, "cpu backend") {
		t.Errorf("cpu backend: %v, %q", g, why)
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
	if g, why := MLXGroup(b, two); g == nil || g.Transport != "mlx" || g.Join == nil {
		t.Errorf("two MLX stages: no group (%q)", why)
	}
	bad := two
	bad.Listen = "127.0.0.1:65535"
	if g, why := MLXGroup(b, bad); g != nil || !strings.Contains(why, "--stage-listen") {
		t.Errorf("a stage link on the last port: %v, %q", g, why)
	}
	three := MLXPlan{Stage: 1, Stages: 3, Listen: "127.0.0.1:8013", Next: "127.0.0.1:8023"}
	if g, why := MLXGroup(b, three); g != nil || !strings.Contains(why, "MLX_HOSTFILE") {
		t.Errorf("three stages without MLX_HOSTFILE: %v, %q", g, why)
	}
	t.Setenv("MLX_HOSTFILE", "/nonexistent/hosts.json")
	t.Setenv("MLX_RANK", "2")
	if g, why := MLXGroup(b, three); g != nil || !strings.Contains(why, "MLX_RANK") {
		t.Errorf("MLX_RANK of another stage: %v, %q", g, why)
	}
	t.Setenv("MLX_RANK", "1")
	if g, why := MLXGroup(b, three); g == nil {
		t.Errorf("three stages with MLX_HOSTFILE and this MLX_RANK: no group (%q)", why)
	}
}

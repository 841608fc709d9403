package tensor

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestParseRDMA(t *testing.T) {
	m, err := ParseRDMA(`[[null,"rdma_en3","rdma_en4"],["rdma_en3",null,"rdma_en5"],["rdma_en4","rdma_en5",null]]`, 3)
	if err != nil {
		t.Fatal(err)
	}
	if m[1][2] != "rdma_en5" || m[2][0] != "rdma_en4" || m[0][0] != "" {
		t.Fatalf("matrix %q", m)
	}
	for _, tc := range []struct{ in, want string }{
		{`not json`, "JSON matrix"},
		{`[[null,"a"]]`, "1 rows for 2 ranks"},
		{`[[null,"a"],["b"]]`, "row 1 has 1 entries"},
		{`[[null,"a"],[null,null]]`, "rank 1 has no RDMA device toward rank 0"},
		{`[[null,"a"],["",null]]`, "rank 1 has no RDMA device toward rank 0"},
		{`[["x","a"],["b",null]]`, "rank 0 names device \"x\" toward itself"},
	} {
		_, err := ParseRDMA(tc.in, 2)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRDMA(%s): %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestJACCLEnv(t *testing.T) {
	dir := t.TempDir()
	c := RankConfig{Rank: 1, Size: 2, Peers: []string{"10.0.0.1:7004", "10.0.0.2:7004"},
		RDMA: [][]string{{"", "rdma_en3"}, {"rdma_en4", ""}}}
	env, err := jacclEnv(c, dir)
	if err != nil {
		t.Fatal(err)
	}
	if env["MLX_RANK"] != "1" || env["MLX_JACCL_COORDINATOR"] != "10.0.0.1:7005" {
		t.Fatalf("env %v", env)
	}
	b, err := os.ReadFile(env["MLX_IBV_DEVICES"])
	if err != nil {
		t.Fatal(err)
	}
	// MLX's format: null on the diagonal, names elsewhere.
	var got [][]*string
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if string(b) != `[[null,"rdma_en3"],["rdma_en4",null]]` {
		t.Fatalf("MLX_IBV_DEVICES file %s", b)
	}
	c.Peers[0] = "[fe80::1]:7004"
	if env, err = jacclEnv(c, dir); err != nil || env["MLX_JACCL_COORDINATOR"] != "[fe80::1]:7005" {
		t.Fatalf("IPv6 coordinator %v, %v", env, err)
	}
	c.RDMA[0][1] = ""
	if _, err := jacclEnv(c, dir); err == nil || !strings.Contains(err.Error(), "rank 0 has no RDMA device toward rank 1") {
		t.Fatalf("broken mesh: %v", err)
	}
	c.RDMA[0][1] = "rdma_en3"
	c.Peers[0] = "10.0.0.1:65535"
	if _, err := jacclEnv(c, dir); err == nil {
		t.Fatal("port 65535 leaves no coordinator port, want an error")
	}
}

func TestChooseMLXBackend(t *testing.T) {
	none := RankConfig{Size: 2}
	asked := false
	if bk, why := chooseMLXBackend(none, false, func(string) (bool, error) { asked = true; return true, nil }); bk != "ring" || why != "" || asked {
		t.Fatalf("no matrix: %q %q (asked %v)", bk, why, asked)
	}
	mesh := RankConfig{Size: 2, RDMA: [][]string{{"", "a"}, {"b", ""}}}
	if bk, why := chooseMLXBackend(mesh, false, func(n string) (bool, error) { return n == "jaccl", nil }); bk != "jaccl" || why != "" {
		t.Fatalf("JACCL available: %q %q", bk, why)
	}
	if bk, why := chooseMLXBackend(mesh, false, func(string) (bool, error) { return false, nil }); bk != "ring" || !strings.Contains(why, `is_available("jaccl") is false`) {
		t.Fatalf("JACCL unavailable: %q %q", bk, why)
	}
	if bk, why := chooseMLXBackend(mesh, false, func(string) (bool, error) { return false, errors.New("no libmlxc") }); bk != "ring" || why != "no libmlxc" {
		t.Fatalf("probe failed: %q %q", bk, why)
	}
}

func TestRankConfigCheckRDMA(t *testing.T) {
	c := RankConfig{Rank: 0, Size: 2, Peers: []string{"a:1", "b:1"}, RDMA: [][]string{{"", "x"}, {"", ""}}}
	if err := c.Check(); err == nil || !strings.Contains(err.Error(), "rank 1 has no RDMA device toward rank 0") {
		t.Fatalf("Check: %v", err)
	}
}

// FuzzParseRDMA: a --tensor-rdma value never panics the parser, and what
// it accepts is a full mesh that survives jacclEnv's encoding.
func FuzzParseRDMA(f *testing.F) {
	f.Add(`[[null,"rdma_en3"],["rdma_en3",null]]`, 2)
	f.Add(`[[null,"a","b"],["a",null,"c"],["b","c",null]]`, 3)
	f.Add(`[[null]]`, 1)
	f.Add(`{}`, 2)
	f.Fuzz(func(t *testing.T, s string, size int) {
		m, err := ParseRDMA(s, size)
		if err != nil {
			return
		}
		if err := CheckMesh(m, size); err != nil {
			t.Fatalf("accepted %q but CheckMesh says %v", s, err)
		}
	})
}

// TestNCCL: a CUDA rank picks NCCL where this libmlx has it (ring, with
// the reason, where not), and its environment is what MLX's NCCL backend
// reads: rank, world size, rank 0's host and its port + 1; an IPv6 rank 0
// is refused (MLX's rendezvous resolves IPv4 only).
func TestNCCL(t *testing.T) {
	c := RankConfig{Rank: 1, Size: 2, Peers: []string{"10.0.0.10:52500", "10.0.0.11:52500"}}
	if bk, why := chooseMLXBackend(c, true, func(n string) (bool, error) { return n == "nccl", nil }); bk != "nccl" || why != "" {
		t.Fatalf("NCCL available: %q %q", bk, why)
	}
	if bk, why := chooseMLXBackend(c, true, func(string) (bool, error) { return false, nil }); bk != "ring" || !strings.Contains(why, `is_available("nccl") is false`) {
		t.Fatalf("NCCL unavailable: %q %q", bk, why)
	}
	env, err := ncclEnv(c)
	want := map[string]string{"MLX_RANK": "1", "MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "10.0.0.10", "NCCL_PORT": "52501"}
	if err != nil || !reflect.DeepEqual(env, want) {
		t.Fatalf("ncclEnv: %v %v", env, err)
	}
	c.Peers[0] = "[fd00::1]:52500"
	if _, err := ncclEnv(c); err == nil || !strings.Contains(err.Error(), "IPv6") {
		t.Fatalf("IPv6 rank 0: %v", err)
	}
	c.Peers[0] = "spark-1:65535"
	if _, err := ncclEnv(c); err == nil {
		t.Fatal("port 65535 leaves no next port")
	}
}

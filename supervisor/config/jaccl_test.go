package config

import (
	"slices"
	"strings"
	"testing"
)

const threeMacs = `[cluster]
secret_file = "/etc/exo/secret"

[hosts.m1]
address = "10.0.0.1"
backend = "metal"
rdma = { m2 = "rdma_en3", m3 = "rdma_en4" }

[hosts.m2]
address = "10.0.0.2"
backend = "metal"
rdma = { m1 = "rdma_en3", m3 = "rdma_en5" }

[hosts.m3]
address = "10.0.0.3"
backend = "metal"
rdma = { m1 = "rdma_en4", m2 = "rdma_en5" }
`

// TestTensorPlanJACCL: a tensor group of metal hosts that name their
// Thunderbolt RDMA devices gets --tensor-rdma, the device matrix in rank
// order with null on the diagonal; other groups do not.
func TestTensorPlanJACCL(t *testing.T) {
	src := threeMacs + `
[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["m3", "m1", "m2"], shard = "tensor" }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := `[[null,"rdma_en4","rdma_en5"],["rdma_en4",null,"rdma_en3"],["rdma_en5","rdma_en3",null]]`
	for _, host := range []string{"m1", "m2", "m3"} {
		rs := c.Runners(host)
		if len(rs) != 1 {
			t.Fatalf("host %s runs %+v", host, rs)
		}
		args := rs[0].Args()
		i := slices.Index(args, "--tensor-rdma")
		if i < 0 || args[i+1] != want {
			t.Errorf("host %s: %v, want --tensor-rdma %s", host, args, want)
		}
	}
	// A group with a host that is not metal uses the ring: no matrix.
	c2, err := Parse("f.toml", []byte(threeHosts+`
[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["b", "a"], shard = "tensor" }
`))
	if err != nil {
		t.Fatal(err)
	}
	if args := c2.Runners("b")[0].Args(); slices.Contains(args, "--tensor-rdma") {
		t.Errorf("ring group: %v", args)
	}
}

func TestRDMAInvalid(t *testing.T) {
	model := `
[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["m1", "m2", "m3"], shard = "tensor" }
`
	for _, tc := range []struct{ name, src, want string }{
		{"missing cable", strings.Replace(threeMacs, `rdma = { m1 = "rdma_en4", m2 = "rdma_en5" }`, `rdma = { m1 = "rdma_en4" }`, 1) + model,
			`f.toml:17:1: model m: decode.shard "tensor" on metal hosts m1, m2, m3 joins MLX's JACCL, which needs a full mesh: host m3 names no rdma device toward m2`},
		{"unknown peer", strings.Replace(threeMacs, `m3 = "rdma_en4" }`, `m3 = "rdma_en4", m9 = "rdma_en9" }`, 1),
			`host m1: rdma names unknown host "m9"`},
		{"self", strings.Replace(threeMacs, `m3 = "rdma_en4" }`, `m3 = "rdma_en4", m1 = "rdma_en9" }`, 1),
			`host m1: rdma names a device toward itself`},
		{"bad device", strings.Replace(threeMacs, `"rdma_en3", m3`, `"rdma en3", m3`, 1),
			`host m1: rdma device toward m2 is "rdma en3"`},
		{"cpu host", strings.Replace(threeHosts, `backend = "cpu"`, "backend = \"cpu\"\nrdma = { b = \"rdma_en3\" }", 1),
			`host a: rdma names Thunderbolt RDMA devices for MLX's JACCL backend (macOS): it needs backend = "metal", not "cpu"`},
	} {
		_, err := Parse("f.toml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

package main

import (
	"errors"
	"strings"
	"testing"
)

// TestRunnerTensorFlags: --tensor and --tensor-peers go together, name a
// rank inside the group and one address per rank, on both roles (not on a
// prefill pipeline stage); a decode stage's rank 0 takes the stage flags,
// its other ranks --layers and --stage only.
func TestRunnerTensorFlags(t *testing.T) {
	base := "decode --model x --served-name m --listen :0 "
	for _, c := range []struct{ args, want string }{
		{base + "--tensor 0/2", "go together"},
		{base + "--tensor-peers a:1,b:2", "go together"},
		{base + "--tensor 2/2 --tensor-peers a:1,b:2", "0 ≤ I < N"},
		{base + "--tensor 0/1 --tensor-peers a:1", "N ≥ 2"},
		{base + "--tensor x --tensor-peers a:1,b:2", "want I/N"},
		{base + "--tensor 0/3 --tensor-peers a:1,b:2", "2 addresses for 3 ranks"},
		{base + "--tensor 0/2 --tensor-peers a:1,b", "rank 1's address"},
		{base + `--tensor-rdma [[null,"a"],["b",null]]`, "needs --tensor"},
		{base + `--tensor 0/2 --tensor-peers a:1,b:2 --tensor-rdma [[null,"a"],[null,null]]`, "rank 1 has no RDMA device toward rank 0"},
		{base + `--tensor 0/2 --tensor-peers a:1,b:2 --tensor-rdma [[null,"a"]]`, "1 rows for 2 ranks"},
		{base + `--backend cpu --tensor 0/2 --tensor-peers a:1,b:2 --tensor-rdma [[null,"a"],["b",null]]`, "needs --backend mlx"},
		{"prefill --model x --served-name m --listen :0 --metrics :1 --tensor 0/2", "go together"},
		{"prefill --model x --served-name m --listen :0 --metrics :1 --tensor 0/2 --tensor-peers a:1,b:2 --layers 0:1 --stage 0/2 --stage-listen :3 --stage-next :4", "not tensor-parallel"},
		{base + "--tensor 1/2 --tensor-peers a:1,b:2 --layers 2:4 --stage 1/2 --stage-listen :3", "only rank 0"},
		{base + "--tensor 1/2 --tensor-peers a:1,b:2 --layers 2:4 --stage 1/2 --stage-next :3", "only rank 0"},
		{base + "--tensor 1/2 --tensor-peers a:1,b:2 --stage 1/2", "needs --layers"},
		{base + "--tensor 0/2 --tensor-peers a:1,b:2 --layers 2:4 --stage 1/2 --stage-listen :3", "needs --stage-next"},
	} {
		_, err := parseRunnerFlags(strings.Fields(c.args))
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a usage error saying %q", c.args, err, c.want)
		}
	}
	f, err := parseRunnerFlags(strings.Fields(base + "--tensor 1/3 --tensor-peers a:1,b:2,c:3"))
	if err != nil || f.Tensor != "1/3" || f.TensorPeers != "a:1,b:2,c:3" {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields(base + "--tensor 0/2 --tensor-peers a:1,b:2 --layers 2:4 --stage 1/2 --stage-listen :3 --stage-next :4"))
	if err != nil || f.Tensor != "0/2" || f.Stage != 1 || f.StageListen != ":3" {
		t.Fatalf("a stage's rank 0: %+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields(base + "--tensor 1/2 --tensor-peers a:1,b:2 --layers 2:4 --stage 1/2"))
	if err != nil || f.Tensor != "1/2" || f.Stage != 1 || f.Layers.Start != 2 {
		t.Fatalf("a stage's rank 1: %+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("prefill --model x --served-name m --listen :0 --metrics :1 --tensor 1/2 --tensor-peers a:1,b:2"))
	if err != nil || f.Tensor != "1/2" {
		t.Fatalf("a tensor prefill rank: %+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields(base + `--backend mlx --tensor 1/2 --tensor-peers a:1,b:2 --tensor-rdma [[null,"rdma_en3"],["rdma_en4",null]]`))
	if err != nil || f.TensorRDMA != `[[null,"rdma_en3"],["rdma_en4",null]]` {
		t.Fatalf("--tensor-rdma: %+v %v", f, err)
	}
}

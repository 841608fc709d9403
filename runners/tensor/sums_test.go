package tensor

import (
	"fmt"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/backend"
	"github.com/prometheus/client_golang/prometheus"
)

// TestMLXSums: how a rank on MLX reports its all_sums: the backend chosen
// (chooseMLXBackend) and, where MLX fell back to its ring, the reason code
// of the backend asked for.
func TestMLXSums(t *testing.T) {
	mesh := RankConfig{Size: 2, RDMA: [][]string{{"", "a"}, {"b", ""}}}
	none := func(string) (bool, error) { return false, nil }
	all := func(string) (bool, error) { return true, nil }
	for _, tc := range []struct {
		name   string
		c      RankConfig
		cuda   bool
		avail  func(string) (bool, error)
		group  string
		reason string
	}{
		{"ring asked", RankConfig{Size: 2}, false, all, "ring", ""},
		{"jaccl", mesh, false, all, "jaccl", ""},
		{"jaccl missing", mesh, false, none, "ring", ReasonNoJACCL},
		{"nccl", RankConfig{Size: 2}, true, all, "nccl", ""},
		{"nccl missing", RankConfig{Size: 2}, true, none, "ring", ReasonNoNCCL},
	} {
		bk, why := chooseMLXBackend(tc.c, tc.cuda, tc.avail)
		s := mlxSums(bk, why, tc.cuda)
		if s.Group != tc.group || s.Reason != tc.reason || (s.Reason != "") != (s.Detail != "") {
			t.Errorf("%s: %+v, want group %q reason %q (with a detail when a reason)", tc.name, s, tc.group, tc.reason)
		}
	}
}

// TestCPUSums: a rank on the cpu backend sums over its tensor link: its
// Sums say "link" and exo_tensor_group has that one series.
func TestCPUSums(t *testing.T) {
	b, err := backend.Open("cpu", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c := RankConfig{Rank: 0, Size: 2, Peers: []string{"127.0.0.1:0", "127.0.0.1:0"}, Model: "m", Metrics: NewMetrics(reg)}
	r, err := Listen(c)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if s := r.Sums(); s != (Sums{}) {
		t.Fatalf("before the collective: %+v", s)
	}
	if _, err := r.Collective(c, b); err != nil {
		t.Fatal(err)
	}
	if s := r.Sums(); s != (Sums{Group: "link"}) {
		t.Fatalf("cpu rank: %+v, want link", s)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []string
	for _, f := range fams {
		if f.GetName() != "exo_tensor_group" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			series = append(series, fmt.Sprintf("%s/%s/%s/%s=%v", l["model"], l["rank"], l["group"], l["reason"], m.GetGauge().GetValue()))
		}
	}
	if len(series) != 1 || series[0] != "m/0/link/=1" {
		t.Errorf("exo_tensor_group: %v, want one series m/0/link/=1", series)
	}
}

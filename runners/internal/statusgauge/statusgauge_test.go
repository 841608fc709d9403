package statusgauge

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// series is the gauge's series as "label=value,…=value" of their labels.
func series(t *testing.T, reg prometheus.Gatherer) []string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if m.GetGauge().GetValue() != 1 {
				t.Fatalf("%s: a series of value %v, want 1", f.GetName(), m.GetGauge().GetValue())
			}
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			out = append(out, strings.Join(ls, ","))
		}
	}
	return out
}

// TestValue: the gauge holds one series (= 1) for the choice set last; a
// new choice replaces it, the same one keeps it, no gauge drops it, and
// Get reads the choice back.
func TestValue(t *testing.T) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x_choice", Help: "h"}, []string{"who", "what"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(g)
	var v Value[string]
	if v.Get() != "" {
		t.Fatalf("the zero Value holds %q", v.Get())
	}
	for _, step := range []struct {
		set, what string
		gauge     *prometheus.GaugeVec
		want      []string
	}{
		{"a", "a", g, []string{"what=a,who=s0"}},
		{"a", "a", g, []string{"what=a,who=s0"}},
		{"b", "b", g, []string{"what=b,who=s0"}},
		{"c", "c", nil, nil},
		{"d", "d", g, []string{"what=d,who=s0"}},
	} {
		var labels []string
		if step.gauge != nil {
			labels = []string{"s0", step.what}
		}
		v.Set(step.set, step.gauge, labels...)
		if got := series(t, reg); !slices.Equal(got, step.want) {
			t.Fatalf("after Set(%q): series %v, want %v", step.set, got, step.want)
		}
		if v.Get() != step.set {
			t.Fatalf("Get %q after Set(%q)", v.Get(), step.set)
		}
	}
}

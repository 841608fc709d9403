package config

import (
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/modelinfo"
)

// TestPrefillPipelinePlan: a pipeline prefill gives each of its hosts one
// prefill runner with contract C4's flags (ring in host order on
// base+10i+6), and every decode runner (a whole copy, or each stage of a
// decode pipeline) gets the stages' KV ports as ADDR@A:B with their
// /health addresses in the same order.
func TestPrefillPipelinePlan(t *testing.T) {
	even := func(string) (*modelinfo.Facts, error) { return facts(8, gib, gib, false), nil }
	tests := []struct {
		name    string
		model   string
		facts   FactsFunc
		runners map[string][][]string // host → each runner's expected flag pairs (flag, value; value "" = absent)
	}{
		{"split by hand, one decode host",
			`decode = { hosts = ["c"] }
prefill = { hosts = ["a", "b"], shard = "pipeline", layers = [3, 5] }`, nil,
			map[string][][]string{
				"a": {{"runner", "prefill", "--listen", "127.0.0.2:52501", "--layers", "0:3", "--stage", "0/2", "--stage-listen", "127.0.0.2:52506", "--stage-next", "127.0.0.3:52506", "--metrics", "127.0.0.2:52502"}},
				"b": {{"runner", "prefill", "--listen", "127.0.0.3:52501", "--layers", "3:8", "--stage", "1/2", "--stage-listen", "127.0.0.3:52506", "--stage-next", "127.0.0.2:52506", "--metrics", "127.0.0.3:52502"}},
				"c": {{"runner", "decode", "--prefill", "127.0.0.2:52501@0:3,127.0.0.3:52501@3:8", "--prefill-health", "127.0.0.2:52502,127.0.0.3:52502"}},
			}},
		{"split by placement (even), decode pipeline on the same hosts",
			`decode = { hosts = ["a", "b"], shard = "pipeline" }
prefill = { hosts = ["b", "c"], shard = "pipeline" }`, even,
			map[string][][]string{
				"a": {{"runner", "decode", "--layers", "0:4", "--stage", "0/2", "--stage-listen", "127.0.0.2:52503", "--prefill", "127.0.0.3:52501@0:4,127.0.0.4:52501@4:8", "--prefill-health", "127.0.0.3:52502,127.0.0.4:52502"}},
				"b": {
					{"runner", "decode", "--layers", "4:8", "--stage", "1/2", "--stage-listen", "127.0.0.3:52503", "--stage-next", "127.0.0.2:52503", "--prefill", "127.0.0.3:52501@0:4,127.0.0.4:52501@4:8"},
					{"runner", "prefill", "--listen", "127.0.0.3:52501", "--layers", "0:4", "--stage", "0/2", "--stage-listen", "127.0.0.3:52506", "--stage-next", "127.0.0.4:52506"},
				},
				"c": {{"runner", "prefill", "--layers", "4:8", "--stage", "1/2", "--stage-listen", "127.0.0.4:52506", "--stage-next", "127.0.0.3:52506"}},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("f.toml", []byte(threeHosts+"\n[[models]]\nname = \"m\"\nsource = \"s\"\n"+tt.model+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if tt.facts != nil {
				ps, err := c.Place(tt.facts, "a", 0)
				if err != nil {
					t.Fatal(err)
				}
				var sb strings.Builder
				WritePlacement(&sb, ps)
				if !strings.Contains(sb.String(), "model m prefill: pipeline over 2 hosts (b, c)") || !strings.Contains(sb.String(), "stage 1  host c            layers   4:8") {
					t.Errorf("config check table:\n%s", sb.String())
				}
			}
			for host, want := range tt.runners {
				rs := c.Runners(host)
				if len(rs) != len(want) {
					t.Fatalf("host %s: %d runners %+v, want %d", host, len(rs), rs, len(want))
				}
				for i, w := range want {
					args := rs[i].Args()
					if !slices.Equal(args[:2], w[:2]) {
						t.Errorf("host %s runner %d: %v, want %v", host, i, args, w[:2])
						continue
					}
					for j := 2; j+1 < len(w); j += 2 {
						k := slices.Index(args, w[j])
						if k < 0 || k+1 >= len(args) || args[k+1] != w[j+1] {
							t.Errorf("host %s runner %s: %s = ?, want %s in %v", host, rs[i].Name, w[j], w[j+1], args)
						}
					}
				}
			}
		})
	}
}

// TestPrefillPipelineRefused: what the plan refuses of a pipeline prefill,
// each at its key's file:line:col.
func TestPrefillPipelineRefused(t *testing.T) {
	even := func(string) (*modelinfo.Facts, error) { return facts(8, gib, gib, false), nil }
	tests := []struct {
		name, model, extra, want string
	}{
		{"stage link port taken", `decode = { hosts = ["c"] }
prefill = { hosts = ["a", "b"], shard = "pipeline", layers = [4, 4] }`, `
[[models]]
name = "n"
source = "s"
decode = { hosts = ["a"], port = 52506 }`,
			`f.toml:25:27: two runners on one port: model m prefill stage link and model n decode both use port 52506 on host a`},
		{"layers do not sum", `decode = { hosts = ["c"] }
prefill = { hosts = ["a", "b"], shard = "pipeline", layers = [4, 5] }`, "",
			`f.toml:20:1: model m: prefill: layers sum to 9 but the model has 8 layers`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("f.toml", []byte(threeHosts+"\n[[models]]\nname = \"m\"\nsource = \"s\"\n"+tt.model+"\n"+tt.extra))
			if err == nil {
				_, err = c.Place(even, "a", 0)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v\nwant %s", err, tt.want)
			}
		})
	}
}

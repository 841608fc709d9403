package dashboard

import (
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/internal/modelinfo"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// TestModelsPlacement: a model's state carries its placement per pipeline
// group (stages, layer ranges, the memory each host counted); a group whose
// split waits for a host's memory lists its stages as "waiting" with the
// reason, the placed group its stage runners with their layer ranges.
func TestModelsPlacement(t *testing.T) {
	c, err := config.Parse("f.toml", []byte(`[cluster]
insecure = true
[hosts.a]
address = "127.0.0.2"
backend = "cpu"
[hosts.b]
address = "127.0.0.3"
backend = "cpu"
[hosts.c]
address = "127.0.0.4"
backend = "cpu"
[hosts.d]
address = "127.0.0.5"
backend = "cpu"
[[models]]
name = "m"
source = "s"
decode = { groups = [["a", "b"], ["c", "d"]], shard = "pipeline" }
`))
	if err != nil {
		t.Fatal(err)
	}
	facts := func(string) (*modelinfo.Facts, error) {
		f := &modelinfo.Facts{Layers: 8, LayerBytes: make([]int64, 8), KVLayer: make([]bool, 8), Heads: 4, KVHeads: 2, HeadDim: 8, KVElemBytes: 2}
		for i := range f.LayerBytes {
			f.LayerBytes[i] = 1 << 30
		}
		return f, nil
	}
	if _, err := c.PlaceWith(facts, config.PlaceOptions{LocalHost: "a", Wait: true,
		Reported: map[string]config.HostMemory{"a": {Total: 40 << 30}, "b": {Total: 104 << 30}, "c": {Total: 40 << 30}}}); err != nil {
		t.Fatal(err)
	}
	ms := models(c, nil)
	if len(ms) != 1 || len(ms[0].Placements) != 2 || ms[0].Decode != 4 {
		t.Fatalf("models %+v", ms)
	}
	if p := ms[0].Placements[0]; p.Group != 0 || p.Groups != 2 || len(p.Stages) != 2 || p.Memory[1].Source != config.MemReported {
		t.Errorf("group 0's placement %+v", p)
	}
	if p := ms[0].Placements[1]; p.Stages != nil || !slices.Equal(p.Waiting, []string{"d"}) {
		t.Errorf("group 1's placement %+v", p)
	}
	var got []string
	for _, r := range ms[0].Runners {
		got = append(got, r.Host+" "+r.Runner+" "+r.State+" "+r.Stage+" "+r.Layers)
	}
	want := []string{"a m-decode-group0-stage0 unknown 0/2 0:2", "b m-decode-group0-stage1 unknown 1/2 2:8",
		"c m-decode-group1-stage0 waiting 0/2 ", "d m-decode-group1-stage1 waiting 1/2 "}
	if !slices.Equal(got, want) {
		t.Errorf("runners\n%q\nwant\n%q", got, want)
	}
	if r := ms[0].Runners[3]; r.LastError == "" {
		t.Errorf("a waiting stage without its reason: %+v", r)
	}
}

package supervisor

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/dashboard"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

// writeHeaderOnlyModel writes a model directory whose config.json and
// safetensors header describe layers layers of layerBytes each (the data
// zeros): enough for placement, which reads only headers.
func writeHeaderOnlyModel(t *testing.T, layers int, layerBytes int64) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","num_hidden_layers":%d,"hidden_size":64,
"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":128,"max_position_embeddings":256,"torch_dtype":"bfloat16"}`, layers)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	hdr := map[string]any{}
	var off int64
	add := func(name string, n int64) {
		hdr[name] = map[string]any{"dtype": "U8", "shape": []int64{n}, "data_offsets": []int64{off, off + n}}
		off += n
	}
	add("model.embed_tokens.weight", 4096)
	for i := range layers {
		add(fmt.Sprintf("model.layers.%d.mlp.up_proj.weight", i), layerBytes)
	}
	add("model.norm.weight", 128)
	add("lm_head.weight", 4096)
	j, _ := json.Marshal(hdr)
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(j)))
	b = append(append(b, j...), make([]byte, off)...)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func pipelineFile(base int, src, split string) string {
	return fmt.Sprintf(`[cluster]
name = "t"
insecure = true
runner_port_base = %d

[hosts.a]
address = "127.0.0.2"
backend = "cpu"
memory_gib = 1

[hosts.b]
address = "127.0.0.3"
backend = "cpu"
memory_gib = 1

[[models]]
name = "m"
source = %q
decode = { hosts = ["a", "b"], shard = "pipeline"%s }
`, base, src, split)
}

// TestPipelineStagesAcrossTwoSupervisors runs two supervisors (hosts a and
// b on 127.0.0.2 and 127.0.0.3) with fake runners: each runs its stage with
// contract C1's flags, split by memory from the model's headers; both
// gateways send requests to stage 0 only; a new split restarts both stages.
func TestPipelineStagesAcrossTwoSupervisors(t *testing.T) {
	base := freePort(t)
	src := writeHeaderOnlyModel(t, 6, 1<<10)
	file := pipelineFile(base, src, "")
	sups := map[string]*harness{}
	for _, host := range []string{"a", "b"} {
		sups[host] = startOpts(t, file, 50*time.Millisecond, true, func(o *Options) { o.Host = host })
	}
	want := map[string][]string{
		"a": {"m-decode-stage0", "--layers", "0:3", "--stage", "0/2", "--stage-listen", fmt.Sprintf("127.0.0.2:%d", base+3), "--stage-next", fmt.Sprintf("127.0.0.3:%d", base+3)},
		"b": {"m-decode-stage1", "--layers", "3:6", "--stage", "1/2", "--stage-listen", fmt.Sprintf("127.0.0.3:%d", base+3), "--stage-next", fmt.Sprintf("127.0.0.2:%d", base+3)},
	}
	first := map[string]int{}
	for host, h := range sups {
		st := h.status()
		if len(st.Runners) != 1 || st.Runners[0].Spec.Name != want[host][0] || st.Runners[0].Status.State != process.Ready {
			t.Fatalf("host %s runs %+v", host, st.Runners)
		}
		args := st.Runners[0].Spec.Args()
		i := slices.Index(args, "--layers")
		if i < 0 || !slices.Equal(args[i:i+8], want[host][1:]) {
			t.Fatalf("host %s: %v, want %v", host, args, want[host][1:])
		}
		first[host] = st.Runners[0].Status.PID
	}
	// The cluster state (dashboard, exo status) shows each stage's range.
	var cs dashboard.State
	if err := json.Unmarshal([]byte(sups["a"].get(dashboard.StatePath)), &cs); err != nil || len(cs.Models) != 1 {
		t.Fatalf("state: %v %+v", err, cs)
	}
	var got []string
	for _, r := range cs.Models[0].Runners {
		got = append(got, r.Host+" "+r.Stage+" "+r.Layers)
	}
	if !slices.Equal(got, []string{"a 0/2 0:3", "b 1/2 3:6"}) {
		t.Errorf("state's stages %v", got)
	}
	// Both gateways forward to stage 0 on a, never to b's later stage (which
	// the fake runner would answer, unlike a real one).
	for host, h := range sups {
		for range 4 {
			resp, err := http.Post("http://"+h.api+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("X-Exo-Runner") != "a/m-decode-stage0" {
				t.Fatalf("via %s: %d %s from %q", host, resp.StatusCode, b, resp.Header.Get("X-Exo-Runner"))
			}
		}
	}
	// A split by hand moves a layer: both stages restart, each with its
	// new range.
	for _, h := range sups {
		prev := h.status().LastReload.At
		h.write(pipelineFile(base, src, ", layers = [2, 4]"))
		st := h.waitReload(prev)
		if !st.LastReload.OK {
			t.Fatalf("reload: %+v", st.LastReload)
		}
	}
	for host, h := range sups {
		st := h.status()
		r := st.Runners[0]
		wantLayers := map[string]string{"a": "0:2", "b": "2:6"}[host]
		if r.Spec.Layers != wantLayers || r.Status.PID == first[host] || r.Status.State != process.Ready {
			t.Errorf("host %s after the new split: layers %s pid %d (was %d) state %s", host, r.Spec.Layers, r.Status.PID, first[host], r.Status.State)
		}
	}
}

func TestProbe(t *testing.T) {
	h := start(t, clusterFile(freePort(t), "a=src-a"))
	for q, want := range map[string]int{"bytes=100000": 200, "bytes=0": 400, "bytes=x": 400, fmt.Sprintf("bytes=%d", MaxProbeBytes+1): 400} {
		resp, err := http.Get("http://" + h.api + ProbePath + "?" + q)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 200 && (len(b) != 100000 || strings.Trim(string(b), "\x00") != "")) {
			t.Errorf("%s: %d, %d bytes; want %d", q, resp.StatusCode, len(b), want)
		}
	}
}

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// stageHub serves one repository the way the Hugging Face Hub does for
// the parts exo's downloader uses (the model-info API with sizes and
// sha256s, /resolve/ with Range requests) and counts the body bytes it
// sends per file.
type stageHub struct {
	repo   string
	commit string
	files  map[string][]byte
	mu     sync.Mutex
	served map[string]int64
}

func (h *stageHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, "/")
	if rest, ok := strings.CutPrefix(p, "api/models/"+h.repo+"/revision/"); ok && rest != "" {
		type lfs struct {
			SHA256 string `json:"sha256"`
			Size   int    `json:"size"`
		}
		type sib struct {
			RFilename string `json:"rfilename"`
			Size      int    `json:"size"`
			LFS       lfs    `json:"lfs"`
		}
		var sibs []sib
		for n, b := range h.files {
			s := sha256.Sum256(b)
			sibs = append(sibs, sib{n, len(b), lfs{hex.EncodeToString(s[:]), len(b)}})
		}
		json.NewEncoder(w).Encode(map[string]any{"sha": h.commit, "siblings": sibs})
		return
	}
	name, ok := strings.CutPrefix(p, h.repo+"/resolve/"+h.commit+"/")
	b, found := h.files[name]
	if !ok || !found {
		http.NotFound(w, r)
		return
	}
	cw := &countingWriter{ResponseWriter: w}
	http.ServeContent(cw, r, name, time.Time{}, bytes.NewReader(b))
	h.mu.Lock()
	h.served[name] += cw.n
	h.mu.Unlock()
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

var shardLayerRE = regexp.MustCompile(`(?:^|\.)layers\.(\d+)\.`)

// perLayerRepo is the tiny model of spec as a Hub repository sharded one
// file per layer (embed.safetensors, layer-N.safetensors,
// head.safetensors), with its shard index and the metadata files of dir
// (where testmodel.Write put the same model whole).
func perLayerRepo(t *testing.T, dir string, spec testmodel.Spec) map[string][]byte {
	t.Helper()
	tensors, err := testmodel.Tensors(spec)
	if err != nil {
		t.Fatal(err)
	}
	shards := map[string][]engine.Tensor{}
	index := map[string]string{}
	for _, x := range tensors {
		shard := "embed.safetensors"
		switch m := shardLayerRE.FindStringSubmatch(x.Name); {
		case m != nil:
			shard = "layer-" + m[1] + ".safetensors"
		case strings.Contains(x.Name, "lm_head") || strings.HasSuffix(x.Name, "model.norm.weight"):
			shard = "head.safetensors"
		}
		shards[shard] = append(shards[shard], x)
		index[x.Name] = shard
	}
	files := map[string][]byte{}
	for name, ts := range shards {
		var b bytes.Buffer
		if err := weights.WriteSafetensors(&b, ts, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
		files[name] = b.Bytes()
	}
	ix, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": index})
	files["model.safetensors.index.json"] = ix
	for _, n := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	return files
}

// TestPipelineStagesDownloadOnlyTheirShards: the two stages of a pipeline
// (real exo processes), each with its own model store and the model's
// Hugging Face id as source, download from a Hub (real HTTP) only the
// shards holding their layers — stage 0 the embedding and layer 0, stage 1
// layers 1 and 2 and the head, every shard once over both — and the
// pipeline answers as one runner on the whole model does.
func TestPipelineStagesDownloadOnlyTheirShards(t *testing.T) {
	spec := testmodel.Spec{Arch: "llama", Seed: 19, Layers: 3, MaxPositions: 4096}
	full := filepath.Join(t.TempDir(), "full")
	if err := testmodel.Write(full, spec); err != nil {
		t.Fatal(err)
	}
	hub := &stageHub{repo: "org/tiny", commit: strings.Repeat("5e", 20), files: perLayerRepo(t, full, spec), served: map[string]int64{}}
	srv := httptest.NewServer(hub)
	t.Cleanup(srv.Close)
	t.Setenv("HF_ENDPOINT", srv.URL) // the stage processes inherit it

	one := start(t, "one", "decode", "--model", full)
	reqs := pipelineRequests()
	want := askAll(t, one.listen, reqs, false)
	one.stop()

	bounds := []int{0, 1, 3}
	base := testutil.Ports(t, 4)
	links := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)}
	stores := []string{t.TempDir(), t.TempDir()}
	var stages []*proc
	for i := range 2 {
		stages = append(stages, launchStage(t, "dl", "org/tiny", i, bounds, links, fmt.Sprintf("127.0.0.1:%d", base+2+i),
			[]string{"--offline=false", "--models-dir", stores[i]}))
	}
	waitHealthy(t, stages...)
	got := askAll(t, stages[0].listen, reqs, false)
	for i := range want {
		if got[i].Text != want[i].Text {
			t.Errorf("request %d: pipeline from per-stage downloads %q, one runner %q", i, got[i].Text, want[i].Text)
		}
	}

	snapshot := func(store string) []string {
		var names []string
		matches, _ := filepath.Glob(filepath.Join(store, "org", "tiny", "snapshots", "*", "*.safetensors"))
		for _, m := range matches {
			names = append(names, filepath.Base(m))
		}
		return names
	}
	for i, wantFiles := range [][]string{
		{"embed.safetensors", "layer-0.safetensors"},
		{"head.safetensors", "layer-1.safetensors", "layer-2.safetensors"},
	} {
		if got := snapshot(stores[i]); fmt.Sprint(got) != fmt.Sprint(wantFiles) {
			t.Errorf("stage %d's store holds %v, want %v", i, got, wantFiles)
		}
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	for name, b := range hub.files {
		if strings.HasSuffix(name, ".safetensors") && hub.served[name] != int64(len(b)) {
			t.Errorf("%s: the Hub sent %d bytes over both stages, its size is %d", name, hub.served[name], len(b))
		}
	}
}

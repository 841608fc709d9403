package hf

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// LayerRange is a pipeline stage's layers [Start, End) of a model
// (0-based, half-open). The zero value is the whole model.
type LayerRange struct{ Start, End int }

// IsZero reports whether r is the whole model.
func (r LayerRange) IsZero() bool { return r == LayerRange{} }

func (r LayerRange) String() string { return fmt.Sprintf("%d:%d", r.Start, r.End) }

// ParseLayers parses "a:b", a stage's layers [a, b) (0 ≤ a < b).
func ParseLayers(s string) (LayerRange, error) {
	as, bs, ok := strings.Cut(s, ":")
	a, err1 := strconv.Atoi(as)
	b, err2 := strconv.Atoi(bs)
	if !ok || err1 != nil || err2 != nil || a < 0 || b <= a {
		return LayerRange{}, fmt.Errorf("hf: layers %q: want A:B with 0 ≤ A < B (layers [A, B) of the model)", s)
	}
	return LayerRange{a, b}, nil
}

// layerRE finds a block's index in a tensor name: "model.layers.12.…",
// "model.language_model.layers.3.…".
var layerRE = regexp.MustCompile(`(?:^|\.)layers\.(\d+)\.`)

// finalNormRE is the final norm: a "norm" module outside the blocks
// ("model.norm.weight", "model.language_model.norm.weight").
var finalNormRE = regexp.MustCompile(`(?:^|\.)norm\.(?:weight|bias)$`)

// embedRE is the token embedding (what a tied LM head reads).
var embedRE = regexp.MustCompile(`embed_tokens|(?:^|\.)wte\.|tok_embeddings|word_embeddings`)

// tensorPart says which stages need a tensor of a model with n layers:
// layer ≥ 0 for a block's tensor (layers ≥ n, such as a multi-token
// prediction block after the last, are needed by none), else one of the
// parts below.
type tensorPart int

const (
	partNone  tensorPart = -1 // needed by no stage (MTP weights)
	partFirst tensorPart = -2 // the embedding and whatever else sits outside the blocks (a vision tower)
	partLast  tensorPart = -3 // the LM head and the final norm
)

func classify(name string) (layer int, part tensorPart) {
	if m := layerRE.FindStringSubmatch(name); m != nil {
		l, err := strconv.Atoi(m[1])
		if err == nil {
			return l, 0
		}
	}
	switch {
	case strings.HasPrefix(name, "mtp.") || strings.Contains(name, ".mtp."):
		return -1, partNone
	case strings.Contains(name, "lm_head"), finalNormRE.MatchString(name):
		return -1, partLast
	}
	return -1, partFirst
}

// layerCount reads the model's block count from config.json
// (num_hidden_layers, at the top or in text_config as multimodal configs
// put it).
func layerCount(config []byte) (int, error) {
	var c struct {
		N    int `json:"num_hidden_layers"`
		Text *struct {
			N int `json:"num_hidden_layers"`
		} `json:"text_config"`
		NLayer int `json:"n_layer"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return 0, fmt.Errorf("hf: config.json: %w", err)
	}
	switch {
	case c.N > 0:
		return c.N, nil
	case c.Text != nil && c.Text.N > 0:
		return c.Text.N, nil
	case c.NLayer > 0:
		return c.NLayer, nil
	}
	return 0, fmt.Errorf("hf: config.json has no num_hidden_layers: cannot tell which files hold which layers")
}

// stageFiles returns the safetensors files (repository paths) a stage of
// layers r needs, from the model's config.json and shard index: every file
// holding a tensor of one of its layers; with the first layer, the files
// holding the embedding and the other tensors outside the blocks; with the
// last, those holding the final norm and the LM head, and the embedding's
// too when the head is tied to it (the index has no lm_head).
func stageFiles(config, index []byte, r LayerRange) (map[string]bool, error) {
	n, err := layerCount(config)
	if err != nil {
		return nil, err
	}
	if r.End > n {
		return nil, fmt.Errorf("hf: layers %v of a %d-layer model", r, n)
	}
	var ix struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(index, &ix); err != nil {
		return nil, fmt.Errorf("hf: model.safetensors.index.json: %w", err)
	}
	tied := true
	for name := range ix.WeightMap {
		if strings.Contains(name, "lm_head") {
			tied = false
		}
	}
	need := map[string]bool{}
	for name, file := range ix.WeightMap {
		l, part := classify(name)
		var want bool
		switch {
		case l >= 0:
			want = l >= r.Start && l < r.End
		case part == partFirst:
			want = r.Start == 0 || r.End == n && tied && embedRE.MatchString(name)
		case part == partLast:
			want = r.End == n
		}
		if want {
			need[path.Clean(file)] = true
		}
	}
	if len(need) == 0 {
		return nil, fmt.Errorf("hf: the shard index names no tensor of layers %v", r)
	}
	return need, nil
}

// filterByLayers keeps the weight files a stage of layers r needs
// (stageFiles over the snapshot's config.json and index), taking the
// others out of the progress total.
func filterByLayers(dir string, weights []repoFile, r LayerRange, prog *progress) ([]repoFile, error) {
	need, err := stageFilesIn(dir, r)
	if err != nil {
		return nil, err
	}
	var out []repoFile
	for _, w := range weights {
		if need[w.Name] {
			out = append(out, w)
		} else {
			prog.addTotal(-w.Size)
		}
	}
	return out, nil
}

// stageFilesIn is stageFiles over the files of a snapshot directory.
func stageFilesIn(dir string, r LayerRange) (map[string]bool, error) {
	config, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	index, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	return stageFiles(config, index, r)
}

// sortedKeys lists a set's members in order (for messages and tests).
func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

package modelinfo

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// maxHeader bounds a safetensors JSON header (the format's own limit is
// 100 MB).
const maxHeader = 100 << 20

// maxOffset bounds a tensor's data offsets (64 PiB: far past any file), so
// sums of tensor sizes cannot overflow.
const maxOffset = 1 << 56

// Tensor is one tensor's name and its size in the file.
type Tensor struct {
	Name  string
	Bytes int64
}

// ParseSafetensorsHeader parses a safetensors file's start (the 8-byte
// little-endian header length, then the JSON header; anything after it is
// ignored) into its tensors, sorted by name.
func ParseSafetensorsHeader(b []byte) ([]Tensor, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: safetensors: %d bytes, want at least 8", ErrFormat, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeader || n > uint64(len(b)-8) {
		return nil, fmt.Errorf("%w: safetensors: header of %d bytes (have %d, limit %d)", ErrFormat, n, len(b)-8, maxHeader)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("%w: safetensors header: %v", ErrFormat, err)
	}
	out := make([]Tensor, 0, len(raw))
	for name, v := range raw {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			DType   string   `json:"dtype"`
			Shape   []uint64 `json:"shape"`
			Offsets []int64  `json:"data_offsets"`
		}
		if err := json.Unmarshal(v, &t); err != nil {
			return nil, fmt.Errorf("%w: safetensors tensor %q: %v", ErrFormat, name, err)
		}
		if len(t.Offsets) != 2 || t.Offsets[0] < 0 || t.Offsets[1] < t.Offsets[0] || t.Offsets[1] > maxOffset {
			return nil, fmt.Errorf("%w: safetensors tensor %q: data_offsets %v", ErrFormat, name, t.Offsets)
		}
		out = append(out, Tensor{name, t.Offsets[1] - t.Offsets[0]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// readSafetensorsHeader reads only the header of the file at path.
func readSafetensorsHeader(path string) ([]Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("modelinfo: %w", err)
	}
	defer f.Close()
	var lb [8]byte
	if _, err := io.ReadFull(f, lb[:]); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrFormat, path, err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n > maxHeader {
		return nil, fmt.Errorf("%w: %s: safetensors header of %d bytes (limit %d)", ErrFormat, path, n, maxHeader)
	}
	b := make([]byte, 8+n)
	copy(b, lb[:])
	if _, err := io.ReadFull(f, b[8:]); err != nil {
		return nil, fmt.Errorf("%w: %s: header: %v", ErrFormat, path, err)
	}
	ts, err := ParseSafetensorsHeader(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, nil
}

var hfLayerRe = regexp.MustCompile(`(?:^|\.)(?:layers|h|blocks)\.(\d+)\.`)

// hfKind sorts a safetensors tensor name: its layer index (-1: none) and,
// outside the layers, what it is.
func hfKind(name string) (int, tensorKind) {
	if m := hfLayerRe.FindStringSubmatch(name); m != nil {
		if i, err := strconv.Atoi(m[1]); err == nil {
			return i, kindOther
		}
	}
	switch {
	case strings.Contains(name, "embed_tokens") || strings.Contains(name, "wte."):
		return -1, kindEmbed
	case strings.Contains(name, "lm_head"):
		return -1, kindHead
	case strings.Contains(name, "norm"):
		return -1, kindNorm
	}
	return -1, kindOther
}

// hfConfig is the part of config.json read here.
type hfConfig struct {
	Architectures    []string  `json:"architectures"`
	ModelType        string    `json:"model_type"`
	Layers           *int      `json:"num_hidden_layers"`
	Hidden           *int      `json:"hidden_size"`
	Heads            *int      `json:"num_attention_heads"`
	KVHeads          *int      `json:"num_key_value_heads"`
	HeadDim          *int      `json:"head_dim"`
	Intermediate     *int      `json:"intermediate_size"`
	MoEIntermediate  *int      `json:"moe_intermediate_size"`
	NumExperts       *int      `json:"num_experts"`
	NumLocalExperts  *int      `json:"num_local_experts"`
	NRoutedExperts   *int      `json:"n_routed_experts"`
	MaxPositions     *int      `json:"max_position_embeddings"`
	TorchDType       string    `json:"torch_dtype"`
	DType            string    `json:"dtype"`
	FullAttnInterval *int      `json:"full_attention_interval"`
	Quantization     *hfQuant  `json:"quantization"`
	QuantConfig      *hfQuant  `json:"quantization_config"`
	SharedExpert     *int      `json:"shared_expert_intermediate_size"`
	SparseStep       *int      `json:"decoder_sparse_step"`
	MLPOnlyLayers    []int     `json:"mlp_only_layers"`
	LinearKeyHeads   *int      `json:"linear_num_key_heads"`
	LinearValueHeads *int      `json:"linear_num_value_heads"`
	LinearValueDim   *int      `json:"linear_value_head_dim"`
	LayerTypes       []string  `json:"layer_types"`
	SlidingWindow    *int      `json:"sliding_window"`
	UseSlidingWindow *bool     `json:"use_sliding_window"`
	MaxWindowLayers  *int      `json:"max_window_layers"`
	SlidingPattern   *int      `json:"sliding_window_pattern"`
	TextConfig       *hfConfig `json:"text_config"`
}

type hfQuant struct {
	Bits      int `json:"bits"`
	GroupSize int `json:"group_size"`
}

func val(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// parseHFConfig fills f's shape from config.json bytes.
func parseHFConfig(data []byte, f *Facts) error {
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("%w: config.json: %v", ErrFormat, err)
	}
	if c.Layers == nil && c.TextConfig != nil {
		arch := c.Architectures
		c = *c.TextConfig
		if len(c.Architectures) == 0 {
			c.Architectures = arch
		}
	}
	if len(c.Architectures) > 0 {
		f.Arch = c.Architectures[0]
	} else {
		f.Arch = c.ModelType
	}
	f.Layers, f.Hidden, f.Heads = val(c.Layers), val(c.Hidden), val(c.Heads)
	if f.Layers < 0 || f.Layers > 1<<16 {
		return fmt.Errorf("%w: config.json: num_hidden_layers %d", ErrFormat, f.Layers)
	}
	f.KVHeads = f.Heads
	if c.KVHeads != nil {
		f.KVHeads = *c.KVHeads
	}
	f.HeadDim = val(c.HeadDim)
	if f.HeadDim == 0 && f.Heads > 0 {
		f.HeadDim = f.Hidden / f.Heads
	}
	f.Intermediate, f.MoEIntermediate = val(c.Intermediate), val(c.MoEIntermediate)
	f.Experts = max(val(c.NumExperts), val(c.NumLocalExperts), val(c.NRoutedExperts))
	f.MaxContext = val(c.MaxPositions)
	f.SharedExpertIntermediate = val(c.SharedExpert)
	f.LinearKeyHeads, f.LinearValueHeads, f.LinearValueDim = val(c.LinearKeyHeads), val(c.LinearValueHeads), val(c.LinearValueDim)
	if q := c.Quantization; q == nil {
		c.Quantization = c.QuantConfig
	}
	if q := c.Quantization; q != nil && q.Bits > 0 {
		f.QuantGroup = q.GroupSize
	}
	step := max(val(c.SparseStep), 1)
	for i := range max(f.Layers, 0) {
		if f.Experts > 0 && !slices.Contains(c.MLPOnlyLayers, i) && (i+1)%step == 0 {
			f.SparseMLP = true
		} else {
			f.DenseMLP = true
		}
	}
	// The engine's cache takes the model's dtype: f32 for f32 weights (and
	// a dense config without a dtype), bf16 for bf16 and quantized ones.
	d := c.TorchDType
	if d == "" {
		d = c.DType
	}
	f.KVElemBytes = 2
	if (d == "float32" || d == "") && c.Quantization == nil && c.QuantConfig == nil {
		f.KVElemBytes = 4
	}
	f.KVLayer = make([]bool, f.Layers)
	for i := range f.KVLayer {
		kv := true
		if k := val(c.FullAttnInterval); k > 0 {
			kv = (i+1)%k == 0
		}
		if i < len(c.LayerTypes) && strings.Contains(c.LayerTypes[i], "linear") {
			kv = false
		}
		f.KVLayer[i] = kv
	}
	f.Window = hfWindows(&c, f.Layers)
	return nil
}

// hfWindows applies the engine's sliding-window rules to a config: Gemma 3
// (layer_types, else every layer but each sliding_window_pattern-th, default
// 6) and gpt-oss (layer_types) slide their "sliding_attention" layers;
// Mistral slides every layer over sliding_window; Qwen2, Qwen3 and
// Qwen3-MoE only with use_sliding_window, from max_window_layers (default 28) on or as
// layer_types says; other families attend fully.
func hfWindows(c *hfConfig, layers int) []int {
	w := make([]int, max(layers, 0))
	win := val(c.SlidingWindow)
	if win <= 0 {
		return w
	}
	arch := c.ModelType
	if len(c.Architectures) > 0 {
		arch = c.Architectures[0]
	}
	typed := func() {
		for i := range w {
			if i < len(c.LayerTypes) && c.LayerTypes[i] == "sliding_attention" {
				w[i] = win
			}
		}
	}
	switch {
	case strings.HasPrefix(arch, "Gemma3"):
		if len(c.LayerTypes) == layers {
			typed()
			break
		}
		p := 6
		if c.SlidingPattern != nil && *c.SlidingPattern > 0 {
			p = *c.SlidingPattern
		}
		for i := range w {
			if (i+1)%p != 0 {
				w[i] = win
			}
		}
	case strings.HasPrefix(arch, "GptOss"):
		typed()
	case strings.HasPrefix(arch, "Mistral"):
		for i := range w {
			w[i] = win
		}
	case arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM":
		if c.UseSlidingWindow == nil || !*c.UseSlidingWindow {
			break
		}
		from := 28
		if c.MaxWindowLayers != nil {
			from = *c.MaxWindowLayers
		}
		for i := range w {
			slide := i >= from
			if c.LayerTypes != nil && i < len(c.LayerTypes) {
				slide = c.LayerTypes[i] == "sliding_attention"
			}
			if slide {
				w[i] = win
			}
		}
	}
	return w
}

// readDir reads an HF model directory: config.json and the headers of its
// safetensors files (those the index names, else every *.safetensors).
func readDir(dir string) (*Facts, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("modelinfo: %w", err)
	}
	f := &Facts{Format: "safetensors"}
	if err := parseHFConfig(data, f); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	f.LayerBytes = make([]int64, f.Layers)
	files, err := weightFiles(dir)
	if err != nil {
		return nil, err
	}
	for _, name := range files {
		ts, err := readSafetensorsHeader(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			layer, kind := hfKind(t.Name)
			f.add(layer, kind, t.Bytes)
		}
	}
	f.Tied = f.HeadBytes == 0
	return f, nil
}

func weightFiles(dir string) ([]string, error) {
	idx, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err == nil {
		var ix struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(idx, &ix); err != nil {
			return nil, fmt.Errorf("%w: %s: model.safetensors.index.json: %v", ErrFormat, dir, err)
		}
		var files []string
		for _, f := range ix.WeightMap {
			if f != filepath.Base(f) || !strings.HasSuffix(f, ".safetensors") {
				return nil, fmt.Errorf("%w: %s: index names %q", ErrFormat, dir, f)
			}
			if !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
		sort.Strings(files)
		return files, nil
	}
	m, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(m) == 0 {
		return nil, fmt.Errorf("modelinfo: %s: no safetensors files", dir)
	}
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	sort.Strings(m)
	return m, nil
}

package weights

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Open opens a model as an engine.Source: an HF safetensors directory (a
// single model.safetensors, several *.safetensors, or shards named by
// model.safetensors.index.json), or a .gguf file. Weights are memory-mapped.
func Open(path string) (engine.Source, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open weights: %w", err)
	}
	if !st.IsDir() {
		if IsGGUF(path) {
			return OpenGGUFSource(path)
		}
		if strings.HasSuffix(path, ".safetensors") || filepath.Base(path) == "config.json" {
			return OpenDir(filepath.Dir(path))
		}
		return nil, fmt.Errorf("open weights %s: neither a directory nor a GGUF file", path)
	}
	return OpenDir(path)
}

// IsGGUF reports whether path is a readable file that starts with the GGUF
// magic (the tokenizer and chat template loaders ask the same question).
func IsGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return false
	}
	return string(magic[:]) == "GGUF"
}

// dirSource is an HF safetensors directory.
type dirSource struct {
	dir    string
	config []byte
	files  []*safetensorsFile
	where  map[string]*safetensorsFile
	names  []string
	quant  quantConfig
	// absent maps the tensors of shards the index names but the
	// directory lacks (a pipeline stage's download, runners/hf
	// Options.Layers) to their shard: asking for one is an error naming it.
	absent map[string]string
}

// quantConfig is config.json's "quantization" block (MLX): a default
// group_size/bits plus per-module overrides (an object, or false for a
// module left dense).
type quantConfig struct {
	def       engine.QuantSpec
	overrides map[string]engine.QuantSpec
}

func parseQuantConfig(config []byte) (quantConfig, error) {
	var c struct {
		Quantization       map[string]json.RawMessage `json:"quantization"`
		QuantizationConfig map[string]json.RawMessage `json:"quantization_config"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return quantConfig{}, fmt.Errorf("config.json: %w", err)
	}
	q := c.Quantization
	if q == nil {
		q = c.QuantizationConfig
	}
	var out quantConfig
	if q == nil {
		return out, nil
	}
	var spec struct {
		GroupSize int `json:"group_size"`
		Bits      int `json:"bits"`
	}
	if v, ok := q["group_size"]; ok {
		if err := json.Unmarshal(v, &spec.GroupSize); err != nil {
			return out, fmt.Errorf("config.json: quantization.group_size: %w", err)
		}
	}
	if v, ok := q["bits"]; ok {
		if err := json.Unmarshal(v, &spec.Bits); err != nil {
			return out, fmt.Errorf("config.json: quantization.bits: %w", err)
		}
	}
	mode, err := checkQuantMode(q["mode"])
	if err != nil {
		return out, fmt.Errorf("config.json: quantization: %w", err)
	}
	out.def = engine.QuantSpec{Bits: spec.Bits, GroupSize: spec.GroupSize, Mode: mode}
	out.overrides = map[string]engine.QuantSpec{}
	for k, v := range q {
		if k == "group_size" || k == "bits" {
			continue
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.Equal(v, []byte("false")):
			out.overrides[k] = engine.QuantSpec{}
		case len(v) > 0 && v[0] == '{':
			var o struct {
				GroupSize *int            `json:"group_size"`
				Bits      *int            `json:"bits"`
				Mode      json.RawMessage `json:"mode"`
			}
			if err := json.Unmarshal(v, &o); err != nil {
				return out, fmt.Errorf("config.json: quantization[%q]: %w", k, err)
			}
			mode, err := checkQuantMode(o.Mode)
			if err != nil {
				return out, fmt.Errorf("config.json: quantization[%q]: %w", k, err)
			}
			s := out.def
			if len(o.Mode) > 0 {
				s.Mode = mode
			}
			if o.GroupSize != nil {
				s.GroupSize = *o.GroupSize
			}
			if o.Bits != nil {
				s.Bits = *o.Bits
			}
			out.overrides[k] = s
		}
		// Other keys ("mode", checked above) are not modules.
	}
	return out, nil
}

// checkQuantMode accepts an absent mode or "affine" (returned as "") and
// "mxfp4" (4-bit E2M1 values in groups of 32 with an E8M0 scale, as
// gpt-oss's experts ship); other MLX modes are refused.
func checkQuantMode(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	var mode string
	if err := json.Unmarshal(raw, &mode); err != nil {
		return "", fmt.Errorf("mode: %w", err)
	}
	switch mode {
	case "affine":
		return "", nil
	case "mxfp4":
		return mode, nil
	}
	return "", fmt.Errorf("mode %q not supported (affine or mxfp4)", mode)
}

// OpenDir opens an HF safetensors model directory.
func OpenDir(dir string) (engine.Source, error) {
	config, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("open model dir: %w", err)
	}
	qc, err := parseQuantConfig(config)
	if err != nil {
		return nil, fmt.Errorf("open model dir %s: %w", dir, err)
	}
	s := &dirSource{dir: dir, config: config, where: map[string]*safetensorsFile{}, quant: qc}
	files, absent, err := shardFiles(dir)
	if err != nil {
		return nil, err
	}
	s.absent = absent
	for _, fn := range files {
		f, err := openSafetensors(fn)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.files = append(s.files, f)
		for name := range f.entries {
			if prev, dup := s.where[name]; dup {
				s.Close()
				return nil, fmt.Errorf("open model dir %s: tensor %q in both %s and %s", dir, name, filepath.Base(prev.path), filepath.Base(fn))
			}
			s.where[name] = f
			s.names = append(s.names, name)
		}
	}
	sort.Strings(s.names)
	if len(s.names) == 0 {
		s.Close()
		return nil, fmt.Errorf("open model dir %s: no tensors", dir)
	}
	return s, nil
}

// shardFiles lists the safetensors files of a directory: those named by
// model.safetensors.index.json when present, else every *.safetensors.
// Shards the index names that are not in the directory (a pipeline
// stage's partial download holds only its layers' shards) are left out,
// their tensors returned in absent (tensor → shard); at least one must be
// there.
func shardFiles(dir string) (out []string, absent map[string]string, err error) {
	idx, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err == nil {
		var ix struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(idx, &ix); err != nil {
			return nil, nil, fmt.Errorf("%s: model.safetensors.index.json: %w", dir, err)
		}
		there := map[string]bool{}
		for name, fn := range ix.WeightMap {
			if fn != filepath.Base(fn) || !strings.HasSuffix(fn, ".safetensors") {
				return nil, nil, fmt.Errorf("%s: model.safetensors.index.json names bad shard %q", dir, fn)
			}
			ok, seen := there[fn]
			if !seen {
				_, serr := os.Stat(filepath.Join(dir, fn))
				ok = serr == nil
				there[fn] = ok
				if ok {
					out = append(out, filepath.Join(dir, fn))
				}
			}
			if !ok {
				if absent == nil {
					absent = map[string]string{}
				}
				absent[name] = fn
			}
		}
		sort.Strings(out)
		if len(there) == 0 {
			return nil, nil, fmt.Errorf("%s: model.safetensors.index.json has an empty weight_map", dir)
		}
		if len(out) == 0 {
			return nil, nil, fmt.Errorf("open model dir %s: none of the %d shards model.safetensors.index.json names is there", dir, len(there))
		}
		return out, absent, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	out, err = filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, nil, err
	}
	if len(out) == 0 {
		return nil, nil, fmt.Errorf("open model dir %s: no *.safetensors files", dir)
	}
	sort.Strings(out)
	return out, nil, nil
}

func (s *dirSource) Tensor(name string) (engine.Tensor, error) {
	f, ok := s.where[name]
	if !ok {
		if shard, gone := s.absent[name]; gone {
			// Not ErrNotFound: an optional tensor must not silently
			// read as missing because its shard was not downloaded.
			return engine.Tensor{}, fmt.Errorf("tensor %q is in %s, which %s lacks (a pipeline stage's download of other layers)", name, shard, s.dir)
		}
		return engine.Tensor{}, fmt.Errorf("tensor %q: %w", name, engine.ErrNotFound)
	}
	t, ok := f.tensor(name)
	if !ok {
		return engine.Tensor{}, fmt.Errorf("tensor %q: source closed: %w", name, engine.ErrNotFound)
	}
	return t, nil
}

func (s *dirSource) Names() []string { return append([]string(nil), s.names...) }

// Quant reports the quantization of the linear layer prefix: dense when no
// prefix.scales tensor exists, else the per-module override in config.json's
// quantization block, else its default.
func (s *dirSource) Quant(prefix string) engine.QuantSpec {
	if _, ok := s.where[prefix+".scales"]; !ok {
		return engine.QuantSpec{}
	}
	if o, ok := s.quant.overrides[prefix]; ok {
		return o
	}
	return s.quant.def
}

func (s *dirSource) Config() []byte { return s.config }

// Vocab reads tokenizer.json: model.vocab (an object token→id, or a list
// of [token, score] pairs) plus added_tokens, in id order. Ids that no
// token claims are "".
func (s *dirSource) Vocab() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("vocab: %w", err)
	}
	return vocabFromTokenizerJSON(b)
}

func vocabFromTokenizerJSON(b []byte) ([]string, error) {
	var tj struct {
		Model struct {
			Vocab json.RawMessage `json:"vocab"`
		} `json:"model"`
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(b, &tj); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	byID := map[int]string{}
	var asMap map[string]int
	if err := json.Unmarshal(tj.Model.Vocab, &asMap); err == nil {
		for tok, id := range asMap {
			byID[id] = tok
		}
	} else {
		var asList [][]json.RawMessage
		if err := json.Unmarshal(tj.Model.Vocab, &asList); err != nil {
			return nil, fmt.Errorf("tokenizer.json: model.vocab is neither an object nor a list")
		}
		for id, pair := range asList {
			var tok string
			if len(pair) == 0 || json.Unmarshal(pair[0], &tok) != nil {
				return nil, fmt.Errorf("tokenizer.json: model.vocab[%d] is not [token, score]", id)
			}
			byID[id] = tok
		}
	}
	for _, a := range tj.AddedTokens {
		byID[a.ID] = a.Content
	}
	n := 0
	for id := range byID {
		if id < 0 || id > 1<<24 {
			return nil, fmt.Errorf("tokenizer.json: token id %d out of range", id)
		}
		if id+1 > n {
			n = id + 1
		}
	}
	out := make([]string, n)
	for id, tok := range byID {
		out[id] = tok
	}
	return out, nil
}

func (s *dirSource) Close() error {
	var first error
	for _, f := range s.files {
		if err := f.close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

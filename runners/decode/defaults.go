package decode

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/exo-pd/exo-pd/runners/engine/weights"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// ModelDefaults reads a model's own sampling defaults: from a model
// directory's generation_config.json (temperature, top_p, top_k, min_p,
// repetition_penalty; do_sample is not read, as vLLM does not), or from a
// .gguf file's general.sampling.* keys (temp, top_p, top_k, min_p,
// penalty_repeat). A model that has none gives the zero Defaults (OpenAI's
// defaults then apply). Values are validated as request fields are.
func ModelDefaults(path string) (gen.Defaults, error) {
	st, err := os.Stat(path)
	if err != nil {
		return gen.Defaults{}, fmt.Errorf("sampling defaults: %w", err)
	}
	var d gen.Defaults
	var src string
	if !st.IsDir() && (strings.HasSuffix(strings.ToLower(path), ".gguf") || weights.IsGGUF(path)) {
		src = path
		g, err := weights.OpenGGUF(path)
		if err != nil {
			return d, fmt.Errorf("sampling defaults: %w", err)
		}
		defer g.Close()
		f := func(key string) *float64 {
			if v32, ok := g.Meta("general.sampling." + key); ok {
				if x, ok := v32.(float32); ok { // 0.6f is 0.6, not 0.6000000238…
					v, _ := strconv.ParseFloat(strconv.FormatFloat(float64(x), 'g', -1, 32), 64)
					return &v
				}
			}
			if v, ok := g.Float("general.sampling." + key); ok {
				return &v
			}
			return nil
		}
		d.Temperature, d.TopP, d.MinP, d.RepetitionPenalty = f("temp"), f("top_p"), f("min_p"), f("penalty_repeat")
		if v, ok := g.Uint("general.sampling.top_k"); ok {
			k := int(min(v, 1<<30))
			d.TopK = &k
		}
	} else {
		dir := path
		if !st.IsDir() {
			dir = filepath.Dir(path)
		}
		src = filepath.Join(dir, "generation_config.json")
		b, err := os.ReadFile(src)
		if errors.Is(err, fs.ErrNotExist) {
			return d, nil
		}
		if err != nil {
			return d, fmt.Errorf("sampling defaults: %w", err)
		}
		var gc struct {
			Temperature       *float64 `json:"temperature"`
			TopP              *float64 `json:"top_p"`
			TopK              *int     `json:"top_k"`
			MinP              *float64 `json:"min_p"`
			RepetitionPenalty *float64 `json:"repetition_penalty"`
		}
		if err := json.Unmarshal(b, &gc); err != nil {
			return d, fmt.Errorf("sampling defaults: %s: %w", src, err)
		}
		d = gen.Defaults{Temperature: gc.Temperature, TopP: gc.TopP, TopK: gc.TopK, MinP: gc.MinP, RepetitionPenalty: gc.RepetitionPenalty}
	}
	if err := d.Check(); err != nil {
		return gen.Defaults{}, fmt.Errorf("sampling defaults: %s: %w", src, err)
	}
	return d, nil
}

// DescribeDefaults is a one-line summary of d for logs ("temperature=0.6
// top_k=20"; "none" when empty).
func DescribeDefaults(d gen.Defaults) string {
	var parts []string
	add := func(name string, v *float64) {
		if v != nil {
			parts = append(parts, fmt.Sprintf("%s=%g", name, *v))
		}
	}
	add("temperature", d.Temperature)
	add("top_p", d.TopP)
	if d.TopK != nil {
		parts = append(parts, fmt.Sprintf("top_k=%d", *d.TopK))
	}
	add("min_p", d.MinP)
	add("repetition_penalty", d.RepetitionPenalty)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

package engine

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Qwen3.5 (HF Qwen3_5ForConditionalGeneration and
// Qwen3_5MoeForConditionalGeneration, mlx-lm's qwen3_5 and qwen3_5_moe):
// the text model of a multimodal checkpoint, Qwen3-Next's hybrid layers
// (Gated DeltaNet with four plain projections, gated attention), dense or
// with routed experts. The language model's fields live in text_config
// (Prepare lifts them), its tensors under a language-model prefix (Source
// presents them under the plain names). Checkpoints whose conv1d is in
// PyTorch's [C, 1, K] store RMSNorm weights minus one (mlx-lm adds 1 then).

func init() {
	// llama.cpp writes Qwen3.5 as Qwen3-Next with the value heads tiled.
	Register("Qwen3_5ForConditionalGeneration", &Architecture{KVFamily: "qwen3_5", Prepare: flattenTextConfig, Source: wrapLanguageModel,
		Layers: gatedDeltaNetLayers(false), Block: gatedDeltaNetBlock, Open: qwen35Open,
		GGUF: &GGUFLayout{Name: "qwen35", ModelType: "qwen3_5", DeltaNetTensors: true, TiledValueHeads: true,
			LayerNames: gatedDeltaNetGGUFNames, Config: gatedDeltaNetGGUFConfig(false)}})
	Register("Qwen3_5MoeForConditionalGeneration", &Architecture{KVFamily: "qwen3_5_moe", Prepare: flattenTextConfig, Source: wrapLanguageModel,
		Layers: gatedDeltaNetLayers(true), Block: gatedDeltaNetBlock, Open: qwen35Open,
		GGUF: &GGUFLayout{Name: "qwen35moe", ModelType: "qwen3_5_moe", ExpertFFN: true, DeltaNetTensors: true, TiledValueHeads: true,
			LayerNames: gatedDeltaNetGGUFNames, Config: gatedDeltaNetGGUFConfig(true)}})
}

func qwen35Open(l *loader, c *Config) error {
	for _, n := range l.src.Names() {
		if strings.HasSuffix(n, ".linear_attn.conv1d.weight") {
			if t, err := l.src.Tensor(n); err == nil && len(t.Shape) == 3 && t.Shape[2] != 1 {
				l.normOffset = true
			}
			break
		}
	}
	return nil
}

// flattenTextConfig lifts a Qwen3.5 config's text_config (the language
// model's fields live there, architectures and quantization at the top) to
// the top level, the top level's own keys winning only where text_config
// lacks them, and rope_parameters' partial_rotary_factor next to them.
// A config without text_config comes back unchanged.
func flattenTextConfig(data []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	raw, ok := top["text_config"]
	if !ok || string(raw) == "null" {
		return data, nil
	}
	var text map[string]json.RawMessage
	if err := json.Unmarshal(raw, &text); err != nil {
		return nil, cfgErr("text_config", "%v", err)
	}
	for k, v := range top {
		if _, has := text[k]; !has && k != "text_config" && k != "vision_config" {
			text[k] = v
		}
	}
	for _, k := range []string{"architectures", "quantization", "quantization_config"} {
		if v, has := top[k]; has {
			text[k] = v
		}
	}
	if rp, has := text["rope_parameters"]; has {
		var p map[string]json.RawMessage
		if json.Unmarshal(rp, &p) == nil {
			if v, has := p["partial_rotary_factor"]; has {
				if _, set := text["partial_rotary_factor"]; !set {
					text["partial_rotary_factor"] = v
				}
			}
		}
	}
	return json.Marshal(text)
}

package engine

import "strings"

// languageModelSource presents the language model inside a multimodal
// checkpoint (Qwen3.5, Gemma 3) under the plain names the loader uses:
// "model.…" and "lm_head.…" are read from "language_model.model.…" and
// "language_model.lm_head.…" (mlx-lm's layout) or from
// "model.language_model.…" and "lm_head.…" (Hugging Face's). Other
// tensors (a vision tower) are not listed.
type languageModelSource struct {
	Source
	model, head string // the prefixes standing for "model." and "lm_head."
}

// wrapLanguageModel returns src itself unless its tensors live under a
// language-model prefix (an Architecture's Source for multimodal
// checkpoints).
func wrapLanguageModel(src Source) Source {
	for _, n := range src.Names() {
		switch {
		case strings.HasPrefix(n, "language_model.model."):
			return &languageModelSource{Source: src, model: "language_model.model.", head: "language_model.lm_head."}
		case strings.HasPrefix(n, "model.language_model."):
			return &languageModelSource{Source: src, model: "model.language_model.", head: "lm_head."}
		}
	}
	return src
}

func (s *languageModelSource) outer(name string) string {
	switch {
	case strings.HasPrefix(name, "model."):
		return s.model + strings.TrimPrefix(name, "model.")
	case strings.HasPrefix(name, "lm_head."):
		return s.head + strings.TrimPrefix(name, "lm_head.")
	}
	return name
}

func (s *languageModelSource) Tensor(name string) (Tensor, error) {
	t, err := s.Source.Tensor(s.outer(name))
	t.Name = name
	return t, err
}

func (s *languageModelSource) Quant(prefix string) QuantSpec { return s.Source.Quant(s.outer(prefix)) }

func (s *languageModelSource) Names() []string {
	var out []string
	for _, n := range s.Source.Names() {
		switch {
		case strings.HasPrefix(n, s.model):
			out = append(out, "model."+strings.TrimPrefix(n, s.model))
		case strings.HasPrefix(n, s.head):
			out = append(out, "lm_head."+strings.TrimPrefix(n, s.head))
		}
	}
	return out
}

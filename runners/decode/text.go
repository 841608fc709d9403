package decode

import (
	"errors"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/sample"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// tokText adapts the tokenizer and chat template packages to Text.
type tokText struct {
	tok  *tokenizer.Tokenizer
	tmpl *chat.Template
}

// NewText returns the Text of a model; tmpl may be nil (no chat template:
// chat requests are refused, completions work).
func NewText(tok *tokenizer.Tokenizer, tmpl *chat.Template) Text {
	return &tokText{tok: tok, tmpl: tmpl}
}

func (t *tokText) Render(msgs []openai.ChatMessage, agp bool) (string, error) {
	if t.tmpl == nil {
		return "", errors.New("this model has no chat template; use /v1/completions")
	}
	cm := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		cm[i] = chat.Message{Role: m.Role, Content: m.Content}
	}
	return t.tmpl.Render(cm, agp)
}

func (t *tokText) Encode(s string) []int32     { return t.tok.Encode(s) }
func (t *tokText) EncodeChat(s string) []int32 { return t.tok.EncodeChat(s) }
func (t *tokText) EOS() []int32                { return t.tok.EOS() }
func (t *tokText) VocabSize() int              { return t.tok.VocabSize() }
func (t *tokText) NewStream() TextStream       { return t.tok.NewStreamDecoder() }

// NewSampler makes a sample.Sampler from validated request parameters.
func NewSampler(s openai.Sampling) Sampler {
	return sample.New(sample.Params{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, MinP: s.MinP,
		RepetitionPenalty: s.RepetitionPenalty, Seed: s.Seed})
}

// NewStopMatcher makes a sample.StopMatcher.
func NewStopMatcher(stops []string) StopMatcher { return sample.NewStopMatcher(stops) }

package decode

import (
	"errors"
	"strings"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/sample"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// tokText adapts the tokenizer and chat template packages to Text.
type tokText struct {
	tok    *tokenizer.Tokenizer
	tmpl   *chat.Template
	format chat.Format // detected once, from the template
}

// NewText returns the Text of a model; tmpl may be nil (no chat template:
// chat requests are refused, completions work).
func NewText(tok *tokenizer.Tokenizer, tmpl *chat.Template) Text {
	return &tokText{tok: tok, tmpl: tmpl, format: chat.Detect(tmpl)}
}

func (t *tokText) Render(msgs []gen.Message, agp, continueFinal bool) (string, error) {
	if t.tmpl == nil {
		return "", errors.New("this model has no chat template; use /v1/completions")
	}
	// through the format with no tools: a history of calls and results is
	// rendered in its convention where the template itself takes none
	return renderChat(func(m []chat.Message, agp bool) (string, error) { return t.format.RenderTools(t.tmpl, m, nil, agp) },
		chatMessages(msgs), agp, continueFinal)
}

// chatMessages converts validated API messages to the chat template's.
func chatMessages(msgs []gen.Message) []chat.Message {
	cm := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		cm[i] = chat.Message{Role: m.Role, Content: m.Content, Reasoning: m.Reasoning, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			cm[i].ToolCalls = append(cm[i].ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
	}
	return cm
}

// renderChat renders msgs with render; with continueFinal the final
// message is left open: the conversation is rendered without a
// generation prompt and cut right after the final message's content
// (vLLM's continue_final_message), so what the template appends after it
// (end of turn) is dropped.
func renderChat(render func([]chat.Message, bool) (string, error), msgs []chat.Message, agp, continueFinal bool) (string, error) {
	if !continueFinal {
		return render(msgs, agp)
	}
	out, err := render(msgs, false)
	if err != nil {
		return "", err
	}
	final := strings.TrimSpace(msgs[len(msgs)-1].Content)
	if final == "" {
		return "", errors.New("continue_final_message: the final assistant message is empty")
	}
	i := strings.LastIndex(out, final)
	if i < 0 {
		return "", errors.New("continue_final_message: the chat template does not render the final message's content verbatim")
	}
	return out[:i+len(final)], nil
}

// ReasoningText is a Text whose chat template may read reasoning back;
// tokText is one. A Text that is not one takes no reasoning in its
// history (what reasoning the model writes is its format's to split).
type ReasoningText interface {
	// HistoryReasoning: the template renders an assistant message's
	// reasoning_content (Qwen3's, gpt-oss's as "thinking").
	HistoryReasoning() bool
}

func (t *tokText) HistoryReasoning() bool { return t.tmpl != nil && t.tmpl.HistoryReasoning() }

func (t *tokText) Encode(s string) []int32     { return t.tok.Encode(s) }
func (t *tokText) EncodeChat(s string) []int32 { return t.tok.EncodeChat(s) }
func (t *tokText) Decode(ids []int32) string   { return t.tok.Decode(ids) }
func (t *tokText) TokenBytes(id int32) []byte  { return t.tok.TokenBytes(id) }
func (t *tokText) EOS() []int32                { return t.tok.EOS() }
func (t *tokText) VocabSize() int              { return t.tok.VocabSize() }
func (t *tokText) NewStream() TextStream       { return t.tok.NewStreamDecoder() }

// NewSampler makes a sample.Sampler from validated request parameters.
func NewSampler(s gen.Sampling) Sampler {
	return sample.New(SampleParams(s))
}

// SampleParams converts validated request parameters: no seed in the
// request means fresh randomness.
func SampleParams(s gen.Sampling) sample.Params {
	return sample.Params{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, MinP: s.MinP,
		RepetitionPenalty: s.RepetitionPenalty, PresencePenalty: s.PresencePenalty, FrequencyPenalty: s.FrequencyPenalty,
		LogitBias: s.LogitBias, Seed: s.Seed, RandomSeed: !s.SeedSet}
}

// NewStopMatcher makes a sample.StopMatcher.
func NewStopMatcher(stops []string) StopMatcher { return sample.NewStopMatcher(stops) }

package decode

import (
	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// thinkEmitter splits the output of a model that reasons in
// <think>…</think> (Qwen3; see chat.ThinkParser) into reasoning, which
// goes to the request's ReasoningEmitter (OpenAI's reasoning_content;
// dropped where the API has no place for it), and answer text, which goes
// on to the embedded emitter: the request's, or a toolEmitter when tools
// are offered, so a call is read from the answer, never from the
// reasoning.
type thinkEmitter struct {
	openai.Emitter
	reasoning openai.ReasoningEmitter            // nil: reasoning is dropped
	next      interface{ finish() (int, error) } // the toolEmitter, or nil
	p         chat.ThinkParser
}

// Text implements openai.Emitter.
func (t *thinkEmitter) Text(s string, lp *openai.TokenLogprob) error {
	r, c := t.p.Feed(s)
	return t.forward(r, c, lp)
}

func (t *thinkEmitter) forward(reasoning, content string, lp *openai.TokenLogprob) error {
	if reasoning != "" && t.reasoning != nil {
		if err := t.reasoning.Reasoning(reasoning); err != nil {
			return err
		}
	}
	if content != "" || lp != nil {
		return t.Emitter.Text(content, lp) // a reasoning token's log-probability goes with no answer text
	}
	return nil
}

// finish flushes what the parser held back, then the tool parser's; it
// returns the number of tool calls made.
func (t *thinkEmitter) finish() (int, error) {
	r, c := t.p.Flush()
	if err := t.forward(r, c, nil); err != nil {
		return 0, err
	}
	if t.next != nil {
		return t.next.finish()
	}
	return 0, nil
}

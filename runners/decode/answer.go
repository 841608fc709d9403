package decode

import (
	"errors"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// answerEmitter parses a chat generation with its format's parser (one
// per request) and forwards the parts to the request's emitter: answer
// text as text, reasoning to its ReasoningEmitter (OpenAI's
// reasoning_content; dropped where the API has no place for it), and
// tool-call fragments, with a fresh call id on each call's first, to its
// ToolCallEmitter. A token's log-probability goes with the first answer
// text it yields, or with none.
type answerEmitter struct {
	gen.Emitter
	calls     gen.ToolCallEmitter  // nil: the API cannot take calls
	reasoning gen.ReasoningEmitter // nil: reasoning is dropped
	p         chat.Parser
	n         int // tool calls started
	// callsOnly drops answer text, for an answer the grammar holds to
	// tool calls (tool_choice required or named), where the only text the
	// parser can give back is a call's markup cut off by max_tokens
	// before the call could be read.
	callsOnly bool
}

func newAnswerEmitter(em gen.Emitter, p chat.Parser) *answerEmitter {
	a := &answerEmitter{Emitter: em, p: p}
	a.calls, _ = em.(gen.ToolCallEmitter)
	a.reasoning, _ = em.(gen.ReasoningEmitter)
	return a
}

// Text implements gen.Emitter.
func (a *answerEmitter) Text(s string, lp *gen.TokenLogprob) error {
	return a.forward(a.p.Add(s, false), lp)
}

// finish flushes what the parser held back; it returns the number of
// tool calls made.
func (a *answerEmitter) finish() (int, error) {
	err := a.forward(a.p.Add("", true), nil)
	return a.n, err
}

func (a *answerEmitter) forward(ev []chat.Event, lp *gen.TokenLogprob) error {
	for _, e := range ev {
		switch e.Kind {
		case chat.Content:
			if a.callsOnly {
				continue
			}
			if err := a.Emitter.Text(e.Text, lp); err != nil {
				return err
			}
			lp = nil
		case chat.Reasoning:
			if a.reasoning != nil {
				if err := a.reasoning.Reasoning(e.Text); err != nil {
					return err
				}
			}
		case chat.Call:
			if a.calls == nil {
				return errors.New("this API cannot return tool calls")
			}
			id := ""
			if e.Name != "" {
				id = newCallID()
				a.n = max(a.n, e.Index+1)
			}
			if err := a.calls.ToolCall(e.Index, id, e.Name, e.Args); err != nil {
				return err
			}
		}
	}
	if lp != nil {
		return a.Emitter.Text("", lp) // the token's log-probability, with no answer text
	}
	return nil
}

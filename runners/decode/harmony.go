package decode

import (
	"errors"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// harmonyEmitter splits a harmony (gpt-oss) chat generation, which the
// detokenizer renders with its special tokens as text, into the request
// emitter's parts: the analysis channel as reasoning (dropped where the
// API has no place for it), the final channel as text, and messages
// addressed to=functions.NAME as tool calls (fresh call ids). A call is
// emitted whole when its message ends (<|call|> stops generation, so that
// is at the end), as one fragment with id and name then one with the
// arguments. When the request offered no tools (none given, or
// tool_choice "none"), a call the model writes anyway is not a tool call:
// its arguments text becomes answer text (as vLLM returns such a message's
// body as content), so the finish reason stays "stop".
type harmonyEmitter struct {
	openai.Emitter
	calls     openai.ToolCallEmitter  // nil: the API cannot take calls
	reasoning openai.ReasoningEmitter // nil: reasoning is dropped
	offered   bool                    // tools were offered: calls are tool calls
	p         chat.HarmonyParser
	n         int // tool calls emitted
}

func newHarmonyEmitter(em openai.Emitter, toolsOffered bool) *harmonyEmitter {
	h := &harmonyEmitter{Emitter: em, offered: toolsOffered}
	h.calls, _ = em.(openai.ToolCallEmitter)
	h.reasoning, _ = em.(openai.ReasoningEmitter)
	return h
}

// Text implements openai.Emitter.
func (h *harmonyEmitter) Text(s string, lp *openai.TokenLogprob) error {
	return h.forward(h.p.Feed(s), lp)
}

// finish flushes what the parser held back; it returns the number of
// tool calls made.
func (h *harmonyEmitter) finish() (int, error) {
	err := h.forward(h.p.Flush(), nil)
	return h.n, err
}

func (h *harmonyEmitter) forward(ev []chat.HarmonyEvent, lp *openai.TokenLogprob) error {
	for _, e := range ev {
		switch e.Kind {
		case chat.HarmonyContent:
			if err := h.Emitter.Text(e.Text, lp); err != nil {
				return err
			}
			lp = nil
		case chat.HarmonyReasoning:
			if h.reasoning != nil {
				if err := h.reasoning.Reasoning(e.Text); err != nil {
					return err
				}
			}
		case chat.HarmonyToolCall:
			if !h.offered {
				if err := h.Emitter.Text(e.Text, lp); err != nil {
					return err
				}
				lp = nil
				continue
			}
			if h.calls == nil {
				return errors.New("this API cannot return tool calls")
			}
			if err := h.calls.ToolCall(h.n, newCallID(), e.Name, ""); err != nil {
				return err
			}
			if err := h.calls.ToolCall(h.n, "", "", e.Text); err != nil {
				return err
			}
			h.n++
		}
	}
	if lp != nil {
		return h.Emitter.Text("", lp) // the token's log-probability, with no answer text
	}
	return nil
}

package decode

import (
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// recordEmitter keeps what an answer emitter forwards.
type recordEmitter struct {
	text  string
	lps   int
	calls int
}

func (r *recordEmitter) Start(int) error { return nil }
func (r *recordEmitter) Text(t string, lp *gen.TokenLogprob) error {
	r.text += t
	if lp != nil {
		r.lps++
	}
	return nil
}
func (r *recordEmitter) ToolCall(_ int, id, _, _ string) error {
	if id != "" {
		r.calls++
	}
	return nil
}

// TestForcedCallsCutShortWriteNoMarkup: an answer that may only be tool
// calls (tool_choice required or named) and is cut off (max_tokens)
// before its call could be read is no call and no content — not the
// call's markup as text, as it was; each token's log-probability still
// goes out. A free answer keeps such text (it may be prose).
func TestForcedCallsCutShortWriteNoMarkup(t *testing.T) {
	for _, c := range []struct {
		callsOnly bool
		want      string
	}{{true, ""}, {false, "<tool_call>\n{\"na"}} {
		rec := &recordEmitter{}
		a := newAnswerEmitter(rec, chat.Hermes.NewParser(true, chat.Start{}))
		a.callsOnly = c.callsOnly
		for _, piece := range []string{"<tool", "_call>\n", "{\"na"} {
			if err := a.Text(piece, &gen.TokenLogprob{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.finish(); err != nil {
			t.Fatal(err)
		}
		if rec.text != c.want || rec.lps != 3 || rec.calls != 0 {
			t.Errorf("calls only %v: text %q, %d logprobs, %d calls; want %q, 3, 0", c.callsOnly, rec.text, rec.lps, rec.calls, c.want)
		}
	}
}

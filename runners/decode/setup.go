package decode

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
)

// Setup is what a model directory (or .gguf file) gives a decode Server:
// the Options that read it, with what was left out said apart.
type Setup struct {
	// Options has Name, Model, Text, Defaults, NewSampler,
	// NewStopMatcher, NewConstraint and AcceptTools set: every generation
	// over this model, the decode runner's and `exo run`'s, renders,
	// samples, stops and constrains the same way.
	Options Options
	// Grammars serves NewConstraint; Warm builds its vocabulary ahead.
	Grammars *Grammars
	// NoTemplate says why the model has no usable chat template (chat
	// requests are then refused; completions work); nil when it has one.
	NoTemplate error
	// BadDefaults says why the model's own sampling defaults are not used;
	// nil when they are valid (or absent).
	BadDefaults error
}

// NewSetup loads the tokenizer, chat template and sampling defaults of the
// model at path (loaded as m) and makes the Options of a Server named
// name over them; over (the cluster file's [models.defaults]) is laid
// over the model's defaults, and each request's fields over both.
func NewSetup(name string, m Model, path string, over gen.Defaults) (*Setup, error) {
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	s := &Setup{}
	tmpl, err := chat.Load(path)
	if err != nil {
		s.NoTemplate, tmpl = fmt.Errorf("chat template: %w", err), nil
	}
	defaults, err := ModelDefaults(path)
	if err != nil {
		s.BadDefaults = err
	}
	text := NewText(tok, tmpl)
	s.Grammars = &Grammars{Text: text} // response_format and forced tool calls
	s.Options = Options{Name: name, Model: m, Text: text, Defaults: defaults.Over(over),
		NewConstraint: s.Grammars.NewConstraint, AcceptTools: true,
		NewSampler: NewSampler, NewStopMatcher: NewStopMatcher}
	return s, nil
}

package gen

import (
	"bytes"
	"errors"
	"strings"
)

// The checks every API adapter applies to the Request it converted, in
// one place: an adapter checks its own JSON shapes and spellings, then
// these, so the rules cannot drift apart between APIs. A check that names
// a field takes the field's name from the caller (each API spells its
// own), and reports it as a *FieldError.

// MaxStops is how many stop sequences a request may give.
const MaxStops = 16

// CheckMaxTokens checks a completion limit the request gave; field names
// it.
func CheckMaxTokens(n int, field string) *FieldError {
	if n < 1 {
		return fieldErr(field, "%s must be at least 1, got %d", field, n)
	}
	return nil
}

// CheckStops checks stop sequences: at most MaxStops, none empty. field
// names them in errors; noun is how the messages say them ("stop
// sequences", or the field's own name).
func CheckStops(stops []string, field, noun string) *FieldError {
	if len(stops) > MaxStops {
		return fieldErr(field, "at most %d %s, got %d", MaxStops, noun, len(stops))
	}
	for _, s := range stops {
		if s == "" {
			return fieldErr(field, "%s must not be empty", noun)
		}
	}
	return nil
}

// The ways a requested turn cannot be: SetTurn's errors, for the adapter
// to name in its own fields.
var (
	ErrTurnBoth         = errors.New("cannot both continue the final message and open a new turn")
	ErrTurnNotAssistant = errors.New("only the assistant's final message can be continued")
	ErrTurnCalls        = errors.New("an assistant message with tool calls cannot be continued")
)

// SetTurn decides between a new assistant turn (AddGenerationPrompt) and
// continuing the final assistant message (ContinueFinal, a prefill), from
// what the request asked (nil: not asked). By default an assistant's
// final words are continued; an empty one, or one that only calls tools,
// is not. r.Messages must not be empty.
func (r *Request) SetTurn(addGenerationPrompt, continueFinal *bool) error {
	last := r.Messages[len(r.Messages)-1]
	lastAssistant := last.Role == "assistant"
	cont := lastAssistant && len(last.ToolCalls) == 0 && strings.TrimSpace(last.Content) != "" &&
		!(addGenerationPrompt != nil && *addGenerationPrompt)
	if continueFinal != nil {
		cont = *continueFinal
	}
	agp := !cont
	if addGenerationPrompt != nil {
		agp = *addGenerationPrompt
	}
	switch {
	case cont && agp:
		return ErrTurnBoth
	case cont && !lastAssistant:
		return ErrTurnNotAssistant
	case cont && len(last.ToolCalls) > 0:
		return ErrTurnCalls
	}
	r.AddGenerationPrompt, r.ContinueFinal = agp, cont
	return nil
}

// ToolFields name, in an API's own terms, the fields CheckTools reports.
type ToolFields struct {
	// ToolName names tool i's name ("tools[0].function.name").
	ToolName func(i int) string
	// Parameters names tool i's JSON Schema ("tools[0].function.parameters",
	// Anthropic's "tools[0].input_schema").
	Parameters func(i int) string
	// Choice names the tool choice and ChoiceMode spells its mode as the
	// API does (nil: the Mode itself).
	Choice     string
	ChoiceMode func(mode string) string
	// Format names the response format (APIs without one never set it).
	Format string
}

// CheckTools checks r's tools (each named, with a JSON Schema object: an
// API whose tools may omit it gives the schema it means instead, as
// OpenAI's no-parameters schema) and tool choice against each other, and,
// unless accept (the generator honours them), refuses
// whatever needs the grammar engine: tools, a tool choice other than
// auto or none, a response format other than text.
func (r *Request) CheckTools(accept bool, f ToolFields) *FieldError {
	for i, t := range r.Tools {
		if t.Name == "" {
			n := f.ToolName(i)
			return fieldErr(n, "%s is required", n)
		}
		switch p := bytes.TrimSpace(t.Parameters); {
		case len(p) == 0 || string(p) == "null":
			n := f.Parameters(i)
			return fieldErr(n, "%s is required (a JSON Schema object)", n)
		case p[0] != '{':
			n := f.Parameters(i)
			return fieldErr(n, "%s must be a JSON Schema object", n)
		}
	}
	tc := r.ToolChoice
	if tc != nil && (tc.Mode == "required" || tc.Mode == "function") && len(r.Tools) == 0 {
		mode := tc.Mode
		if f.ChoiceMode != nil {
			mode = f.ChoiceMode(mode)
		}
		return fieldErr(f.Choice, "%s %q needs tools", f.Choice, mode)
	}
	if accept {
		return nil
	}
	if len(r.Tools) > 0 {
		return fieldErr("tools", "tools is not supported by this server yet")
	}
	if tc != nil && tc.Mode != "none" && tc.Mode != "auto" {
		return fieldErr(f.Choice, "%s is not supported by this server yet", f.Choice)
	}
	if rf := r.ResponseFormat; rf != nil && rf.Type != "text" {
		return fieldErr(f.Format, "%s type %q is not supported by this server yet", f.Format, rf.Type)
	}
	return nil
}

package gen

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestSetTurn: the default turn continues a final assistant message with
// words and opens a new one otherwise; what a request asks overrides it,
// and impossible asks are the named errors.
func TestSetTurn(t *testing.T) {
	yes, no := true, false
	user := []Message{{Role: "user", Content: "hi"}}
	asst := []Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "The answer is"}}
	blank := []Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: " \n"}}
	calls := []Message{{Role: "user", Content: "hi"}, {Role: "assistant", ToolCalls: []ToolCall{{ID: "c", Name: "f", Arguments: "{}"}}}}
	for _, c := range []struct {
		name      string
		msgs      []Message
		agp, cont *bool
		wantAGP   bool
		wantCont  bool
		err       error
	}{
		{"user last", user, nil, nil, true, false, nil},
		{"assistant last", asst, nil, nil, false, true, nil},
		{"blank assistant", blank, nil, nil, true, false, nil},
		{"assistant calls", calls, nil, nil, true, false, nil},
		{"asked new turn", asst, &yes, nil, true, false, nil},
		{"asked no new turn", user, &no, nil, false, false, nil},
		{"both", asst, &yes, &yes, false, false, ErrTurnBoth},
		{"continue user", user, nil, &yes, false, false, ErrTurnNotAssistant},
		{"continue calls", calls, nil, &yes, false, false, ErrTurnCalls},
	} {
		r := &Request{Messages: c.msgs}
		err := r.SetTurn(c.agp, c.cont)
		if !errors.Is(err, c.err) || (err == nil && (r.AddGenerationPrompt != c.wantAGP || r.ContinueFinal != c.wantCont)) {
			t.Errorf("%s: agp %v cont %v err %v, want %v %v %v", c.name, r.AddGenerationPrompt, r.ContinueFinal, err, c.wantAGP, c.wantCont, c.err)
		}
	}
}

// TestChecks: the shared checks name the field as the caller spells it.
func TestChecks(t *testing.T) {
	f := ToolFields{ToolName: func(i int) string { return fmt.Sprintf("tools[%d].name", i) },
		Parameters: func(i int) string { return fmt.Sprintf("tools[%d].input_schema", i) }, Choice: "tool_choice",
		ChoiceMode: func(m string) string { return "any" }, Format: "response_format"}
	obj := json.RawMessage(`{"type":"object"}`)
	tools := []Tool{{Name: "f", Parameters: obj}}
	for _, c := range []struct {
		name   string
		err    *FieldError
		field  string
		substr string
	}{
		{"max tokens", CheckMaxTokens(0, "max_tokens"), "max_tokens", "at least 1"},
		{"max tokens ok", CheckMaxTokens(1, "max_tokens"), "", ""},
		{"empty stop", CheckStops([]string{"a", ""}, "stop_sequences", "stop_sequences"), "stop_sequences", "stop_sequences must not be empty"},
		{"many stops", CheckStops(make([]string, 17), "stop", "stop sequences"), "stop", "at most 16 stop sequences"},
		{"stops ok", CheckStops([]string{"a"}, "stop", "stop sequences"), "", ""},
		{"unnamed tool", (&Request{Tools: []Tool{{Name: "f", Parameters: obj}, {Parameters: obj}}}).CheckTools(true, f), "tools[1].name", "tools[1].name is required"},
		{"no schema", (&Request{Tools: []Tool{{Name: "f", Parameters: obj}, {Name: "g"}}}).CheckTools(true, f), "tools[1].input_schema", "tools[1].input_schema is required (a JSON Schema object)"},
		{"null schema", (&Request{Tools: []Tool{{Name: "f", Parameters: json.RawMessage(" null")}}}).CheckTools(false, f), "tools[0].input_schema", "is required"},
		{"schema not an object", (&Request{Tools: []Tool{{Name: "f", Parameters: json.RawMessage(`"x"`)}}}).CheckTools(true, f), "tools[0].input_schema", "tools[0].input_schema must be a JSON Schema object"},
		{"schema an array", (&Request{Tools: []Tool{{Name: "f", Parameters: json.RawMessage(` [{}]`)}}}).CheckTools(true, f), "tools[0].input_schema", "must be a JSON Schema object"},
		{"schema ok", (&Request{Tools: []Tool{{Name: "f", Parameters: json.RawMessage(" \n{}")}}}).CheckTools(true, f), "", ""},
		{"choice without tools", (&Request{ToolChoice: &ToolChoice{Mode: "required"}}).CheckTools(true, f), "tool_choice", `tool_choice "any" needs tools`},
		{"tools refused", (&Request{Tools: tools}).CheckTools(false, f), "tools", "not supported"},
		{"choice refused", (&Request{ToolChoice: &ToolChoice{Mode: "function", Name: "f"}, Tools: tools}).CheckTools(true, f), "", ""},
		{"auto choice kept", (&Request{ToolChoice: &ToolChoice{Mode: "auto"}}).CheckTools(false, f), "", ""},
		{"format refused", (&Request{ResponseFormat: &ResponseFormat{Type: "json_object"}}).CheckTools(false, f), "response_format", `type "json_object"`},
		{"text format kept", (&Request{ResponseFormat: &ResponseFormat{Type: "text"}}).CheckTools(false, f), "", ""},
	} {
		switch {
		case c.field == "" && c.err != nil:
			t.Errorf("%s: %v", c.name, c.err)
		case c.field != "" && (c.err == nil || c.err.Field != c.field || !strings.Contains(c.err.Msg, c.substr)):
			t.Errorf("%s: %+v, want field %s with %q", c.name, c.err, c.field, c.substr)
		}
	}
}

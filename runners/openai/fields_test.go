package openai

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/gen"
)

// TestNoSilentIgnores: every field this server does not implement is a 400
// naming the JSON field (nested ones by their path); errors never name Go
// types.
func TestNoSilentIgnores(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, path, body, param string
	}{
		{"unknown top-level", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"reasoning_effort":"high"}`, "reasoning_effort"},
		{"echo on completions", "/v1/completions", `{"model":"tiny","prompt":"x","echo":true}`, "echo"},
		{"best_of", "/v1/completions", `{"model":"tiny","prompt":"x","best_of":2}`, "best_of"},
		{"suffix", "/v1/completions", `{"model":"tiny","prompt":"x","suffix":"y"}`, "suffix"},
		{"modalities audio", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"modalities":["text","audio"]}`, "modalities"},
		{"chat logprobs field on completions is an int", "/v1/completions", `{"model":"tiny","prompt":"x","logprobs":true}`, "logprobs"},
		{"unknown message key", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi","audio":{}}]}`, "messages[0].audio"},
		{"unknown content-part key", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"a","cache":1}]}]}`, "messages[0].content[0].cache"},
		{"unknown stream_options key", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"stream":true,"stream_options":{"x":1}}`, "stream_options.x"},
		{"tools refused until wired", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}`, "tools"},
		{"forced tool_choice refused", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"tool_choice":"required"}`, "tool_choice"},
		{"json_object refused until wired", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"response_format":{"type":"json_object"}}`, "response_format"},
		{"json_schema refused until wired", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}`, "response_format"},
		{"store true", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"store":true}`, "store"},
		{"top_logprobs over 20", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"logprobs":true,"top_logprobs":21}`, "top_logprobs"},
		{"top_logprobs without logprobs", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"top_logprobs":2}`, "top_logprobs"},
		{"presence_penalty range", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"presence_penalty":2.5}`, "presence_penalty"},
		{"frequency_penalty range", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"frequency_penalty":-3}`, "frequency_penalty"},
		{"logit_bias key", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"logit_bias":{"abc":1}}`, "logit_bias"},
		{"logit_bias value", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"logit_bias":{"5":101}}`, "logit_bias"},
		{"wrong type names the field", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":7,"content":"hi"}]}`, "messages[0].role"},
		{"tool parameters not an object", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]}`, "tools[0].function.parameters"},
		{"tool parameters an array", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}`, "tools[0].function.parameters"},
		{"tool message without id", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"tool","content":"42"}]}`, "messages[0].tool_call_id"},
		{"tool_calls on a user message", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"x","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[0].tool_calls"},
		{"reasoning_content on a user message", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"x","reasoning_content":"r"}]}`, "messages[0].reasoning_content"},
		{"null content without tool_calls", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"assistant","content":null}]}`, "messages[0].content"},
		{"continue a user message", "/v1/chat/completions", `{"model":"tiny",` + msgs + `,"continue_final_message":true}`, "continue_final_message"},
		{"continue and new turn", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"assistant","content":"a"}],"continue_final_message":true,"add_generation_prompt":true}`, "continue_final_message"},
		{"unknown detokenize key", "/detokenize", `{"model":"tiny","tokens":[1],"skip":true}`, "skip"},
		{"detokenize outside vocabulary", "/detokenize", `{"model":"tiny","tokens":[1,5000]}`, "tokens"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gen := &scriptGen{pieces: []string{"never"}, finish: "stop"}
			srv, _ := newTestServer(t, gen)
			resp, body := post(t, srv.URL+c.path, c.body)
			if resp.StatusCode != 400 {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, body)
			}
			if gen.got != nil {
				t.Fatal("the request reached the generator")
			}
			var eb ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil {
				t.Fatalf("not an OpenAI error: %s", body)
			}
			if eb.Error.Param == nil || *eb.Error.Param != c.param || !strings.Contains(eb.Error.Message, c.param) {
				t.Fatalf("error %s does not name %q", body, c.param)
			}
			for _, goName := range []string{"Go ", "float64", "int64", "openai.", "Request", "SamplingFields", "struct"} {
				if strings.Contains(eb.Error.Message, goName) {
					t.Fatalf("error names a Go type (%q): %s", goName, eb.Error.Message)
				}
			}
		})
	}
}

// TestAcceptedFields: the documented harmless fields, tool-call history,
// and the kept-for-later tool fields that need no grammar engine.
func TestAcceptedFields(t *testing.T) {
	cases := []struct{ name, body string }{
		{"harmless", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"user":"u1","metadata":{"a":"b"},"store":false,"parallel_tool_calls":true,"tool_choice":"none","response_format":{"type":"text"},"tools":[]}`},
		{"tool history", `{"model":"tiny","messages":[{"role":"user","content":"weather?"},
			{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			{"role":"tool","tool_call_id":"call_1","content":"18C"}]}`},
		// a null asks for nothing: clients that write every field of their
		// model (null when unset) are served, at any depth
		// the default values of fields this server does not implement ask for nothing
		{"defaults of unimplemented fields", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"modalities":["text"]}`},
		{"null unknown fields", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":null}],"audio":null}],
			"audio":null,"functions":null,"function_call":null,"service_tier":null,"prediction":null,"reasoning_effort":null,"web_search_options":null}`},
	}
	for _, c := range cases {
		gen := &scriptGen{pieces: []string{"ok"}, finish: "stop"}
		srv, _ := newTestServer(t, gen)
		resp, body := post(t, srv.URL+"/v1/chat/completions", c.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", c.name, resp.StatusCode, body)
		}
	}
	gen := &scriptGen{finish: "stop"}
	srv, _ := newTestServer(t, gen)
	post(t, srv.URL+"/v1/chat/completions", cases[1].body)
	m := gen.got.Messages
	if len(m) != 3 || m[1].Content != "" || len(m[1].ToolCalls) != 1 || m[1].ToolCalls[0].Name != "get_weather" ||
		m[1].ToolCalls[0].Arguments != `{"city":"Paris"}` || m[2].Role != "tool" || m[2].ToolCallID != "call_1" {
		t.Fatalf("tool history converted wrong: %+v", m)
	}
}

// TestToolsKeptWhenAccepted: with AcceptTools the parsed fields reach the
// generator (the seam the grammar engine plugs into).
func TestToolsKeptWhenAccepted(t *testing.T) {
	v := Validator{Served: func(string) bool { return true }, AcceptTools: true}
	var r ChatRequest
	body := `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
		"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false,"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object"},"strict":true}}}`
	if e := decodeJSON([]byte(body), &r, chatShape); e != nil {
		t.Fatal(e)
	}
	g, e := v.ValidateChat(&r)
	if e != nil {
		t.Fatal(e)
	}
	if len(g.Tools) != 1 || string(g.Tools[0].Parameters) != `{"type":"object"}` || g.ToolChoice.Mode != "function" ||
		g.ToolChoice.Name != "f" || *g.ParallelToolCalls || g.ResponseFormat.Name != "s" {
		t.Fatalf("%+v", g)
	}
}

func TestPrefillDecision(t *testing.T) {
	tr, fa := true, false
	cases := []struct {
		name      string
		last      string
		agp, cont *bool
		wantAGP   bool
		wantCont  bool
	}{
		{"user last: new turn", "user", nil, nil, true, false},
		{"assistant last: continue", "assistant", nil, nil, false, true},
		{"assistant last, new turn asked", "assistant", &tr, nil, true, false},
		{"assistant last, continue off", "assistant", nil, &fa, true, false},
		{"no generation prompt", "user", &fa, nil, false, false},
		{"empty assistant last: new turn", "assistant-empty", nil, nil, true, false},
	}
	v := Validator{Served: func(string) bool { return true }}
	for _, c := range cases {
		last := Message{Role: c.last, Content: Content{Text: "a", Set: true}}
		if c.last == "assistant-empty" {
			last = Message{Role: "assistant", Content: Content{Text: " ", Set: true}}
		}
		r := ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: Content{Text: "q", Set: true}}, last},
			AddGenerationPrompt: c.agp, ContinueFinalMessage: c.cont}
		g, e := v.ValidateChat(&r)
		if e != nil {
			t.Fatalf("%s: %v", c.name, e)
		}
		if g.AddGenerationPrompt != c.wantAGP || g.ContinueFinal != c.wantCont {
			t.Fatalf("%s: agp %v cont %v", c.name, g.AddGenerationPrompt, g.ContinueFinal)
		}
	}
}

// TestReasoningContentReachesTheGenerator: an assistant message's
// reasoning_content (as this server returned it) is passed on, for the
// generator to render or refuse by the model's template.
func TestReasoningContentReachesTheGenerator(t *testing.T) {
	gen := &scriptGen{pieces: []string{"ok"}, finish: "stop"}
	srv, _ := newTestServer(t, gen)
	resp, body := post(t, srv.URL+"/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"q"},`+
		`{"role":"assistant","content":null,"reasoning_content":"Need f.","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},`+
		`{"role":"tool","tool_call_id":"c","content":"1"}]}`)
	if resp.StatusCode != 200 || gen.got == nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if m := gen.got.Messages[1]; m.Reasoning != "Need f." || m.Content != "" || len(m.ToolCalls) != 1 || gen.got.Messages[0].Reasoning != "" {
		t.Fatalf("%+v", gen.got.Messages)
	}
}

func TestDefaultsPrecedence(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	k := 7
	v := Validator{Served: func(string) bool { return true }, Defaults: gen.Defaults{Temperature: f(0.6), TopP: f(0.9), TopK: &k, RepetitionPenalty: f(1.1)}}
	r := ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: Content{Text: "q", Set: true}}}}
	r.TopP = f(0.5)
	g, e := v.ValidateChat(&r)
	if e != nil {
		t.Fatal(e)
	}
	s := g.Sampling
	if s.Temperature != 0.6 || s.TopP != 0.5 || s.TopK != 7 || s.RepetitionPenalty != 1.1 || s.MinP != 0 || s.SeedSet {
		t.Fatalf("%+v", s)
	}
	if err := (gen.Defaults{Temperature: f(3)}).Check(); err == nil || !strings.Contains(err.Error(), "temperature") {
		t.Fatalf("bad default accepted: %v", err)
	}
}

// lpGen emits two tokens with logprobs.
type lpGen struct{ scriptGen }

func (g *lpGen) Generate(ctx context.Context, req *gen.Request, em gen.Emitter) (gen.Result, error) {
	g.got = req
	_ = em.Start(3)
	_ = em.Text("Hi", &gen.TokenLogprob{Bytes: []byte("Hi"), Logprob: -0.5, Top: []gen.TopToken{{Bytes: []byte("Hi"), Logprob: -0.5}, {Bytes: []byte("Yo"), Logprob: -1.25}}})
	_ = em.Text("", &gen.TokenLogprob{Bytes: []byte{0xe2, 0x82}, Logprob: math.Inf(-1)})
	return gen.Result{PromptTokens: 3, CompletionTokens: 2, FinishReason: "length"}, nil
}

func TestLogprobsShapes(t *testing.T) {
	for _, c := range []struct{ name, path, body string }{
		{"chat_logprobs", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":2}`},
		{"chat_logprobs_stream", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":2,"stream":true}`},
		{"completion_logprobs", "/v1/completions", `{"model":"tiny","prompt":"hi","logprobs":2}`},
		{"completion_logprobs_stream", "/v1/completions", `{"model":"tiny","prompt":"hi","logprobs":2,"stream":true}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			gen := &lpGen{}
			srv, _ := newTestServer(t, gen)
			resp, body := post(t, srv.URL+c.path, c.body)
			if resp.StatusCode != 200 || !gen.got.Logprobs || gen.got.TopLogprobs != 2 {
				t.Fatalf("%d %s %+v", resp.StatusCode, body, gen.got)
			}
			golden(t, c.name, body)
		})
	}
}

func TestDetokenize(t *testing.T) {
	srv, _ := newTestServer(t, &scriptGen{})
	resp, body := post(t, srv.URL+"/detokenize", `{"model":"tiny","tokens":[1,2,3]}`)
	var dr DetokenizeResponse
	if err := json.Unmarshal([]byte(body), &dr); err != nil || resp.StatusCode != 200 || dr.Prompt != "<1><2><3>" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestToolWithoutParameters: OpenAI defines a function whose parameters
// are omitted (or null) as one with an empty parameter list, so its calls
// must have no arguments, not any object the model writes.
func TestToolWithoutParameters(t *testing.T) {
	v := Validator{Served: func(string) bool { return true }, AcceptTools: true}
	for _, params := range []string{``, `,"parameters":null`} {
		var r ChatRequest
		body := `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"ping"` + params + `}}],"tool_choice":"required"}`
		if e := decodeJSON([]byte(body), &r, chatShape); e != nil {
			t.Fatal(e)
		}
		g, e := v.ValidateChat(&r)
		if e != nil {
			t.Fatal(e)
		}
		if got := string(g.Tools[0].Parameters); got != NoParameters {
			t.Errorf("parameters %q: the tool's schema is %q, want %s", params, got, NoParameters)
		}
	}
}

// TestDecodeErrorsNameTheField: a value of the wrong type or out of range
// is a 400 naming its JSON path, even where a field decodes itself
// (content, stop, tool_choice) or the number does not fit, and the
// message names no Go type.
func TestDecodeErrorsNameTheField(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct{ body, param, has string }{
		{`{"model":"tiny",` + msgs + `,"stop":5}`, "stop", "stop must be a string or an array of strings"},
		{`{"model":"tiny",` + msgs + `,"tool_choice":5}`, "tool_choice", "tool_choice must be"},
		{`{"model":"tiny",` + msgs + `,"temperature":1e999}`, "temperature", "temperature"},
		{`{"model":"tiny",` + msgs + `,"max_tokens":1e30}`, "max_tokens", "max_tokens"},
		{`{"model":"tiny","messages":[{"role":"user","content":"hi"},{"role":"user","content":5}]}`, "messages[1].content", "content must be a string or an array of text parts"},
		{`{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`, "messages[0].content[1]", "image_url"},
		{`{"model":"tiny","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":{}}}]}]}`,
			"messages[0].tool_calls[0].function.arguments", "arguments must be a string"},
		// each type that decodes itself reports where, as does every
		// array element on the way there
		{`{"model":"tiny","messages":[{"role":"user","content":"hi"},{"role":5,"content":"x"}]}`, "messages[1].role", "messages[1].role must be a string, got number"},
		{`{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":7}]}]}`, "messages[0].content[1].text", "messages[0].content[1].text must be a string, got number"},
		{`{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`, "messages[0].content[1]", `got part type "image_url"`},
		{`{"model":"tiny",` + msgs + `,"stop":["a",5]}`, "stop[1]", "stop[1] must be a string, got number"},
		{`{"model":"tiny",` + msgs + `,"stop":{"a":1}}`, "stop", "stop must be a string or an array of strings, got object"},
		{`{"model":"tiny",` + msgs + `,"tool_choice":"always"}`, "tool_choice", `got string "always"`},
		{`{"model":"tiny",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":5}}]}`, "tools[1].function.name", "must be a string"},
		{`{"model":"tiny","messages":{"role":"user"}}`, "messages", "messages must be an array, got object"},
		{`{"model":"tiny","messages":[5]}`, "messages[0]", "messages[0] must be an object, got number"},
		{`{"model":"tiny",` + msgs + `,"modalities":["text",1]}`, "modalities[1]", "must be a string"},
		{`{"model":"tiny",` + msgs + `,"logprobs":"yes"}`, "logprobs", "logprobs must be a boolean, got string"},
	} {
		var r ChatRequest
		e := decodeJSON([]byte(c.body), &r, chatShape)
		if e == nil || e.Param != c.param || !strings.Contains(e.Message, c.has) {
			t.Errorf("%s: %+v, want %s naming %q", c.body, e, c.param, c.has)
			continue
		}
		for _, goName := range []string{"Go ", "float64", "int64", "openai.", "struct"} {
			if strings.Contains(e.Message, goName) {
				t.Errorf("%s: the error names a Go type (%q): %s", c.body, goName, e.Message)
			}
		}
	}
}

// TestCompletionDefaultsAccepted: echo false, best_of 1 and an empty
// suffix are the legacy completions' defaults: they ask for nothing and
// are served (clients that send every parameter send them).
func TestCompletionDefaultsAccepted(t *testing.T) {
	gen := &scriptGen{pieces: []string{"ok"}, finish: "stop"}
	srv, _ := newTestServer(t, gen)
	resp, body := post(t, srv.URL+"/v1/completions", `{"model":"tiny","prompt":"x","echo":false,"best_of":1,"suffix":""}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestDecodeErrorsNameThePathElsewhere: completions, tokenize, detokenize
// and the Responses API name the JSON path of a value that does not
// decode, array indices included.
func TestDecodeErrorsNameThePathElsewhere(t *testing.T) {
	for _, c := range []struct {
		body, param, has string
		v                any
		sh               Shape
	}{
		{`{"model":"tiny","prompt":[1,-2]}`, "prompt[1]", "prompt[1] is out of range: number -2", &CompletionRequest{}, completionShape},
		{`{"model":"tiny","prompt":[1,2.5]}`, "prompt[1]", "prompt[1] must be an integer, got number 2.5", &CompletionRequest{}, completionShape},
		{`{"model":"tiny","prompt":[1,"a"]}`, "prompt[1]", "prompt[1] must be an integer, got string", &CompletionRequest{}, completionShape},
		{`{"model":"tiny","prompt":[[1,2],[3]]}`, "prompt", "batched prompts are not supported", &CompletionRequest{}, completionShape},
		{`{"model":"tiny","prompt":[[1,-2]]}`, "prompt[0][1]", "out of range", &CompletionRequest{}, completionShape},
		{`{"model":"tiny","prompt":{}}`, "prompt", "prompt must be a string or an array of token ids, got object", &CompletionRequest{}, completionShape},
		{`{"model":"tiny","messages":[{"role":"user","content":5}]}`, "messages[0].content", "must be a string or an array of text parts", &TokenizeRequest{}, tokenizeShape},
		{`{"model":"tiny","tokens":[1,"x"]}`, "tokens[1]", "tokens[1] must be an integer, got string", &DetokenizeRequest{}, detokenizeShape},
		{`{"model":"tiny","input":5}`, "input", "input must be a string or an array of input items, got number", &ResponsesRequest{}, responsesShape},
		{`{"model":"tiny","input":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"input_text","text":1}]}]}`,
			"input[1].content[0].text", "input[1].content[0].text must be a string, got number", &ResponsesRequest{}, responsesShape},
		{`{"model":"tiny","input":[{"role":"user","content":true}]}`, "input[0].content", "must be a string or an array of content parts, got bool", &ResponsesRequest{}, responsesShape},
		{`{"model":"tiny","input":"x","include":["a",3]}`, "include[1]", "must be a string", &ResponsesRequest{}, responsesShape},
		{`{"model":"tiny","input":"x","tools":[{"type":"function","name":"f","strict":"yes"}]}`, "tools[0].strict", "must be a boolean", &ResponsesRequest{}, responsesShape},
	} {
		e := decodeJSON([]byte(c.body), c.v, c.sh)
		if e == nil || e.Param != c.param || !strings.Contains(e.Message, c.has) {
			t.Errorf("%s: %+v, want %s naming %q", c.body, e, c.param, c.has)
		}
	}
}

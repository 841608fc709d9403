package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestResponsesGolden(t *testing.T) {
	for _, c := range []struct {
		name, body string
		gen        *scriptGen
	}{
		{"responses", `{"model":"tiny","input":"hi","instructions":"Be brief.","max_output_tokens":20,"store":false}`,
			&scriptGen{pieces: []string{"Hel", "lo"}, finish: "stop"}},
		{"responses_stream", `{"model":"tiny","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"stream":true}`,
			&scriptGen{pieces: []string{"Hel", "lo"}, finish: "length"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, _ := newTestServer(t, c.gen)
			resp, body := post(t, srv.URL+"/v1/responses", c.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			golden(t, c.name, body)
		})
	}
}

func TestResponsesConversionAndErrors(t *testing.T) {
	gen := &scriptGen{finish: "stop"}
	srv, _ := newTestServer(t, gen)
	resp, body := post(t, srv.URL+"/v1/responses", `{"model":"tiny","instructions":"sys","temperature":0.3,"input":[
		{"role":"developer","content":"be nice"},{"type":"message","role":"user","content":"q"},
		{"role":"assistant","content":[{"type":"output_text","text":"The answer","annotations":[]}]}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	m := gen.got.Messages
	if len(m) != 4 || m[0].Content != "sys" || m[1].Role != "system" || m[3].Content != "The answer" || !gen.got.ContinueFinal || gen.got.Sampling.Temperature != 0.3 {
		t.Fatalf("%+v", gen.got)
	}
	for _, c := range []struct{ body, param string }{
		{`{"model":"tiny","input":"x","tools":[{"type":"function","name":"f"}]}`, "tools"},
		{`{"model":"tiny","input":"x","store":true}`, "store"},
		{`{"model":"tiny","input":"x","previous_response_id":"resp_1"}`, "previous_response_id"},
		{`{"model":"tiny","input":"x","reasoning":{"effort":"low"}}`, "reasoning"},
		{`{"model":"tiny","input":"x","truncation":"auto"}`, "truncation"},
		{`{"model":"tiny","input":"x","include":["message.output_text.logprobs"]}`, "include"},
		{`{"model":"tiny","input":"x","text":{"format":{"type":"json_object"}}}`, "text.format"}, // without AcceptTools
		{`{"model":"tiny","input":"x","text":{"format":{"type":"json_schema"}}}`, "text.format.schema"},
		{`{"model":"tiny","input":"x","text":{"format":{"type":"json_schema","name":"p","schema":null}}}`, "text.format.schema"},
		{`{"model":"tiny","input":"x","text":{"format":{"type":"xml"}}}`, "text.format.type"},
		// a json_schema format's fields beside another type: refused, as
		// OpenAI's text and json_object formats have only "type"
		{`{"model":"tiny","input":"x","text":{"format":{"type":"text","name":"p"}}}`, "text.format.name"},
		{`{"model":"tiny","input":"x","text":{"format":{"type":"text","description":"d"}}}`, "text.format.description"},
		{`{"model":"tiny","input":"x","text":{"format":{"type":"json_object","schema":{"type":"object"}}}}`, "text.format.schema"},
		{`{"model":"tiny","input":"x","text":{"format":{"type":"json_object","strict":false}}}`, "text.format.strict"},
		{`{"model":"tiny","input":[{"type":"function_call_output","call_id":"c","output":"1"}]}`, "input[0].type"},
		{`{"model":"tiny","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].type"},
		{`{"model":"tiny","instructions":"s","input":[{"role":"wizard","content":"x"}]}`, "input[0].role"},
		{`{"model":"tiny","input":"x","max_output_tokens":0}`, "max_output_tokens"},
		{`{"model":"tiny"}`, "input"},
	} {
		gen := &scriptGen{}
		srv, _ := newTestServer(t, gen)
		resp, body := post(t, srv.URL+"/v1/responses", c.body)
		var eb ErrorBody
		if json.Unmarshal([]byte(body), &eb) != nil || resp.StatusCode != 400 || eb.Error.Param == nil || *eb.Error.Param != c.param || gen.got != nil {
			t.Errorf("%s: %d %s (want param %s)", c.body, resp.StatusCode, body, c.param)
		}
		if !strings.Contains(eb.Error.Message, c.param) {
			t.Errorf("message %q does not name %s", eb.Error.Message, c.param)
		}
	}
}

func FuzzResponsesRequest(f *testing.F) {
	f.Add(`{"model":"tiny","input":"hi","instructions":"s","max_output_tokens":3}`)
	f.Add(`{"model":"tiny","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"function_call"}]}`)
	f.Add(`{"model":"tiny","instructions":"s","input":[{"role":"wizard","content":"x"}]}`)
	h := &Handler{Served: []string{"tiny"}}
	f.Fuzz(func(t *testing.T, s string) {
		if responsesItemTypes([]byte(s), true) != nil {
			return
		}
		var r ResponsesRequest
		if decodeJSON([]byte(s), &r, responsesShape) == nil {
			_, _ = h.convertResponses(&r)
		}
	})
}

// TestResponsesToolsKeptWhenAccepted: with AcceptTools, function tools and
// function_call / function_call_output items become the generation
// request's tools and OpenAI-shaped history.
func TestResponsesToolsKeptWhenAccepted(t *testing.T) {
	h := &Handler{Served: []string{"tiny"}, AcceptTools: true}
	body := `{"model":"tiny","tool_choice":"required","parallel_tool_calls":true,
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"},"strict":true}],
		"input":[{"role":"user","content":"Weather in Paris and Rome?"},
		{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call","call_id":"c2","name":"get_weather","arguments":"{\"city\":\"Rome\"}"},
		{"type":"function_call_output","call_id":"c1","output":"18C"},
		{"type":"function_call_output","call_id":"c2","output":"22C"}]}`
	if e := responsesItemTypes([]byte(body), true); e != nil {
		t.Fatal(e)
	}
	var r ResponsesRequest
	if e := decodeJSON([]byte(body), &r, responsesShape); e != nil {
		t.Fatal(e)
	}
	g, e := h.convertResponses(&r)
	if e != nil {
		t.Fatal(e)
	}
	m := g.Messages
	if len(g.Tools) != 1 || g.Tools[0].Name != "get_weather" || g.ToolChoice.Mode != "required" || !*g.ParallelToolCalls {
		t.Fatalf("%+v", g)
	}
	if len(m) != 4 || m[1].Role != "assistant" || len(m[1].ToolCalls) != 2 || m[1].ToolCalls[1].Arguments != `{"city":"Rome"}` ||
		m[2].Role != "tool" || m[2].ToolCallID != "c1" || m[3].Content != "22C" || !g.AddGenerationPrompt {
		t.Fatalf("%+v", m)
	}
	if e := responsesItemTypes([]byte(body), false); e == nil || e.Param != "input[1].type" {
		t.Fatalf("without AcceptTools: %v", e)
	}
}

// TestResponsesStreamMatchesCreate: a streamed response ends with the
// non-streamed one's output, its items added at the output indices they
// end at and its deltas sent to those; an answer that is only function
// calls has no (empty) message item before them, as OpenAI's has none.
func TestResponsesStreamMatchesCreate(t *testing.T) {
	for _, c := range []struct {
		name  string
		gen   scriptGen
		types []string
	}{
		{"text", scriptGen{pieces: []string{"Hel", "lo"}, finish: "stop"}, []string{"message"}},
		{"nothing", scriptGen{finish: "stop"}, []string{"message"}},
		{"calls only", scriptGen{calls: []scriptCall{{"get_weather", []string{`{"city":`, `"Paris"}`}}, {"get_time", nil}}, finish: "tool_calls"},
			[]string{"function_call", "function_call"}},
		{"text then call", scriptGen{pieces: []string{"Checking."}, calls: []scriptCall{{"get_weather", []string{`{}`}}}, finish: "tool_calls"},
			[]string{"message", "function_call"}},
		// output items in generation order, as OpenAI's: text after a
		// call is a new message item after it
		{"call then text", scriptGen{calls: []scriptCall{{"get_weather", []string{`{}`}}}, after: []string{"Asked."}, finish: "tool_calls"},
			[]string{"function_call", "message"}},
		{"text, calls, text", scriptGen{pieces: []string{"Checking."}, calls: []scriptCall{{"get_weather", []string{`{}`}}, {"get_time", nil}},
			after: []string{"Asked ", "both."}, finish: "tool_calls"}, []string{"message", "function_call", "function_call", "message"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := c.gen
			srv, _ := newTestServerWith(t, &g, true)
			req := `{"model":"tiny","input":"hi",%s"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},{"type":"function","name":"get_time","parameters":{"type":"object"}}]}`
			resp, body := post(t, srv.URL+"/v1/responses", fmt.Sprintf(req, ""))
			var created struct{ Output []map[string]any }
			if err := json.Unmarshal([]byte(body), &created); resp.StatusCode != 200 || err != nil {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			var types []string
			for _, it := range created.Output {
				types = append(types, it["type"].(string))
			}
			if fmt.Sprint(types) != fmt.Sprint(c.types) {
				t.Fatalf("output items %v, want %v: %s", types, c.types, body)
			}
			g = c.gen
			resp, stream := post(t, srv.URL+"/v1/responses", fmt.Sprintf(req, `"stream":true,`))
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, stream)
			}
			var final []map[string]any
			added := map[float64]string{} // output index → item type
			for _, line := range strings.Split(stream, "\n") {
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok {
					continue
				}
				var ev map[string]any
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Fatal(err)
				}
				idx, hasIdx := ev["output_index"].(float64)
				switch ev["type"] {
				case "response.output_item.added":
					if _, dup := added[idx]; dup || int(idx) != len(added) {
						t.Fatalf("item added at output index %v after %d items", idx, len(added))
					}
					added[idx] = ev["item"].(map[string]any)["type"].(string)
				case "response.output_text.delta", "response.content_part.added":
					if added[idx] != "message" {
						t.Fatalf("%s at output index %v, a %q", ev["type"], idx, added[idx])
					}
				case "response.function_call_arguments.delta":
					if added[idx] != "function_call" {
						t.Fatalf("arguments delta at output index %v, a %q", idx, added[idx])
					}
				case "response.completed", "response.incomplete":
					b, _ := json.Marshal(ev["response"].(map[string]any)["output"])
					_ = json.Unmarshal(b, &final)
				}
				if hasIdx && int(idx) >= len(c.types) {
					t.Fatalf("output index %v of %d items", idx, len(c.types))
				}
			}
			want, _ := json.Marshal(created.Output)
			got, _ := json.Marshal(final)
			if string(want) != string(got) {
				t.Fatalf("stream ends with %s\ncreate gives    %s", got, want)
			}
		})
	}
}

// TestResponsesGeneratorErrorsNameInput: an error the generator blames on
// the chat messages (a prompt over the context) names the Responses
// API's own field, input.
func TestResponsesGeneratorErrorsNameInput(t *testing.T) {
	g := &scriptGen{failPre: &Error{Status: 400, Type: "invalid_request_error", Param: "messages", Code: "context_length_exceeded",
		Message: "the prompt has 9000 tokens; this model's context is 8192 tokens"}}
	srv, _ := newTestServer(t, g)
	for _, stream := range []string{"false", "true"} {
		resp, body := post(t, srv.URL+"/v1/responses", `{"model":"tiny","input":"hi","stream":`+stream+`}`)
		var eb ErrorBody
		if err := json.Unmarshal([]byte(body), &eb); err != nil || resp.StatusCode != 400 || eb.Error.Param == nil || *eb.Error.Param != "input" {
			t.Errorf("stream %s: %d %s, want 400 naming input", stream, resp.StatusCode, body)
		}
	}
}

// TestResponsesToolErrorsNameResponsesFields: a tool's field in an error
// is where the Responses API has it (tools[i].parameters).
func TestResponsesToolErrorsNameResponsesFields(t *testing.T) {
	srv, _ := newTestServerWith(t, &scriptGen{finish: "stop"}, true)
	for _, c := range []struct{ tools, param, has string }{
		{`[{"type":"function","name":"f","parameters":"x"}]`, "tools[0].parameters", "tools[0].parameters must be a JSON Schema object"},
		{`[{"type":"function","name":"f"},{"type":"function","name":"","parameters":{}}]`, "tools[1].name", "tools[1].name is required"},
		{`[{"type":"function","name":"f"}]`, "", ""}, // no parameters: none (OpenAI's rule)
	} {
		resp, body := post(t, srv.URL+"/v1/responses", `{"model":"tiny","input":"hi","tools":`+c.tools+`}`)
		var eb ErrorBody
		if c.param == "" {
			if resp.StatusCode != 200 {
				t.Errorf("%s: %d %s", c.tools, resp.StatusCode, body)
			}
			continue
		}
		if err := json.Unmarshal([]byte(body), &eb); err != nil || resp.StatusCode != 400 || eb.Error.Param == nil ||
			*eb.Error.Param != c.param || !strings.Contains(eb.Error.Message, c.has) {
			t.Errorf("%s: %d %s, want %s with %q", c.tools, resp.StatusCode, body, c.param, c.has)
		}
	}
}

// TestResponsesTextFormat: the Responses API's structured outputs
// (text.format json_schema, flat, or json_object) become the generation
// request's response format (the SDK's responses.parse sends them), and
// the response echoes the format.
func TestResponsesTextFormat(t *testing.T) {
	g := &scriptGen{pieces: []string{`{"a":1}`}, finish: "stop"}
	srv, _ := newTestServerWith(t, g, true)
	resp, body := post(t, srv.URL+"/v1/responses", `{"model":"tiny","input":"hi","text":{"format":{"type":"json_schema","name":"p","description":"d",
		"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},"strict":true}}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	rf := g.got.ResponseFormat
	if rf == nil || rf.Type != "json_schema" || rf.Name != "p" || !strings.Contains(string(rf.Schema), `"additionalProperties":false`) {
		t.Fatalf("response format %+v", rf)
	}
	if !strings.Contains(body, `"text":{"format":{"type":"json_schema"`) {
		t.Fatalf("the response does not echo the format: %s", body)
	}
	g.got = nil
	resp, body = post(t, srv.URL+"/v1/responses", `{"model":"tiny","input":"hi","text":{"format":{"type":"json_object"}}}`)
	if resp.StatusCode != 200 || g.got.ResponseFormat == nil || g.got.ResponseFormat.Type != "json_object" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = post(t, srv.URL+"/v1/responses", `{"model":"tiny","input":"hi","text":{"format":{"type":"json_schema","name":"p"}}}`)
	if resp.StatusCode != 400 || !strings.Contains(body, `"param":"text.format.schema"`) {
		t.Fatalf("a json_schema format without schema: %d %s", resp.StatusCode, body)
	}
}

// TestResponsesDefaultsAccepted: truncation "disabled" and an empty
// include are the API's defaults: they ask for nothing and are served.
func TestResponsesDefaultsAccepted(t *testing.T) {
	srv, _ := newTestServer(t, &scriptGen{pieces: []string{"ok"}, finish: "stop"})
	resp, body := post(t, srv.URL+"/v1/responses", `{"model":"tiny","input":"hi","truncation":"disabled","include":[]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestSDKResponsesOrder: the official openai client reads a response of
// text, a function call, then text as three output items in that order,
// the same from responses.create and from the stream. Skips where python3
// cannot import openai.
func TestSDKResponsesOrder(t *testing.T) {
	if exec.Command("python3", "-c", "import openai").Run() != nil {
		t.Skip("python3 cannot import openai")
	}
	g := &scriptGen{pieces: []string{"Let me ", "check."}, calls: []scriptCall{{"get_weather", []string{`{}`}}},
		after: []string{"Asked."}, finish: "tool_calls"}
	mux := http.NewServeMux()
	(&Handler{Gen: g, Served: []string{"tiny"}, AcceptTools: true}).Register(mux) // random ids: each item its own
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	out, err := exec.Command("python3", filepath.Join("testdata", "sdk_responses.py"), srv.URL).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("openai client: %v\n%s", err, stderr)
	}
	t.Logf("openai client: %s", out)
	var got map[string][]map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	want := []map[string]string{{"type": "message", "text": "Let me check."}, {"type": "function_call", "name": "get_weather"}, {"type": "message", "text": "Asked."}}
	for _, form := range []string{"whole", "stream"} {
		if !reflect.DeepEqual(got[form], want) {
			t.Errorf("%s: %v, want %v", form, got[form], want)
		}
	}
}

// TestResponsesForcedToolChoice: the Responses API names a forced function
// flat ({"type":"function","name":…}, not chat's nested "function" object);
// it reaches the generation request and the response echoes the choice as
// it was given. Chat's nested form is a 400 naming tool_choice there.
func TestResponsesForcedToolChoice(t *testing.T) {
	h := &Handler{Served: []string{"tiny"}, AcceptTools: true}
	tools := `"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"input":"Weather?"`
	for _, c := range []struct {
		choice, mode, name, echo string
	}{
		{`{"type":"function","name":"get_weather"}`, "function", "get_weather", `{"name":"get_weather","type":"function"}`},
		{`"required"`, "required", "", `"required"`},
		{`"none"`, "none", "", `"none"`},
		{``, "", "", `"auto"`},
	} {
		body := `{"model":"tiny",` + tools
		if c.choice != "" {
			body += `,"tool_choice":` + c.choice
		}
		body += `}`
		var r ResponsesRequest
		if e := decodeJSON([]byte(body), &r, responsesShape); e != nil {
			t.Fatalf("%s: %v", c.choice, e)
		}
		g, e := h.convertResponses(&r)
		if e != nil {
			t.Fatalf("%s: %v", c.choice, e)
		}
		if c.mode != "" && (g.ToolChoice == nil || g.ToolChoice.Mode != c.mode || g.ToolChoice.Name != c.name) {
			t.Fatalf("%s: tool choice %+v", c.choice, g.ToolChoice)
		}
		echo, err := json.Marshal(h.responseObject("resp_1", &r, g, "completed").ToolChoice)
		if err != nil || string(echo) != c.echo {
			t.Fatalf("%s: echoed %s (%v), want %s", c.choice, echo, err, c.echo)
		}
	}
	var r ResponsesRequest
	body := `{"model":"tiny",` + tools + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}}`
	if e := decodeJSON([]byte(body), &r, responsesShape); e == nil || e.Param != "tool_choice" {
		t.Fatalf("chat's nested form on /v1/responses: %v", e)
	}
}

// TestResponsesItemFieldsBelongToTheirType: an input item carrying a field
// of another item type (content on a function_call_output, output or
// call_id on a message, arguments on an output) is a 400 naming it, not
// dropped; each type's own fields pass.
func TestResponsesItemFieldsBelongToTheirType(t *testing.T) {
	for _, c := range []struct{ item, param string }{
		{`{"role":"user","content":"hi","id":"m1","status":"completed"}`, ""},
		{`{"type":"message","role":"user","content":"hi"}`, ""},
		{`{"type":"function_call","call_id":"c","name":"f","arguments":"{}","id":"fc1","status":"completed"}`, ""},
		{`{"type":"function_call_output","call_id":"c","output":"o"}`, ""},
		{`{"type":"function_call_output","call_id":"c","output":"o","content":"x"}`, "input[0].content"},
		{`{"type":"function_call_output","call_id":"c","output":"o","arguments":"{}"}`, "input[0].arguments"},
		{`{"type":"function_call","call_id":"c","name":"f","arguments":"{}","role":"assistant"}`, "input[0].role"},
		{`{"role":"user","content":"hi","call_id":"c"}`, "input[0].call_id"},
		{`{"type":"message","role":"user","content":"hi","output":"o"}`, "input[0].output"},
	} {
		body := `{"model":"tiny","input":[` + c.item + `]}`
		e := responsesItemTypes([]byte(body), true)
		switch {
		case c.param == "" && e != nil:
			t.Errorf("%s: %v", c.item, e)
		case c.param != "" && (e == nil || e.Param != c.param):
			t.Errorf("%s: got %v, want a 400 naming %s", c.item, e, c.param)
		}
	}
}

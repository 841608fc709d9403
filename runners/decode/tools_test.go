package decode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/grammar"
	"github.com/exo-pd/exo-pd/runners/openai"
	"github.com/exo-pd/exo-pd/runners/tokenizer"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// newGrammarServer is newTinyServer with the grammar engine wired as the
// exo runner wires it.
func newGrammarServer(t *testing.T) *tinyServer {
	t.Helper()
	return startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2, MaxPositions: 2048}, func(text Text, o *Options) {
		g := &Grammars{Text: text}
		o.NewConstraint, o.AcceptTools = g.NewConstraint, true
	})
}

type toolChatOut struct {
	Choices []struct {
		Message struct {
			Content   *string                `json:"content"`
			ToolCalls []openai.ToolCallDelta `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

const personSchema = `{"type":"object","properties":{"name":{"type":"string","maxLength":6},"age":{"type":"integer"},
 "pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":3},"role":{"anyOf":[{"const":"admin"},{"type":"null"}]}},
 "required":["name","age","pets","role"],"additionalProperties":false}`

func validator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validate(t *testing.T, v *jsonschema.Schema, text string) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%q is not JSON: %v", text, err)
	}
	if err := v.Validate(inst); err != nil {
		t.Fatalf("%q does not validate: %v", text, err)
	}
}

// TestResponseFormatJSONSchema: a random-weight model at temperature 1
// answers, under the grammar, JSON that the independent validator accepts.
func TestResponseFormatJSONSchema(t *testing.T) {
	s := newGrammarServer(t)
	v := validator(t, personSchema)
	rf := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person", "strict": true, "schema": json.RawMessage(personSchema)}}
	for seed := range 4 {
		var out toolChatOut
		body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "a person"}},
			"max_tokens": 400, "temperature": 1, "seed": seed, "response_format": rf}
		if code := s.post(t, "/v1/chat/completions", body, &out); code != 200 {
			t.Fatalf("status %d", code)
		}
		c := out.Choices[0]
		if c.FinishReason != "stop" || c.Message.Content == nil {
			t.Fatalf("seed %d: finish %q content %v", seed, c.FinishReason, c.Message.Content)
		}
		validate(t, v, *c.Message.Content)
	}
	// json_object: whatever comes is a prefix of a JSON object, whole when
	// the model stopped.
	var out toolChatOut
	body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "json"}},
		"max_tokens": 60, "temperature": 1, "seed": 3, "response_format": map[string]any{"type": "json_object"}}
	if code := s.post(t, "/v1/chat/completions", body, &out); code != 200 {
		t.Fatalf("status %d", code)
	}
	text := *out.Choices[0].Message.Content
	m := grammar.AnyJSONObject().NewMatcher()
	if err := m.Advance([]byte(text)); err != nil {
		t.Fatalf("json_object output %q: %v", text, err)
	}
	if out.Choices[0].FinishReason == "stop" && !json.Valid([]byte(text)) {
		t.Fatalf("json_object output %q stopped but is not JSON", text)
	}
}

func TestResponseFormatErrors(t *testing.T) {
	s := newGrammarServer(t)
	for _, c := range []struct {
		extra map[string]any
		want  string
	}{
		{map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x",
			"schema": map[string]any{"type": "object", "patternProperties": map[string]any{"^a": map[string]any{}}}}}}, "patternProperties"},
		// A schema that admits no document is refused before any work (it
		// once held the model to whitespace until nothing was allowed: a 500).
		{map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x",
			"schema": map[string]any{"anyOf": []any{false, false}}}}}, "admits no JSON document"},
		{map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x",
			"schema": false}}}, "admits no JSON document"},
		{map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x",
			"schema": map[string]any{"$ref": "#/$defs/n", "$defs": map[string]any{"n": false}}}}}, "admits no JSON document"},
		{map[string]any{"tools": weatherTools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}, "nope"},
		{map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "strict": true,
			"parameters": map[string]any{"type": "object", "patternProperties": map[string]any{"^s": map[string]any{"type": "string"}}}}}}}, "strict"},
	} {
		body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "x"}}, "max_tokens": 4}
		for k, v := range c.extra {
			body[k] = v
		}
		raw, _ := json.Marshal(body)
		resp, err := http.Post(s.url+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Message, Param string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("%v: status %d %+v, want 400 naming %q", c.extra, resp.StatusCode, e, c.want)
		}
	}
}

var weatherTools = []map[string]any{
	{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Weather in a city",
		"parameters": json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","maxLength":8},"unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}`)}},
	{"type": "function", "function": map[string]any{"name": "add",
		"parameters": json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`)}},
}

// TestToolChoiceRequired: a forced call comes back as message.tool_calls
// with finish_reason "tool_calls", its arguments valid under the tool's
// schema; streamed with the same seed, the delta.tool_calls fragments
// reassemble into the same calls.
func TestToolChoiceRequired(t *testing.T) {
	s := newGrammarServer(t)
	vals := map[string]*jsonschema.Schema{}
	for _, tl := range weatherTools {
		fn := tl["function"].(map[string]any)
		vals[fn["name"].(string)] = validator(t, string(fn["parameters"].(json.RawMessage)))
	}
	for seed := range 3 {
		body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "weather in Oslo?"}},
			"max_tokens": 800, "temperature": 1, "seed": seed, "tools": weatherTools, "tool_choice": "required", "parallel_tool_calls": seed == 1}
		if seed == 2 {
			body["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": "add"}}
		}
		var out toolChatOut
		if code := s.post(t, "/v1/chat/completions", body, &out); code != 200 {
			t.Fatalf("status %d", code)
		}
		c := out.Choices[0]
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) == 0 {
			t.Fatalf("seed %d: finish %q calls %+v content %v", seed, c.FinishReason, c.Message.ToolCalls, c.Message.Content)
		}
		var calls [][2]string
		for _, tc := range c.Message.ToolCalls {
			if !strings.HasPrefix(tc.ID, "call_") || tc.Type != "function" {
				t.Fatalf("call %+v: want an id and type function", tc)
			}
			v, ok := vals[tc.Function.Name]
			if !ok || seed == 2 && tc.Function.Name != "add" {
				t.Fatalf("seed %d: call of %q", seed, tc.Function.Name)
			}
			validate(t, v, tc.Function.Arguments)
			calls = append(calls, [2]string{tc.Function.Name, tc.Function.Arguments})
		}
		body["stream"] = true
		if got := streamedCalls(t, s, body); !reflect.DeepEqual(got, calls) {
			t.Fatalf("seed %d: streamed calls %q, non-streamed %q", seed, got, calls)
		}
	}
}

// streamedCalls reassembles delta.tool_calls as an OpenAI client does.
func streamedCalls(t *testing.T, s *tinyServer, body map[string]any) [][2]string {
	t.Helper()
	deltas, finish := streamDeltas(t, s.url, body)
	var calls [][2]string
	for _, d := range deltas {
		if d.HasContent {
			continue
		}
		for len(calls) <= d.Index {
			calls = append(calls, [2]string{})
		}
		calls[d.Index][0] += d.Name
		calls[d.Index][1] += d.Args
	}
	if finish != "tool_calls" {
		t.Fatalf("stream finish_reason %q", finish)
	}
	return calls
}

// TestResponsesFunctionCall: the Responses API returns a forced call as a
// function_call output item, and streams it as output_item.added plus
// function_call_arguments deltas that add up to the same arguments.
func TestResponsesFunctionCall(t *testing.T) {
	s := newGrammarServer(t)
	tools := []map[string]any{{"type": "function", "name": "add",
		"parameters": json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`)}}
	body := map[string]any{"model": "m", "input": "add 2 and 3", "max_output_tokens": 400, "temperature": 0,
		"tools": tools, "tool_choice": "required", "parallel_tool_calls": false}
	var out struct {
		Output []fcItem `json:"output"`
	}
	raw, _ := json.Marshal(body)
	resp, err := http.Post(s.url+"/v1/responses", "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(rb, &out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d %v: %s", resp.StatusCode, err, rb)
	}
	resp.Body.Close()
	var call *fcItem
	for i := range out.Output {
		if out.Output[i].Type == "function_call" && call == nil {
			call = &out.Output[i]
		}
	}
	if call == nil || call.Name != "add" || !strings.HasPrefix(call.CallID, "call_") {
		t.Fatalf("output %+v: want a function_call of add", out.Output)
	}
	validate(t, validator(t, `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`), call.Arguments)

	body["stream"] = true
	raw, _ = json.Marshal(body)
	resp, err = http.Post(s.url+"/v1/responses", "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var args, name string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string
			Delta string
			Item  struct{ Type, Name string }
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		switch {
		case ev.Type == "response.output_item.added" && ev.Item.Type == "function_call":
			name = ev.Item.Name
		case ev.Type == "response.function_call_arguments.delta":
			args += ev.Delta
		}
	}
	if name != "add" || args != call.Arguments {
		t.Fatalf("streamed %q %q, non-streamed %q %q", name, args, call.Name, call.Arguments)
	}
}

// tinyGrammars writes a one-layer tiny llama and returns the grammars of
// its chat template and tokenizer, and the tokenizer.
func tinyGrammars(t *testing.T) (*Grammars, *tokenizer.Tokenizer) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1}); err != nil {
		t.Fatal(err)
	}
	tok, text := loadText(t, dir)
	return &Grammars{Text: text}, tok
}

type fcItem struct {
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// TestAutoToolChoiceConstrainsCallsOnly: with tool_choice auto the text is
// free, a call the model opens is held to an offered tool's schema until
// it closes, and then the text is free again.
func TestAutoToolChoiceConstrainsCallsOnly(t *testing.T) {
	g, tok := tinyGrammars(t)
	tools := apiTools(t, weatherTools)
	cons, err := g.NewConstraint(&gen.Request{Chat: true, Tools: tools}, chat.Start{})
	if err != nil || cons == nil {
		t.Fatalf("NewConstraint: %v %v", cons, err)
	}
	logits := make([]float32, tok.VocabSize())
	allowed := func(id int32) bool {
		clear(logits)
		if err := cons.Mask(logits); err != nil {
			t.Fatal(err)
		}
		return !math.IsInf(float64(logits[id]), -1)
	}
	feed := func(s string, wantAllowed bool) {
		for _, id := range tok.Encode(s) {
			if allowed(id) != wantAllowed {
				t.Fatalf("token %q: allowed %v, want %v", tok.TokenBytes(id), !wantAllowed, wantAllowed)
			}
			if err := cons.Accept(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	feed("Let me check the weather. <tool_call>", true)
	feed("\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", true)
	if x := tok.Encode("x")[0]; allowed(x) != true {
		t.Fatal("after the call, text is not free")
	}
	feed(" More text. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ", true)
	if x := tok.Encode("7")[0]; allowed(x) {
		t.Fatal("a number accepted where the schema wants a string")
	}
	if x := tok.Encode("\"")[0]; !allowed(x) {
		t.Fatal("a string refused where the schema wants one")
	}
	cons.(interface{ Close() }).Close()
}

// TestToolsWithResponseFormat: tool_choice auto with response_format: the
// answer is either a valid call or a document of the schema.
func TestToolsWithResponseFormat(t *testing.T) {
	s := newGrammarServer(t)
	v := validator(t, personSchema)
	rf := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person", "schema": json.RawMessage(personSchema)}}
	kinds := map[string]int{}
	for seed := range 6 {
		var out toolChatOut
		body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "a person"}},
			"max_tokens": 800, "temperature": 1, "seed": seed, "response_format": rf, "tools": weatherTools, "parallel_tool_calls": false}
		if code := s.post(t, "/v1/chat/completions", body, &out); code != 200 {
			t.Fatalf("status %d", code)
		}
		c := out.Choices[0]
		switch c.FinishReason {
		case "tool_calls":
			kinds["call"]++
			if len(c.Message.ToolCalls) != 1 {
				t.Fatalf("seed %d: %d calls", seed, len(c.Message.ToolCalls))
			}
		case "stop":
			kinds["document"]++
			validate(t, v, *c.Message.Content)
		default:
			t.Fatalf("seed %d: finish %q", seed, c.FinishReason)
		}
	}
	t.Logf("answers: %v", kinds)
}

// TestToolCallMessageContentNull: a message that only calls tools has
// "content": null, as OpenAI answers it.
func TestToolCallMessageContentNull(t *testing.T) {
	s := newGrammarServer(t)
	body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "add"}},
		"max_tokens": 800, "temperature": 1, "seed": 2, "tools": weatherTools, "parallel_tool_calls": false,
		"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "add"}}}
	var out struct {
		Choices []struct {
			Message map[string]json.RawMessage `json:"message"`
		} `json:"choices"`
	}
	if code := s.post(t, "/v1/chat/completions", body, &out); code != 200 {
		t.Fatalf("status %d", code)
	}
	if c, ok := out.Choices[0].Message["content"]; !ok || string(c) != "null" {
		t.Fatalf("content %q (present %v), want null", c, ok)
	}
}

// TestAutoToolChoiceSingleCall: tool_choice auto with parallel_tool_calls
// false ends the answer once its first call closes (at most one call, as
// OpenAI defines it); with parallel calls allowed the text goes on.
func TestAutoToolChoiceSingleCall(t *testing.T) {
	g, tok := tinyGrammars(t)
	no, yes := false, true
	for _, c := range []struct {
		parallel *bool
		doneWant bool
	}{{&no, true}, {&yes, false}, {nil, false}} {
		cons, err := g.NewConstraint(&gen.Request{Chat: true, Tools: apiTools(t, weatherTools), ParallelToolCalls: c.parallel}, chat.Start{})
		if err != nil || cons == nil {
			t.Fatalf("NewConstraint: %v %v", cons, err)
		}
		logits := make([]float32, tok.VocabSize())
		for _, id := range tok.Encode("Checking. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>") {
			if cons.Done() {
				t.Fatalf("parallel_tool_calls %s: done before the call closed", fmtBool(c.parallel))
			}
			if err := cons.Mask(logits); err != nil {
				t.Fatal(err)
			}
			if err := cons.Accept(id); err != nil {
				t.Fatal(err)
			}
		}
		if cons.Done() != c.doneWant {
			t.Errorf("parallel_tool_calls %s: done %v after the first call, want %v", fmtBool(c.parallel), cons.Done(), c.doneWant)
		}
		cons.(interface{ Close() }).Close()
	}
}

func fmtBool(b *bool) string {
	if b == nil {
		return "unset"
	}
	return fmt.Sprint(*b)
}

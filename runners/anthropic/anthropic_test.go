package anthropic

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
	"github.com/exo-pd/exo-pd/runners/openai"
)

var update = flag.Bool("update", false, "rewrite golden files")

// scriptGen replays fixed text pieces (the model is exercised by the decode
// package's tests over the same handler).
type scriptGen struct {
	reasoning []string // reported first, through gen.ReasoningEmitter
	err       error    // returned before Start
	pieces    []string
	calls     []scriptCall // reported after pieces, through gen.ToolCallEmitter
	after     []string     // text reported after the calls
	res       gen.Result
	got       *gen.Request
}

// scriptCall is one tool call a scriptGen reports, its arguments in pieces.
type scriptCall struct {
	name string
	args []string
}

func (g *scriptGen) Generate(ctx context.Context, req *gen.Request, em gen.Emitter) (gen.Result, error) {
	g.got = req
	if g.err != nil {
		return gen.Result{}, g.err
	}
	if err := em.Start(g.res.PromptTokens); err != nil {
		return gen.Result{}, err
	}
	for _, r := range g.reasoning {
		if err := em.(gen.ReasoningEmitter).Reasoning(r); err != nil {
			return gen.Result{}, err
		}
	}
	for _, p := range g.pieces {
		if err := em.Text(p, nil); err != nil {
			return gen.Result{}, err
		}
	}
	for i, c := range g.calls {
		te := em.(gen.ToolCallEmitter)
		if err := te.ToolCall(i, fmt.Sprintf("call_%d", i), c.name, ""); err != nil {
			return gen.Result{}, err
		}
		for _, a := range c.args {
			if err := te.ToolCall(i, "", "", a); err != nil {
				return gen.Result{}, err
			}
		}
	}
	for _, p := range g.after {
		if err := em.Text(p, nil); err != nil {
			return gen.Result{}, err
		}
	}
	return g.res, nil
}

// Tokenize counts one token per byte of the messages.
func (g *scriptGen) Tokenize(_ context.Context, req *gen.Request) ([]int32, int, error) {
	n := 0
	for _, m := range req.Messages {
		n += len(m.Content)
	}
	return make([]int32, n), 2048, nil
}
func (g *scriptGen) Detokenize(context.Context, []int32) (string, error) { return "", nil }

func serve(t *testing.T, g *scriptGen) string {
	return serveWith(t, &Handler{Gen: g, Served: []string{"tiny"}, NewID: func(p string) string { return p + "test" }})
}

func serveWith(t *testing.T, h *Handler) string {
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(body))
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	testenv.Golden(t, name, got, *update)
}

func TestMessagesGolden(t *testing.T) {
	res := gen.Result{PromptTokens: 12, CachedTokens: 4, CompletionTokens: 3, FinishReason: "stop", StopSequence: "END"}
	for _, c := range []struct{ name, body string }{
		{"message", `{"model":"tiny","max_tokens":50,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`},
		{"message_stream", `{"model":"tiny","max_tokens":50,"stream":true,"stop_sequences":["END"],"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &scriptGen{pieces: []string{"Hel", "lo", "!"}, res: res}
			code, body := post(t, serve(t, g), c.body)
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			golden(t, c.name, body)
		})
	}
}

// TestNullFieldsAreAbsent: a field this server does not implement, sent
// as null (clients that write every field of their model), asks for
// nothing and is served; with a value it is refused (TestErrors).
func TestNullFieldsAreAbsent(t *testing.T) {
	g := &scriptGen{pieces: []string{"ok"}, res: gen.Result{FinishReason: "stop"}}
	code, body := post(t, serve(t, g), `{"model":"tiny","max_tokens":5,"thinking":null,"service_tier":null,"container":null,
		"messages":[{"role":"user","content":[{"type":"text","text":"hi","citations":null}]}]}`)
	if code != 200 || g.got == nil {
		t.Fatalf("%d %s", code, body)
	}
}

// TestThinkingDisabled: thinking {"type":"disabled"} asks for what this
// adapter does (no thinking blocks in the answer) and is served.
func TestThinkingDisabled(t *testing.T) {
	g := &scriptGen{pieces: []string{"ok"}, res: gen.Result{FinishReason: "stop"}}
	code, body := post(t, serve(t, g), `{"model":"tiny","max_tokens":5,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"hi"}]}`)
	if code != 200 || g.got == nil {
		t.Fatalf("%d %s", code, body)
	}
}

func TestConversion(t *testing.T) {
	g := &scriptGen{res: gen.Result{FinishReason: "length"}}
	code, body := post(t, serve(t, g), `{"model":"tiny","max_tokens":7,"temperature":0.5,"top_k":3,"metadata":{"user_id":"u"},
		"system":[{"type":"text","text":"Be "},{"type":"text","text":"brief."}],
		"messages":[{"role":"user","content":"Name a colour."},{"role":"assistant","content":"The colour is"}]}`)
	if code != 200 || !strings.Contains(body, `"stop_reason":"max_tokens"`) {
		t.Fatalf("%d %s", code, body)
	}
	r := g.got
	if len(r.Messages) != 3 || r.Messages[0].Role != "system" || r.Messages[0].Content != "Be brief." || !r.ContinueFinal || r.AddGenerationPrompt ||
		r.MaxTokens != 7 || r.Sampling.Temperature != 0.5 || r.Sampling.TopK != 3 || r.Sampling.SeedSet {
		t.Fatalf("%+v", r)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		name, body string
		code       int
		typ, has   string
	}{
		{"no max_tokens", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens"},
		{"unknown model", `{"model":"claude-9","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error", "claude-9"},
		{"unknown field", `{"model":"tiny","max_tokens":5,"mcp_servers":[],"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "mcp_servers"},
		{"thinking budget not below max_tokens", `{"model":"tiny","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "thinking"},
		{"thinking disabled with a budget", `{"model":"tiny","max_tokens":5,"thinking":{"type":"disabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "thinking.budget_tokens"},
		{"tools", `{"model":"tiny","max_tokens":5,"tools":[{"name":"f","input_schema":{}}],"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "tools"},
		{"tool_use block", `{"model":"tiny","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`, 400, "invalid_request_error", "messages[0].content[0].type"},
		{"temperature over 1", `{"model":"tiny","max_tokens":5,"temperature":1.5,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "temperature"},
		{"system role in messages", `{"model":"tiny","max_tokens":5,"messages":[{"role":"system","content":"hi"}]}`, 400, "invalid_request_error", "messages[0].role"},
		{"content of the wrong type names its path", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":5}]}`, 400, "invalid_request_error", "messages[1].content"},
		{"empty stop sequence", `{"model":"tiny","max_tokens":5,"stop_sequences":[""],"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "stop_sequences"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := &scriptGen{}
			code, body := post(t, serve(t, g), c.body)
			var eb ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil || code != c.code || eb.Type != "error" || eb.Error.Type != c.typ || !strings.Contains(eb.Error.Message, c.has) {
				t.Fatalf("%d %s", code, body)
			}
			if g.got != nil {
				t.Fatal("reached the generator")
			}
		})
	}
}

func FuzzMessagesRequest(f *testing.F) {
	f.Add(`{"model":"tiny","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`)
	f.Add(`{"model":"tiny","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"x"}]}]}`)
	f.Add(`{"model":"tiny","messages":"x","stop_sequences":[""]}`)
	h := &Handler{Served: []string{"tiny"}}
	f.Fuzz(func(t *testing.T, s string) {
		if checkBlocks([]byte(s), true) != nil {
			return
		}
		var r Request
		if openai.DecodeStrict([]byte(s), &r, requestShape) == nil {
			_, _ = h.convert(&r)
		}
	})
}

// TestToolsKeptWhenAccepted: with AcceptTools, tools, tool_choice and a
// tool_use → tool_result history become the generation request's tools and
// its history of calls and tool messages (the seam tool calling plugs into).
func TestToolsKeptWhenAccepted(t *testing.T) {
	h := &Handler{Served: []string{"tiny"}, AcceptTools: true}
	body := `{"model":"tiny","max_tokens":20,
		"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
		"tool_choice":{"type":"any","disable_parallel_tool_use":true},
		"messages":[{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"18C"}]},{"type":"text","text":"Thanks"}]}]}`
	if e := checkBlocks([]byte(body), true); e != nil {
		t.Fatal(e)
	}
	var r Request
	if e := openai.DecodeStrict([]byte(body), &r, requestShape); e != nil {
		t.Fatal(e)
	}
	g, e := h.convert(&r)
	if e != nil {
		t.Fatal(e)
	}
	m := g.Messages
	if len(g.Tools) != 1 || g.Tools[0].Name != "get_weather" || !strings.Contains(string(g.Tools[0].Parameters), `"city"`) ||
		g.ToolChoice.Mode != "required" || *g.ParallelToolCalls {
		t.Fatalf("tools %+v choice %+v", g.Tools, g.ToolChoice)
	}
	if len(m) != 4 || m[1].Role != "assistant" || m[1].Content != "Checking." || len(m[1].ToolCalls) != 1 ||
		m[1].ToolCalls[0].ID != "toolu_1" || m[1].ToolCalls[0].Arguments != `{"city":"Paris"}` ||
		m[2].Role != "tool" || m[2].ToolCallID != "toolu_1" || m[2].Content != "18C" || m[3].Role != "user" || m[3].Content != "Thanks" {
		t.Fatalf("%+v", m)
	}
	// without AcceptTools the same request is refused by name
	if e := checkBlocks([]byte(body), false); e == nil || e.Param != "messages[1].content[1].type" {
		t.Fatalf("tool_use block: %v", e)
	}
	h.AcceptTools = false
	if _, e := h.convert(&r); e == nil || e.Param != "tools" {
		t.Fatalf("tools: %v", e)
	}
}

func TestCountTokens(t *testing.T) {
	url := serve(t, &scriptGen{})
	req, _ := http.NewRequest("POST", url+"/v1/messages/count_tokens", strings.NewReader(
		`{"model":"tiny","system":"sys","messages":[{"role":"user","content":"hello"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]int
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 200 || v["input_tokens"] != len("sys")+len("hello") {
		t.Fatalf("%d %v %v", resp.StatusCode, v, err)
	}
	req, _ = http.NewRequest("POST", url+"/v1/messages/count_tokens", strings.NewReader(
		`{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hello"}]}`))
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != 400 {
		t.Fatalf("max_tokens on count_tokens: %d", resp2.StatusCode)
	}
}

// TestToolErrorsNameAnthropicFields: with AcceptTools, a tool or a tool
// block missing what it needs is refused naming the field as the
// Messages API spells it (not the generation request's names).
func TestToolErrorsNameAnthropicFields(t *testing.T) {
	h := &Handler{Served: []string{"tiny"}, AcceptTools: true}
	for _, c := range []struct{ name, body, param, has string }{
		{"unnamed tool", `{"model":"tiny","max_tokens":5,"tools":[{"name":"","input_schema":{}}],"messages":[{"role":"user","content":"hi"}]}`,
			"tools[0].name", "tools[0].name is required"},
		{"any without tools", `{"model":"tiny","max_tokens":5,"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"hi"}]}`,
			"tool_choice", `"any" needs tools`},
		{"unnamed tool_use", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","input":{}}]}]}`,
			"messages[1].content[0].name", "is required"},
		{"tool_result without id", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":"18C"}]}]}`,
			"messages[0].content[0].tool_use_id", "is required"},
		{"tool without input_schema", `{"model":"tiny","max_tokens":5,"tools":[{"name":"f"}],"messages":[{"role":"user","content":"hi"}]}`,
			"tools[0].input_schema", "tools[0].input_schema is required"},
		{"tool with null input_schema", `{"model":"tiny","max_tokens":5,"tools":[{"name":"f","input_schema":null}],"messages":[{"role":"user","content":"hi"}]}`,
			"tools[0].input_schema", "tools[0].input_schema is required"},
		{"input_schema not an object", `{"model":"tiny","max_tokens":5,"tools":[{"name":"f","input_schema":"x"}],"messages":[{"role":"user","content":"hi"}]}`,
			"tools[0].input_schema", "tools[0].input_schema must be a JSON Schema object"},
		{"zero max_tokens", `{"model":"tiny","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", "at least 1"},
	} {
		var r Request
		if e := openai.DecodeStrict([]byte(c.body), &r, requestShape); e != nil {
			t.Fatalf("%s: %v", c.name, e)
		}
		if _, e := h.convert(&r); e == nil || e.Param != c.param || !strings.Contains(e.Message, c.has) {
			t.Errorf("%s: %+v, want %s with %q", c.name, e, c.param, c.has)
		}
	}
}

// streamedContent rebuilds a message's content blocks from its event
// stream as Anthropic's SDKs do, checking that blocks open and close in
// order with consecutive indices and that deltas go to the open block.
func streamedContent(t *testing.T, body string) []map[string]any {
	t.Helper()
	var blocks []map[string]any
	var partial []string
	open := -1
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type         string         `json:"type"`
			Index        int            `json:"index"`
			ContentBlock map[string]any `json:"content_block"`
			Delta        map[string]any `json:"delta"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		switch ev.Type {
		case "content_block_start":
			if open != -1 || ev.Index != len(blocks) {
				t.Fatalf("block %d starts while %d is open, after %d blocks", ev.Index, open, len(blocks))
			}
			open = ev.Index
			blocks, partial = append(blocks, ev.ContentBlock), append(partial, "")
		case "content_block_delta":
			if ev.Index != open {
				t.Fatalf("delta for block %d while %d is open", ev.Index, open)
			}
			switch ev.Delta["type"] {
			case "text_delta":
				blocks[open]["text"] = blocks[open]["text"].(string) + ev.Delta["text"].(string)
			case "input_json_delta":
				partial[open] += ev.Delta["partial_json"].(string)
			}
		case "content_block_stop":
			if ev.Index != open {
				t.Fatalf("stop of block %d while %d is open", ev.Index, open)
			}
			if blocks[open]["type"] == "tool_use" {
				var in any = map[string]any{}
				if partial[open] != "" {
					if err := json.Unmarshal([]byte(partial[open]), &in); err != nil {
						t.Fatalf("block %d input %q: %v", open, partial[open], err)
					}
				}
				blocks[open]["input"] = in
			}
			open = -1
		}
	}
	if open != -1 {
		t.Fatalf("block %d never stopped", open)
	}
	return blocks
}

// TestStreamMatchesMessage: the content blocks a client rebuilds from the
// stream are the non-streamed message's, with no empty text block before
// tool_use blocks (Anthropic's SDKs keep such a block, and the Messages
// API refuses an empty text block when the turn is sent back).
func TestStreamMatchesMessage(t *testing.T) {
	for _, c := range []struct {
		name   string
		pieces []string
		calls  []scriptCall
		after  []string
		reason string
	}{
		{"text", []string{"Hel", "lo"}, nil, nil, "stop"},
		{"nothing", nil, nil, nil, "stop"},
		{"calls only", nil, []scriptCall{{"get_weather", []string{`{"city":`, ` "Paris"}`}}, {"get_time", []string{`{}`}}}, nil, "tool_calls"},
		{"text then call", []string{"Let me check."}, []scriptCall{{"get_weather", []string{`{"city": "Paris"}`}}}, nil, "tool_calls"},
		{"call without arguments", nil, []scriptCall{{"ping", nil}}, nil, "tool_calls"},
		// the non-streamed blocks keep the order the model produced them
		// in, as the stream does: text, tool_use, text
		{"text, call, text", []string{"Let me check."}, []scriptCall{{"get_weather", []string{`{"city": "Paris"}`}}}, []string{"Done."}, "tool_calls"},
		{"call, text", nil, []scriptCall{{"get_weather", []string{`{}`}}, {"get_time", []string{`{}`}}}, []string{"Both asked."}, "tool_calls"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &Handler{Gen: &scriptGen{pieces: c.pieces, calls: c.calls, after: c.after, res: gen.Result{FinishReason: c.reason}},
				Served: []string{"tiny"}, NewID: func(p string) string { return p + "test" }, AcceptTools: true}
			url := serveWith(t, h)
			req := `{"model":"tiny","max_tokens":50,%s"tools":[{"name":"get_weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{"type":"object"}},{"name":"ping","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"}]}`
			code, body := post(t, url, fmt.Sprintf(req, ""))
			var msg struct {
				Content []map[string]any `json:"content"`
			}
			if err := json.Unmarshal([]byte(body), &msg); code != 200 || err != nil {
				t.Fatalf("%d %s", code, body)
			}
			code, stream := post(t, url, fmt.Sprintf(req, `"stream":true,`))
			if code != 200 {
				t.Fatalf("%d %s", code, stream)
			}
			got := streamedContent(t, stream)
			want, _ := json.Marshal(msg.Content)
			have, _ := json.Marshal(got)
			if string(want) != string(have) {
				t.Fatalf("stream rebuilds %s\nmessage is    %s\n%s", have, want, stream)
			}
			for i, b := range got {
				if b["type"] == "text" && b["text"] == "" && len(got) > 1 {
					t.Fatalf("empty text block %d among %s", i, have)
				}
			}
		})
	}
}

// TestErrorTypes: the runner's Anthropic error bodies take the type
// Anthropic documents for each status, the same as the gateway's own
// (internal/apierr): 401 authentication_error, 403 permission_error,
// 529 overloaded_error among them.
func TestErrorTypes(t *testing.T) {
	for status, want := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
		504: "timeout_error", 529: "overloaded_error"} {
		if got := errorBody(&openai.Error{Status: status, Message: "m"}); got.Type != "error" || got.Error.Type != want {
			t.Errorf("status %d: %+v, want type %q", status, got, want)
		}
	}
}

// TestBlockFieldsBelongToTheirType: a content block carries only its own
// type's fields (Anthropic's blocks are a union by type): a field of
// another block type is a 400 naming it, not silently dropped; null asks
// for nothing and passes, as elsewhere.
func TestBlockFieldsBelongToTheirType(t *testing.T) {
	h := &Handler{Gen: &scriptGen{pieces: []string{"ok"}, res: gen.Result{FinishReason: "stop"}}, Served: []string{"tiny"}, AcceptTools: true}
	url := serveWith(t, h)
	msg := func(blocks string) string {
		return `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[` + blocks + `]},{"role":"user","content":"go on"}]}`
	}
	for _, c := range []struct{ name, body, param string }{
		{"signature on text", msg(`{"type":"text","text":"a","signature":"s"}`), "messages[1].content[0].signature"},
		{"input on text", msg(`{"type":"text","text":"a","input":{}}`), "messages[1].content[0].input"},
		{"text on tool_use", msg(`{"type":"tool_use","id":"t","name":"f","input":{},"text":"x"}`), "messages[1].content[0].text"},
		{"is_error on tool_use", msg(`{"type":"tool_use","id":"t","name":"f","input":{},"is_error":true}`), "messages[1].content[0].is_error"},
		{"text on thinking", msg(`{"type":"thinking","thinking":"t","signature":"s","text":"x"}`), "messages[1].content[0].text"},
		{"thinking on redacted_thinking", msg(`{"type":"redacted_thinking","data":"d","thinking":"t"}`), "messages[1].content[0].thinking"},
		{"name on tool_result", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"1","name":"f"}]}]}`,
			"messages[0].content[0].name"},
		{"data on text in a tool_result", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"1","data":"d"}]}]}]}`,
			"messages[0].content[0].content[0].data"},
	} {
		code, body := post(t, url, c.body)
		var eb ErrorBody
		if err := json.Unmarshal([]byte(body), &eb); err != nil || code != 400 || eb.Error.Type != "invalid_request_error" || !strings.Contains(eb.Error.Message, c.param) {
			t.Errorf("%s: %d %s, want a 400 naming %s", c.name, code, body, c.param)
		}
	}
	for _, c := range []struct{ name, body string }{
		{"each type's own fields", msg(`{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"},{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"tool_use","id":"t","name":"f","input":{},"cache_control":{"type":"ephemeral"}}`)},
		{"a foreign field sent as null", msg(`{"type":"text","text":"a","signature":null,"input":null}`)},
		{"tool_result's own fields", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"1"}],"is_error":false,"cache_control":{"type":"ephemeral"}}]}]}`},
	} {
		if code, body := post(t, url, c.body); code != 200 {
			t.Errorf("%s: %d %s", c.name, code, body)
		}
	}
}

// TestCountTokensFields: count_tokens takes what Anthropic's count_tokens
// takes (model, messages, system, tools, tool_choice, thinking) and
// refuses by name what it does not — the generation-only fields
// (max_tokens is not a count_tokens field) — with no max_tokens to check
// a thinking budget against.
func TestCountTokensFields(t *testing.T) {
	url := serveWith(t, &Handler{Gen: &scriptGen{}, Served: []string{"tiny"}, AcceptTools: true})
	count := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post(url+"/v1/messages/count_tokens", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const msgs = `"messages":[{"role":"user","content":"hello"}]`
	for _, f := range []string{`"max_tokens":5`, `"stream":false`, `"stop_sequences":["x"]`, `"temperature":0.5`, `"top_p":0.9`, `"top_k":3`,
		`"metadata":{"user_id":"u"}`, `"x_exo_speculative":false`} {
		name, _, _ := strings.Cut(strings.Trim(f, `"`), `"`)
		code, body := count(`{"model":"tiny",` + f + `,` + msgs + `}`)
		var eb ErrorBody
		if err := json.Unmarshal([]byte(body), &eb); err != nil || code != 400 || eb.Error.Type != "invalid_request_error" || !strings.Contains(eb.Error.Message, name) {
			t.Errorf("%s: %d %s, want a 400 naming %s", f, code, body, name)
		}
		// The field is served on /v1/messages: the error says where it
		// belongs, not that this server lacks it.
		if strings.Contains(eb.Error.Message, "not supported") || !strings.Contains(eb.Error.Message, "/v1/messages") {
			t.Errorf("%s: %q, want it named as a field of /v1/messages, not of count_tokens", f, eb.Error.Message)
		}
	}
	for _, c := range []struct{ name, body string }{
		{"thinking with any budget", `{"model":"tiny","thinking":{"type":"enabled","budget_tokens":50000},` + msgs + `}`},
		{"tools and tool_choice", `{"model":"tiny","tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},"system":[{"type":"text","text":"s"}],` + msgs + `}`},
	} {
		if code, body := count(c.body); code != 200 || !strings.Contains(body, `"input_tokens"`) {
			t.Errorf("%s: %d %s", c.name, code, body)
		}
	}
	for _, c := range []struct{ name, body, has string }{
		{"no messages", `{"model":"tiny"}`, "messages"},
		{"no model", msgsOnly(msgs), "model"},
		{"thinking budget under 1", `{"model":"tiny","thinking":{"type":"enabled","budget_tokens":0},` + msgs + `}`, "thinking.budget_tokens"},
		{"thinking enabled without a budget", `{"model":"tiny","thinking":{"type":"enabled"},` + msgs + `}`, "thinking.budget_tokens"},
		{"tool_choice any without tools", `{"model":"tiny","tool_choice":{"type":"any"},` + msgs + `}`, "tool_choice"},
	} {
		code, body := count(c.body)
		if code != 400 || !strings.Contains(body, c.has) || strings.Contains(body, "max_tokens") {
			t.Errorf("%s: %d %s, want a 400 naming %s (and not max_tokens)", c.name, code, body, c.has)
		}
	}
}

func msgsOnly(msgs string) string { return "{" + msgs + "}" }

// TestDecodeErrorsNamePaths: a value that does not decode is a 400 naming
// its JSON path through blocks and nested tool_result content.
func TestDecodeErrorsNamePaths(t *testing.T) {
	url := serveWith(t, &Handler{Gen: &scriptGen{}, Served: []string{"tiny"}, AcceptTools: true})
	for _, c := range []struct{ body, has string }{
		{`{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":5}]}]}`,
			"messages[0].content[1].text must be a string, got number"},
		{`{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"a"},{"type":"text","text":[]}]}]}]}`,
			"messages[0].content[0].content[1].text must be a string, got array"},
		{`{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":5}]}]}`,
			"messages[0].content[0].content must be a string or an array of content blocks, got number"},
		{`{"model":"tiny","max_tokens":5,"system":7,"messages":[{"role":"user","content":"hi"}]}`, "system must be a string or an array of content blocks, got number"},
		{`{"model":"tiny","max_tokens":5,"stop_sequences":["a",1],"messages":[{"role":"user","content":"hi"}]}`, "stop_sequences[1] must be a string, got number"},
		{`{"model":"tiny","max_tokens":5,"tools":[{"name":"f","input_schema":{}},{"name":1,"input_schema":{}}],"messages":[{"role":"user","content":"hi"}]}`, "tools[1].name must be a string, got number"},
		{`{"model":"tiny","max_tokens":"5","messages":[{"role":"user","content":"hi"}]}`, "max_tokens must be an integer, got string"},
	} {
		code, body := post(t, url, c.body)
		if code != 400 || !strings.Contains(body, c.has) || strings.Contains(body, "Go ") {
			t.Errorf("%s: %d %s, want a 400 with %q", c.body, code, body, c.has)
		}
	}
}

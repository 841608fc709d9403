package anthropic

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// events splits an SSE body into its events: the name and, for a
// content_block event, "name:block type" or "name:delta type".
func events(t *testing.T, body string) (names []string, datas []map[string]any) {
	t.Helper()
	for _, ev := range strings.Split(strings.TrimSpace(body), "\n\n") {
		var name string
		var data map[string]any
		for _, line := range strings.Split(ev, "\n") {
			if n, ok := strings.CutPrefix(line, "event: "); ok {
				name = n
			}
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				if err := json.Unmarshal([]byte(d), &data); err != nil {
					t.Fatalf("event data %q: %v", d, err)
				}
			}
		}
		if cb, ok := data["content_block"].(map[string]any); ok {
			name += ":" + cb["type"].(string)
		}
		if d, ok := data["delta"].(map[string]any); ok && d["type"] != nil {
			name += ":" + d["type"].(string)
		}
		names, datas = append(names, name), append(datas, data)
	}
	return names, datas
}

const thinkReq = `{"model":"tiny","max_tokens":50,%s"messages":[{"role":"user","content":"hi"}]}`

func thinkBody(thinking, extra string) string {
	if thinking != "" {
		thinking = `"thinking":` + thinking + `,`
	}
	return strings.Replace(thinkReq, "%s", thinking+extra, 1)
}

// TestThinkingBlocks: with thinking enabled (or adaptive) a reasoning
// model's reasoning is a thinking block before the text, with a signature;
// enabled's budget_tokens is the generation's reasoning cap; disabled or
// absent drops the reasoning, as before.
func TestThinkingBlocks(t *testing.T) {
	for _, c := range []struct {
		name, thinking string
		budget         int
		want           []ContentBlock
	}{
		{"enabled", `{"type":"enabled","budget_tokens":20}`, 20, []ContentBlock{
			{Type: "thinking", Thinking: "The user greets me.", Signature: signature("The user greets me.")}, {Type: "text", Text: "Hello!"}}},
		{"adaptive", `{"type":"adaptive"}`, 0, []ContentBlock{
			{Type: "thinking", Thinking: "The user greets me.", Signature: signature("The user greets me.")}, {Type: "text", Text: "Hello!"}}},
		{"disabled", `{"type":"disabled"}`, 0, []ContentBlock{{Type: "text", Text: "Hello!"}}},
		{"absent", ``, 0, []ContentBlock{{Type: "text", Text: "Hello!"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &scriptGen{reasoning: []string{"The user ", "greets me."}, pieces: []string{"Hel", "lo!"}, res: gen.Result{FinishReason: "stop"}}
			code, body := post(t, serve(t, g), thinkBody(c.thinking, ""))
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			var r struct {
				Content []map[string]any
			}
			json.Unmarshal([]byte(body), &r)
			want, _ := json.Marshal(c.want)
			var wantBlocks []map[string]any
			json.Unmarshal(want, &wantBlocks)
			if !reflect.DeepEqual(r.Content, wantBlocks) {
				t.Errorf("content %v\nwant %v", r.Content, wantBlocks)
			}
			if g.got.MaxReasoningTokens != c.budget {
				t.Errorf("MaxReasoningTokens %d, want %d", g.got.MaxReasoningTokens, c.budget)
			}
		})
	}
}

// TestThinkingStream: the streamed thinking block comes first, its text as
// thinking_delta, then one signature_delta (the non-streamed block's
// signature) before its content_block_stop, then the text block: the
// order Anthropic sends, and the non-streamed answer's blocks.
func TestThinkingStream(t *testing.T) {
	g := &scriptGen{reasoning: []string{"The user ", "greets me."}, pieces: []string{"Hel", "lo!"}, res: gen.Result{FinishReason: "stop"}}
	code, body := post(t, serve(t, g), thinkBody(`{"type":"enabled","budget_tokens":20}`, `"stream":true,`))
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	names, datas := events(t, body)
	want := []string{"message_start", "ping",
		"content_block_start:thinking", "content_block_delta:thinking_delta", "content_block_delta:thinking_delta",
		"content_block_delta:signature_delta", "content_block_stop",
		"content_block_start:text", "content_block_delta:text_delta", "content_block_delta:text_delta", "content_block_stop",
		"message_delta", "message_stop"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("events %v\nwant %v\n%s", names, want, body)
	}
	if cb := datas[2]["content_block"]; !reflect.DeepEqual(cb, map[string]any{"type": "thinking", "thinking": "", "signature": ""}) {
		t.Errorf("thinking block start %v", cb)
	}
	if d := datas[3]["delta"].(map[string]any); d["thinking"] != "The user " || datas[3]["index"] != 0.0 {
		t.Errorf("thinking_delta %v", datas[3])
	}
	if d := datas[5]["delta"].(map[string]any); d["signature"] != signature("The user greets me.") {
		t.Errorf("signature_delta %v", d)
	}
	if datas[7]["index"] != 1.0 || datas[10]["index"] != 1.0 {
		t.Errorf("text block index: %v %v", datas[7], datas[10])
	}
}

// TestThinkingCutOff: an answer cut off by max_tokens inside the reasoning
// is its thinking block alone (no empty text block), streamed or not.
func TestThinkingCutOff(t *testing.T) {
	g := &scriptGen{reasoning: []string{"Still thinking"}, res: gen.Result{FinishReason: "length"}}
	url := serve(t, g)
	code, body := post(t, url, thinkBody(`{"type":"adaptive"}`, ""))
	if code != 200 || !strings.Contains(body, `"content":[{"type":"thinking","thinking":"Still thinking","signature":"exo-sha256:`) ||
		strings.Contains(body, `"type":"text"`) || !strings.Contains(body, `"stop_reason":"max_tokens"`) {
		t.Errorf("%d %s", code, body)
	}
	code, body = post(t, url, thinkBody(`{"type":"adaptive"}`, `"stream":true,`))
	names, _ := events(t, body)
	want := []string{"message_start", "ping", "content_block_start:thinking", "content_block_delta:thinking_delta",
		"content_block_delta:signature_delta", "content_block_stop", "message_delta", "message_stop"}
	if code != 200 || !reflect.DeepEqual(names, want) {
		t.Errorf("%d %v\n%s", code, names, body)
	}
}

// TestThinkingErrors: thinking is checked in Anthropic's terms, and the
// generator's refusal of a reasoning cap names thinking.budget_tokens.
func TestThinkingErrors(t *testing.T) {
	for _, c := range []struct{ name, thinking, param string }{
		{"enabled without a budget", `{"type":"enabled"}`, "thinking.budget_tokens is required"},
		{"budget below 1", `{"type":"enabled","budget_tokens":0}`, "thinking.budget_tokens must be at least 1"},
		{"budget not below max_tokens", `{"type":"enabled","budget_tokens":50}`, "must be less than max_tokens (50)"},
		{"adaptive with a budget", `{"type":"adaptive","budget_tokens":10}`, "thinking.budget_tokens is only for thinking enabled"},
		{"unknown type", `{"type":"sometimes"}`, `thinking.type must be enabled, adaptive or disabled, got \"sometimes\"`},
		{"unknown key", `{"type":"enabled","budget_tokens":10,"display":"x"}`, "thinking.display"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := post(t, serve(t, &scriptGen{}), thinkBody(c.thinking, ""))
			if code != 400 || !strings.Contains(body, `"type":"invalid_request_error"`) || !strings.Contains(body, c.param) {
				t.Errorf("%d %s, want 400 with %q", code, body, c.param)
			}
		})
	}
	g := &scriptGen{err: openai.Errorf("max_reasoning_tokens", "max_reasoning_tokens: this model does not reason before its answer")}
	code, body := post(t, serve(t, g), thinkBody(`{"type":"enabled","budget_tokens":10}`, ""))
	if code != 400 || !strings.Contains(body, "thinking.budget_tokens cannot be honoured on this model (a reasoning budget: this model does not reason before its answer)") ||
		strings.Contains(body, "max_reasoning_tokens") {
		t.Errorf("generator refusal: %d %s", code, body)
	}
}

// TestThinkingInHistory: thinking and redacted_thinking blocks sent back
// in an assistant turn are accepted and left out of the prompt; in a user
// turn or the system prompt they are refused by path.
func TestThinkingInHistory(t *testing.T) {
	g := &scriptGen{pieces: []string{"ok"}, res: gen.Result{FinishReason: "stop"}}
	url := serve(t, g)
	code, body := post(t, url, `{"model":"tiny","max_tokens":50,"thinking":{"type":"enabled","budget_tokens":10},"messages":[
		{"role":"user","content":"hi"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"The user greets me.","signature":"sig"},{"type":"redacted_thinking","data":"xyz"},{"type":"text","text":"Hello!"}]},
		{"role":"user","content":"bye"}]}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	want := []gen.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "Hello!"}, {Role: "user", Content: "bye"}}
	if !reflect.DeepEqual(g.got.Messages, want) {
		t.Errorf("prompt messages %+v\nwant %+v", g.got.Messages, want)
	}
	for name, req := range map[string]string{
		"messages[0].content[0]": `{"model":"tiny","max_tokens":50,"messages":[{"role":"user","content":[{"type":"thinking","thinking":"x","signature":"s"}]}]}`,
		"system[0].type":         `{"model":"tiny","max_tokens":50,"system":[{"type":"thinking","thinking":"x"}],"messages":[{"role":"user","content":"hi"}]}`,
	} {
		if code, body := post(t, url, req); code != 400 || !strings.Contains(body, name) {
			t.Errorf("%s: %d %s", name, code, body)
		}
	}
}

// TestSDKThinking: the official anthropic client parses the thinking
// block (text and signature), a tool_use cut off by max_tokens, and text
// after a tool_use (blocks in the order produced) the same from the whole
// answer and from the stream. Skips where python3
// cannot import anthropic.
func TestSDKThinking(t *testing.T) {
	if exec.Command("python3", "-c", "import anthropic").Run() != nil {
		testutil.Missing(t, "python3 cannot import anthropic (pip install anthropic)")
	}
	think := serve(t, &scriptGen{reasoning: []string{"The user ", "greets me."}, pieces: []string{"Hel", "lo!"}, res: gen.Result{FinishReason: "stop"}})
	tool := serveWith(t, &Handler{Gen: &scriptGen{calls: []scriptCall{{"get_weather", []string{`{"city": "Paris", `, `"unit": "cel`}}},
		res: gen.Result{FinishReason: "length"}}, Served: []string{"tiny"}, AcceptTools: true})
	mixed := serveWith(t, &Handler{Gen: &scriptGen{pieces: []string{"Let me check."}, calls: []scriptCall{{"get_weather", []string{`{"city": "Paris"}`}}},
		after: []string{"Asked."}, res: gen.Result{FinishReason: "tool_calls"}}, Served: []string{"tiny"}, AcceptTools: true})
	out, err := exec.Command("python3", filepath.Join("testdata", "sdk_thinking.py"), think, tool, mixed).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("anthropic client: %v\n%s", err, stderr)
	}
	t.Logf("anthropic client: %s", out)
	var got map[string]struct {
		StopReason string           `json:"stop_reason"`
		Content    []map[string]any `json:"content"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	for _, name := range []string{"think", "tool", "mixed"} {
		if !reflect.DeepEqual(got[name+"_whole"], got[name+"_stream"]) {
			t.Errorf("%s: whole %+v\nstream %+v", name, got[name+"_whole"], got[name+"_stream"])
		}
	}
	th := got["think_stream"]
	want := []map[string]any{{"type": "thinking", "thinking": "The user greets me.", "signature": signature("The user greets me.")}, {"type": "text", "text": "Hello!"}}
	if th.StopReason != "end_turn" || !reflect.DeepEqual(th.Content, want) {
		t.Errorf("thinking: %+v\nwant %+v", th, want)
	}
	var order []string
	for _, b := range got["mixed_whole"].Content {
		order = append(order, b["type"].(string))
	}
	if !reflect.DeepEqual(order, []string{"text", "tool_use", "text"}) {
		t.Errorf("text, call, text: the SDK reads blocks %v", order)
	}
	tu := got["tool_stream"]
	if tu.StopReason != "max_tokens" || len(tu.Content) != 1 || !reflect.DeepEqual(tu.Content[0]["input"], map[string]any{"city": "Paris"}) {
		t.Errorf("cut-off tool_use: %+v", tu)
	}
}

// interleaveGen reports reasoning, text, reasoning, text (a harmony model
// may reason again after a preamble).
type interleaveGen struct{ scriptGen }

func (g *interleaveGen) Generate(ctx context.Context, req *gen.Request, em gen.Emitter) (gen.Result, error) {
	if err := em.Start(0); err != nil {
		return gen.Result{}, err
	}
	re := em.(gen.ReasoningEmitter)
	for _, step := range []func() error{
		func() error { return re.Reasoning("First.") }, func() error { return em.Text("Let me check.", nil) },
		func() error { return re.Reasoning("Second.") }, func() error { return em.Text("Done.", nil) },
	} {
		if err := step(); err != nil {
			return gen.Result{}, err
		}
	}
	return gen.Result{FinishReason: "stop"}, nil
}

// TestThinkingInterleaved: reasoning that comes again after text is a
// second thinking block, in the order it came, whole or streamed.
func TestThinkingInterleaved(t *testing.T) {
	url := serveWith(t, &Handler{Gen: &interleaveGen{}, Served: []string{"tiny"}})
	code, body := post(t, url, thinkBody(`{"type":"adaptive"}`, ""))
	var r struct {
		Content []struct{ Type, Text, Thinking string }
	}
	json.Unmarshal([]byte(body), &r)
	var whole []string
	for _, b := range r.Content {
		whole = append(whole, b.Type+":"+b.Text+b.Thinking)
	}
	want := []string{"thinking:First.", "text:Let me check.", "thinking:Second.", "text:Done."}
	if code != 200 || !reflect.DeepEqual(whole, want) {
		t.Errorf("whole: %d %v\n%s", code, whole, body)
	}
	code, body = post(t, url, thinkBody(`{"type":"adaptive"}`, `"stream":true,`))
	names, _ := events(t, body)
	var starts []string
	for _, n := range names {
		if b, ok := strings.CutPrefix(n, "content_block_start:"); ok {
			starts = append(starts, b)
		}
	}
	if code != 200 || !reflect.DeepEqual(starts, []string{"thinking", "text", "thinking", "text"}) {
		t.Errorf("stream: %d %v\n%s", code, starts, body)
	}
}

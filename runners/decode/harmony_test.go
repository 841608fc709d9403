package decode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// pieceText is a Text over a vocabulary of literal pieces: harmony's
// special tokens whole, any other text one byte a token (so text reaches
// the emitters split at every byte). It stands for gpt-oss's o200k
// tokenizer, whose detokenizer also renders special tokens as their text;
// its chat format is harmony. Every prompt is one token (scriptModel's
// promptLen).
type pieceText struct {
	vocab []string
	ids   map[string]int32
}

var harmonySpecials = []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}

func newPieceText() *pieceText {
	p := &pieceText{ids: map[string]int32{}}
	add := func(s string) {
		p.ids[s] = int32(len(p.vocab))
		p.vocab = append(p.vocab, s)
	}
	for b := range 256 {
		add(string([]byte{byte(b)}))
	}
	for _, s := range harmonySpecials {
		add(s)
	}
	return p
}

// encode tokenizes a generation: special tokens whole, other bytes alone.
func (p *pieceText) encode(s string) []int32 {
	var ids []int32
	for s != "" {
		special := false
		for _, sp := range harmonySpecials {
			if strings.HasPrefix(s, sp) {
				ids, s, special = append(ids, p.ids[sp]), s[len(sp):], true
				break
			}
		}
		if !special {
			ids, s = append(ids, int32(s[0])), s[1:]
		}
	}
	return ids
}

func (p *pieceText) Render([]gen.Message, bool, bool) (string, error) { return "p", nil }
func (p *pieceText) RenderTools([]gen.Message, []gen.Tool, bool, bool) (string, error) {
	return "p", nil
}
func (p *pieceText) Format() chat.Format        { return chat.Harmony }
func (p *pieceText) IsSpecial(id int32) bool    { return id >= 256 }
func (p *pieceText) Encode(string) []int32      { return []int32{'p'} }
func (p *pieceText) EncodeChat(string) []int32  { return []int32{'p'} }
func (p *pieceText) TokenBytes(id int32) []byte { return []byte(p.vocab[id]) }
func (p *pieceText) EOS() []int32               { return []int32{p.ids["<|return|>"], p.ids["<|call|>"]} }
func (p *pieceText) VocabSize() int             { return len(p.vocab) }
func (p *pieceText) NewStream() TextStream      { return pieceStream{p} }
func (p *pieceText) Decode(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(p.vocab[id])
	}
	return b.String()
}

type pieceStream struct{ p *pieceText }

func (s pieceStream) Add(id int32) string { return s.p.vocab[id] }
func (s pieceStream) Flush() string       { return "" }

// harmonyServer serves a scripted "gpt-oss" that writes gen (ended by the
// EOS token <|return|> or <|call|> that gen ends with) over HTTP.
func harmonyServer(t *testing.T, gen string) string {
	t.Helper()
	text := newPieceText()
	url, _ := serveScript(t, &scriptModel{script: text.encode(gen), eos: text.ids["<|return|>"], vocab: text.VocabSize()}, text)
	return url
}

// serveScript serves a scripted model over HTTP, tools and grammars on.
func serveScript(t *testing.T, m *scriptModel, text Text) (string, *Server) {
	t.Helper()
	g := &Grammars{Text: text}
	srv := New(Options{Name: "m", Model: m, Text: text, NewSampler: NewSampler, NewStopMatcher: NewStopMatcher,
		MaxBatch: 1, CacheEntries: -1, NewConstraint: g.NewConstraint, AcceptTools: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(apiMux(srv))
	t.Cleanup(hs.Close)
	return hs.URL, srv
}

const (
	harmonyAnswer = "<|channel|>analysis<|message|>User says hi. <|x|> < reply.<|end|>" +
		"<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
	harmonyCall = "<|channel|>analysis<|message|>Need the weather.<|end|>" +
		"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" +
		`{"city":"Paris","unit":"c"}<|call|>`
)

var harmonyTools = []map[string]any{{"type": "function", "function": map[string]any{"name": "get_weather",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}}

func postChat(t *testing.T, url string, body map[string]any) (int, []byte) {
	t.Helper()
	body["model"] = "m"
	body["messages"] = []map[string]any{{"role": "user", "content": "hi"}}
	return postJSON(t, url+"/v1/chat/completions", body)
}

type harmonyMessage struct {
	Content          *string                `json:"content"`
	ReasoningContent *string                `json:"reasoning_content"`
	ToolCalls        []openai.ToolCallDelta `json:"tool_calls"`
}

type harmonyCallOut struct{ ID, Type, Name, Args string }

func callsOf(tc []openai.ToolCallDelta) []harmonyCallOut {
	var out []harmonyCallOut
	for _, c := range tc {
		out = append(out, harmonyCallOut{c.ID, c.Type, c.Function.Name, c.Function.Arguments})
	}
	return out
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestHarmonyChat: a gpt-oss generation's analysis channel comes back as
// reasoning_content, its final channel as content, and a commentary
// message to=functions.NAME as a tool call with finish_reason
// "tool_calls", in a whole response and (joined) in a stream. A call the
// model makes although no tools were offered (none given, or tool_choice
// "none") is never a tool call: its arguments come back as content and
// the finish reason is "stop".
func TestHarmonyChat(t *testing.T) {
	const none = "none"
	cases := []struct {
		name, gen          string
		tools              bool
		choice             string // tool_choice; "": not sent
		content, reasoning string // "<nil>": absent or null
		calls              []harmonyCallOut
		finish             string
	}{
		{"answer", harmonyAnswer, false, "", "Hello! How can I help?", "User says hi. <|x|> < reply.", nil, "stop"},
		{"answer with tools", harmonyAnswer, true, "", "Hello! How can I help?", "User says hi. <|x|> < reply.", nil, "stop"},
		{"call", harmonyCall, true, "", "<nil>", "Need the weather.",
			[]harmonyCallOut{{"", "function", "get_weather", `{"city":"Paris","unit":"c"}`}}, "tool_calls"},
		{"call with tool_choice auto", harmonyCall, true, "auto", "<nil>", "Need the weather.",
			[]harmonyCallOut{{"", "function", "get_weather", `{"city":"Paris","unit":"c"}`}}, "tool_calls"},
		{"call with tool_choice none", harmonyCall, true, none, `{"city":"Paris","unit":"c"}`, "Need the weather.", nil, "stop"},
		{"call without tools", harmonyCall, false, "", `{"city":"Paris","unit":"c"}`, "Need the weather.", nil, "stop"},
		{"answer with tool_choice none", harmonyAnswer, true, none, "Hello! How can I help?", "User says hi. <|x|> < reply.", nil, "stop"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url := harmonyServer(t, c.gen)
			body := func() map[string]any {
				b := map[string]any{"max_tokens": 500, "temperature": 0}
				if c.tools {
					b["tools"] = harmonyTools
				}
				if c.choice != "" {
					b["tool_choice"] = c.choice
				}
				return b
			}
			want := chatParts{c.content, c.reasoning, c.calls, c.finish}
			got, raw := chatWhole(t, url, body())
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
			if c.calls != nil && !bytes.Contains(raw, []byte(`"content":null`)) {
				t.Errorf("a call-only message has content null: %s", raw)
			}
			// Streaming: the deltas join to the same message.
			want.content, want.reasoning = strings.TrimPrefix(want.content, "<nil>"), strings.TrimPrefix(want.reasoning, "<nil>")
			if got, raw := chatStream(t, url, body()); !reflect.DeepEqual(got, want) {
				t.Errorf("stream: %+v\nwant %+v\n%s", got, want, raw)
			}
		})
	}
}

// chatParts is what a chat completion came back with: in a whole
// response content and reasoning are "<nil>" when absent or null; joined
// from a stream, "" then. Calls have their ids (checked) cleared.
type chatParts struct {
	content, reasoning string
	calls              []harmonyCallOut
	finish             string
}

// chatWhole posts a chat request and reads its response.
func chatWhole(t *testing.T, url string, body map[string]any) (chatParts, []byte) {
	t.Helper()
	code, raw := postChat(t, url, body)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, raw)
	}
	var out struct {
		Choices []struct {
			Message      harmonyMessage `json:"message"`
			FinishReason string         `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("%v: %s", err, raw)
	}
	msg := out.Choices[0].Message
	calls := callsOf(msg.ToolCalls)
	for i := range calls {
		if !strings.HasPrefix(calls[i].ID, "call_") {
			t.Errorf("call id %q", calls[i].ID)
		}
		calls[i].ID = ""
	}
	return chatParts{str(msg.Content), str(msg.ReasoningContent), calls, out.Choices[0].FinishReason}, raw
}

// chatStream posts a chat request with stream: true and joins its deltas.
func chatStream(t *testing.T, url string, body map[string]any) (chatParts, []byte) {
	t.Helper()
	body["stream"] = true
	code, raw := postChat(t, url, body)
	if code != http.StatusOK {
		t.Fatalf("stream status %d: %s", code, raw)
	}
	var content, reasoning strings.Builder
	var p chatParts
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta        harmonyMessage `json:"delta"`
				FinishReason *string        `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		for _, x := range ch.Choices {
			if x.Delta.Content != nil {
				content.WriteString(*x.Delta.Content)
			}
			if x.Delta.ReasoningContent != nil {
				reasoning.WriteString(*x.Delta.ReasoningContent)
			}
			for _, d := range x.Delta.ToolCalls {
				if d.Index == nil || *d.Index != len(p.calls) && *d.Index != len(p.calls)-1 {
					t.Fatalf("delta index out of order: %s", data)
				}
				if *d.Index == len(p.calls) {
					if !strings.HasPrefix(d.ID, "call_") || d.Type != "function" || d.Function.Name == "" {
						t.Errorf("first fragment of a call lacks id/type/name: %s", data)
					}
					p.calls = append(p.calls, harmonyCallOut{Type: d.Type})
				}
				p.calls[*d.Index].Name += d.Function.Name
				p.calls[*d.Index].Args += d.Function.Arguments
			}
			if x.FinishReason != nil {
				p.finish = *x.FinishReason
			}
		}
	}
	p.content, p.reasoning = content.String(), reasoning.String()
	return p, raw
}

// recorder is an emitter that takes calls and reasoning, as the OpenAI
// chat API does.
type recorder struct {
	text, reasoning strings.Builder
	calls           []harmonyCallOut
}

func (r *recorder) Start(int) error                          { return nil }
func (r *recorder) Text(s string, _ *gen.TokenLogprob) error { r.text.WriteString(s); return nil }
func (r *recorder) Reasoning(s string) error                 { r.reasoning.WriteString(s); return nil }
func (r *recorder) ToolCall(i int, id, name, args string) error {
	if i == len(r.calls) {
		r.calls = append(r.calls, harmonyCallOut{ID: id})
	}
	r.calls[i].Name += name
	r.calls[i].Args += args
	return nil
}

// TestHarmonyEmitterSplits: the emitter gives the same parts however the
// detokenized text is split, including inside a special token (a
// byte-level fallback can do that), at every byte boundary; a generation
// that ends inside a call (<|call|> is EOS, so never emitted) still
// yields it whole, and several calls get distinct indexes and ids.
func TestHarmonyEmitterSplits(t *testing.T) {
	gen := harmonyAnswer[:strings.Index(harmonyAnswer, "<|return|>")] + "<|end|>" +
		"<|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"x\":1}<|call|>" +
		"<|start|>assistant<|channel|>commentary to=functions.b<|message|>{}" // cut at EOS <|call|>
	want := recorder{calls: []harmonyCallOut{{Name: "a", Args: `{"x":1}`}, {Name: "b", Args: "{}"}}}
	want.text.WriteString("Hello! How can I help?")
	want.reasoning.WriteString("User says hi. <|x|> < reply.")
	for cut := 0; cut <= len(gen); cut++ {
		for _, n := range []int{1, 3, len(gen)} {
			var r recorder
			h := newAnswerEmitter(&r, chat.Harmony.NewParser(true, chat.Start{}))
			pieces := []string{gen[:cut]}
			for rest := gen[cut:]; rest != ""; rest = rest[min(n, len(rest)):] {
				pieces = append(pieces, rest[:min(n, len(rest))])
			}
			for _, p := range pieces {
				if err := h.Text(p, nil); err != nil {
					t.Fatal(err)
				}
			}
			calls, err := h.finish()
			if err != nil {
				t.Fatal(err)
			}
			ids := map[string]bool{}
			for i := range r.calls {
				if !strings.HasPrefix(r.calls[i].ID, "call_") || ids[r.calls[i].ID] {
					t.Fatalf("cut %d n %d: call ids %+v", cut, n, r.calls)
				}
				ids[r.calls[i].ID] = true
				r.calls[i].ID = ""
			}
			if calls != 2 || r.text.String() != want.text.String() || r.reasoning.String() != want.reasoning.String() ||
				!reflect.DeepEqual(r.calls, want.calls) {
				t.Fatalf("cut %d n %d: %d calls, text %q reasoning %q calls %+v", cut, n, calls, r.text.String(), r.reasoning.String(), r.calls)
			}
		}
	}
}

// TestHarmonyCallsNeedAnAPIThatTakesThem: an emitter without tool calls
// (the legacy text path) gets an error, not a silently dropped call; one
// without reasoning drops only the reasoning.
func TestHarmonyCallsNeedAnAPIThatTakesThem(t *testing.T) {
	var te textEmitter
	h := newAnswerEmitter(&te, chat.Harmony.NewParser(true, chat.Start{}))
	if err := h.Text(harmonyAnswer, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.finish(); err != nil || te.String() != "Hello! How can I help?" {
		t.Fatalf("answer: %q %v", te.String(), err)
	}
	h = newAnswerEmitter(&te, chat.Harmony.NewParser(true, chat.Start{}))
	err := h.Text(harmonyCall, nil)
	if err == nil {
		_, err = h.finish()
	}
	if err == nil || !strings.Contains(err.Error(), "tool calls") {
		t.Fatalf("call through a text-only emitter: %v", err)
	}
}

func postJSON(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	code, out := postRaw(t, url, "", b)
	return code, []byte(out)
}

// TestHarmonyAdapters: the Responses and Anthropic Messages APIs get a
// harmony model's answer as their text and its call as their function
// call / tool_use; without Anthropic's thinking (anthropic_think_test.go) the analysis
// channel is dropped, never leaked into the answer.
func TestHarmonyAdapters(t *testing.T) {
	respTools := []map[string]any{{"type": "function", "name": "get_weather",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}
	antTools := []map[string]any{{"name": "get_weather",
		"input_schema": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}
	for _, c := range []struct {
		name, gen, path string
		body            map[string]any
		want            []string
		not             []string
	}{
		{"responses answer", harmonyAnswer, "/v1/responses", map[string]any{"model": "m", "input": "hi", "temperature": 0},
			[]string{`"text":"Hello! How can I help?"`}, nil},
		{"responses call", harmonyCall, "/v1/responses", map[string]any{"model": "m", "input": "hi", "temperature": 0, "tools": respTools},
			[]string{`"type":"function_call"`, `"name":"get_weather"`, `"arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"`}, nil},
		{"messages answer", harmonyAnswer, "/v1/messages", map[string]any{"model": "m", "max_tokens": 500, "temperature": 0,
			"messages": []map[string]any{{"role": "user", "content": "hi"}}},
			[]string{`"text":"Hello! How can I help?"`, `"stop_reason":"end_turn"`}, nil},
		{"messages call", harmonyCall, "/v1/messages", map[string]any{"model": "m", "max_tokens": 500, "temperature": 0, "tools": antTools,
			"messages": []map[string]any{{"role": "user", "content": "hi"}}},
			[]string{`"type":"tool_use"`, `"name":"get_weather"`, `"input":{"city":"Paris","unit":"c"}`, `"stop_reason":"tool_use"`}, nil},
		// forced: a call, whatever the model wanted to answer
		{"messages, tool_choice any over an answer", harmonyAnswer, "/v1/messages", map[string]any{"model": "m", "max_tokens": 500, "temperature": 0,
			"tools": []map[string]any{{"name": "get_weather", "input_schema": map[string]any{"type": "object",
				"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 8}}, "required": []string{"city"}, "additionalProperties": false}}},
			"tool_choice": map[string]any{"type": "any"}, "messages": []map[string]any{{"role": "user", "content": "hi"}}},
			[]string{`"type":"tool_use"`, `"name":"get_weather"`, `"input":{"city":`, `"stop_reason":"tool_use"`}, []string{"Hello"}},
		// tool_choice none: a stray call is answer text, never a call
		{"responses call, tool_choice none", harmonyCall, "/v1/responses", map[string]any{"model": "m", "input": "hi", "temperature": 0,
			"tools": respTools, "tool_choice": "none"},
			[]string{`"text":"{\"city\":\"Paris\",\"unit\":\"c\"}"`, `"status":"completed"`}, []string{`function_call`}},
		{"messages call, tool_choice none", harmonyCall, "/v1/messages", map[string]any{"model": "m", "max_tokens": 500, "temperature": 0,
			"tools": antTools, "tool_choice": map[string]any{"type": "none"}, "messages": []map[string]any{{"role": "user", "content": "hi"}}},
			[]string{`"text":"{\"city\":\"Paris\",\"unit\":\"c\"}"`, `"stop_reason":"end_turn"`}, []string{`tool_use`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, raw := postJSON(t, harmonyServer(t, c.gen)+c.path, c.body)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, raw)
			}
			for _, w := range c.want {
				if !bytes.Contains(raw, []byte(w)) {
					t.Errorf("no %s in %s", w, raw)
				}
			}
			for _, leak := range append([]string{"User says hi", "Need the weather", "<|"}, c.not...) {
				if bytes.Contains(raw, []byte(leak)) {
					t.Errorf("%q leaked into %s", leak, raw)
				}
			}
		})
	}
}

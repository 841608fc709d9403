package decode

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/chat"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/tokenizer"

	"github.com/exo-pd/exo-pd/runners/grammar"
)

const pointSchema = `{"type":"object","properties":{"x":{"type":"integer"},"tag":{"enum":["a","b"]}},"required":["x","tag"],"additionalProperties":false}`

var harmonyRF = &gen.ResponseFormat{Type: "json_schema", Name: "p", Schema: json.RawMessage(pointSchema)}

// allowedBy returns the ids left finite by c.Mask over a zero row.
func allowedBy(t *testing.T, c Constraint, v int) map[int32]bool {
	t.Helper()
	l := make([]float32, v)
	if err := c.Mask(l); err != nil {
		t.Fatal(err)
	}
	out := map[int32]bool{}
	for i, x := range l {
		if !math.IsInf(float64(x), -1) {
			out[int32(i)] = true
		}
	}
	return out
}

// grammarAllows is the independent reference for a byte-per-token
// vocabulary: a plain token is allowed when the matcher accepts its byte,
// a control token when the matcher accepts its text, an end token when the
// document is complete.
func grammarAllows(p *pieceText, m *grammar.Matcher, eos []int32) map[int32]bool {
	out := map[int32]bool{}
	for id := range p.VocabSize() {
		b := []byte(p.vocab[id])
		switch {
		case id >= 256 && (int32(id) == eos[0] || int32(id) == eos[1]):
			if m.CanEnd() {
				out[int32(id)] = true
			}
		case m.Accepts(b):
			out[int32(id)] = true
		}
	}
	return out
}

// TestHarmonyDeferredSteps drives a gpt-oss response_format constraint
// token by token over a harmony generation: the header at the start may
// only open the analysis channel or the final one; the analysis body is
// free (every plain token and <|end|>, but no end token or other control
// token); after <|end|> the next message's header is forced to a final
// channel; and in the final body every step's mask is exactly what the
// schema's matcher allows (checked against the matcher itself, byte by
// byte; the document starts at once after <|message|>), ending with an end token once the document is complete.
func TestHarmonyDeferredSteps(t *testing.T) {
	p := newPieceText()
	g := &Grammars{Text: p}
	c, err := g.NewConstraint(&gen.Request{Chat: true, AddGenerationPrompt: true, ResponseFormat: harmonyRF}, chat.Start{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*deferredConstraint); !ok {
		t.Fatalf("constraint %T, want deferred", c)
	}
	doc := `{"x": -12, "tag": "b"}`
	gen := "<|channel|>analysis<|message|>Think { freely } <|x|>.<|end|><|start|>assistant<|channel|>final<|message|>" + doc + "<|return|>"
	script := p.encode(gen)
	bg, err := grammar.Compile([]byte(pointSchema))
	if err != nil {
		t.Fatal(err)
	}
	body := bg.NewMatcher()
	eos := p.EOS()
	inBody, inAnalysis := false, false
	bodySteps, analysisSteps := 0, 0
	text := ""
	for i, tok := range script {
		allowed := allowedBy(t, c, p.VocabSize())
		if !allowed[tok] {
			t.Fatalf("step %d (%q after %q): the scripted token is masked", i, p.vocab[tok], text)
		}
		switch {
		case i == 0:
			if len(allowed) != 1 {
				t.Errorf("first step allows %d tokens, want <|channel|> alone", len(allowed))
			}
		case inAnalysis:
			analysisSteps++
			want := 257 // every byte and <|end|>
			if len(allowed) != want || !allowed[p.ids["<|end|>"]] || allowed[p.ids["<|return|>"]] || allowed[p.ids["<|start|>"]] {
				t.Errorf("analysis step %d allows %d tokens, want the %d plain ones and <|end|>", i, len(allowed), want)
			}
		case inBody:
			bodySteps++
			want := grammarAllows(p, body, eos)
			if strings.HasSuffix(text, "<|message|>") {
				for _, ws := range " \t\r\n" {
					delete(want, ws) // the body begins right after the header, with no white space
				}
			}
			if !reflect.DeepEqual(allowed, want) {
				t.Fatalf("body step %d after %q: mask %v, matcher %v", i, text, keys(allowed), keys(want))
			}
		case strings.HasSuffix(text, "<|end|>"):
			if len(allowed) != 1 || !allowed[p.ids["<|start|>"]] {
				t.Errorf("after <|end|>: %v, want <|start|> alone", keys(allowed))
			}
		case strings.HasSuffix(text, "<|start|>assistant<|channel|>"):
			// the final channel (no more analysis)
			if len(allowed) != 1 || !allowed['f'] {
				t.Errorf("channel: %v, want f", keys(allowed))
			}
		case strings.HasSuffix(text, "<|start|>assistant<|channel|>final"):
			// the body, or the content type first
			if len(allowed) != 2 || !allowed[' '] || !allowed[p.ids["<|message|>"]] {
				t.Errorf("after final: %v, want ' ' or <|message|>", keys(allowed))
			}
		}
		if err := c.Accept(tok); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if inBody && !p.IsSpecial(tok) {
			if err := body.Advance([]byte(p.vocab[tok])); err != nil {
				t.Fatal(err)
			}
		}
		text += p.vocab[tok]
		inAnalysis = strings.HasSuffix(text, "analysis<|message|>") || inAnalysis && !strings.HasSuffix(text, "<|end|>")
		inBody = inBody || strings.HasSuffix(text, "final<|message|>")
	}
	if !c.Done() || bodySteps != len(doc)+1 || analysisSteps != len("Think { freely } <|x|>.")+1 {
		t.Fatalf("done %v after %d body and %d analysis steps", c.Done(), bodySteps, analysisSteps)
	}
}

func keys(m map[int32]bool) []int32 {
	var out []int32
	for k := range m {
		out = append(out, k)
	}
	return out
}

var (
	cityTool = map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "strict": true,
		"parameters": json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","maxLength":8}},"required":["city"],"additionalProperties":false}`)}}
	addTool = map[string]any{"type": "function", "function": map[string]any{"name": "add",
		"parameters": json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`)}}
	toolSchemas = map[string]string{
		"get_weather": `{"type":"object","properties":{"city":{"type":"string","maxLength":8}},"required":["city"],"additionalProperties":false}`,
		"add":         `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}`,
	}
)

// TestHarmonyConstrainedAnswers: on a gpt-oss (harmony) model,
// response_format, tool_choice "required" / named and strict tools are
// enforced once the answer begins, whatever the model wants to write:
// its reasoning (analysis channel) comes back untouched as
// reasoning_content, the answer validates against the schema (an
// independent validator), calls are of an offered tool (named: that one)
// with valid arguments and finish_reason "tool_calls", and a stream joins
// to the same message. max_reasoning_tokens ends an endless reasoning
// after that many tokens.
func TestHarmonyConstrainedAnswers(t *testing.T) {
	prose := "<|channel|>analysis<|message|>Need a point.<|end|><|start|>assistant<|channel|>final<|message|>Sure: x is 3, tag b.<|return|>"
	endless := "<|channel|>analysis<|message|>" + strings.Repeat("hmm ", 40)
	badArgs := "<|channel|>analysis<|message|>Need the weather.<|end|>" +
		"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" +
		`{"city":"Paris","unit":"c"}<|call|>`
	point := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p", "schema": json.RawMessage(pointSchema)}}
	cases := []struct {
		name, gen string
		body      map[string]any
		reasoning string
		schema    string // content validates against it ("": content is the plain answer, want)
		want      string
		call      string // the one call's name ("": none)
	}{
		{"json_schema over prose", prose, map[string]any{"response_format": point}, "Need a point.", pointSchema, "", ""},
		{"json_object", strings.Replace(prose, "Sure: x is 3, tag b.", `{"a": [1, true]}`, 1), map[string]any{"response_format": map[string]any{"type": "json_object"}},
			"Need a point.", `{"type":"object"}`, "", ""},
		{"json_object, final with a content type", strings.Replace(prose, "final<|message|>Sure: x is 3, tag b.", `final <|constrain|>json<|message|>{"a": 1}`, 1),
			map[string]any{"response_format": map[string]any{"type": "json_object"}}, "Need a point.", `{"type":"object","required":["a"]}`, "", ""},
		{"required over an answer", harmonyAnswer, map[string]any{"tools": []any{cityTool}, "tool_choice": "required"},
			"User says hi. <|x|> < reply.", "", "", "get_weather"},
		{"named over a call of another tool", harmonyCall, map[string]any{"tools": []any{cityTool, addTool},
			"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "add"}}}, "Need the weather.", "", "", "add"},
		{"strict auto: a call's arguments", badArgs, map[string]any{"tools": []any{cityTool}}, "Need the weather.", "", "", "get_weather"},
		{"strict auto: a plain answer stays free", harmonyAnswer, map[string]any{"tools": []any{cityTool}},
			"User says hi. <|x|> < reply.", "", "Hello! How can I help?", ""},
		{"max_reasoning_tokens", endless, map[string]any{"response_format": point, "max_reasoning_tokens": 6}, "hmm hm", pointSchema, "", ""},
		{"add_generation_prompt false: the model opens its message", "<|start|>assistant" + prose, map[string]any{"response_format": point, "add_generation_prompt": false},
			"Need a point.", pointSchema, "", ""},
		{"max_reasoning_tokens, auto", endless, map[string]any{"max_reasoning_tokens": 5}, "hmm h", "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url := harmonyServer(t, c.gen)
			body := func() map[string]any {
				b := map[string]any{"max_tokens": 400, "temperature": 0}
				for k, v := range c.body {
					b[k] = v
				}
				return b
			}
			got, raw := chatWhole(t, url, body())
			t.Logf("%+v", got)
			if got.reasoning != c.reasoning {
				t.Errorf("reasoning %q, want %q", got.reasoning, c.reasoning)
			}
			switch {
			case c.call != "":
				if len(got.calls) != 1 || got.calls[0].Name != c.call || got.finish != "tool_calls" || got.content != "<nil>" {
					t.Fatalf("want one call of %s: %+v\n%s", c.call, got, raw)
				}
				validate(t, validator(t, toolSchemas[c.call]), got.calls[0].Args)
			case c.schema != "":
				if got.finish != "stop" || got.calls != nil {
					t.Fatalf("%+v", got)
				}
				validate(t, validator(t, c.schema), got.content)
			case c.want != "":
				if got.content != c.want || got.finish != "stop" {
					t.Fatalf("%+v, want content %q", got, c.want)
				}
			default: // capped free answer: the final channel, whatever it holds
				if got.finish != "stop" && got.finish != "length" || got.calls != nil {
					t.Fatalf("%+v", got)
				}
			}
			want := got
			want.content, want.reasoning = strings.TrimPrefix(want.content, "<nil>"), strings.TrimPrefix(want.reasoning, "<nil>")
			if s, raw := chatStream(t, url, body()); !reflect.DeepEqual(s, want) {
				t.Errorf("stream: %+v\nwant %+v\n%s", s, want, raw)
			}
		})
	}
}

// TestDeferredErrors: what a deferred grammar cannot do is a 400 naming
// the field.
func TestDeferredErrors(t *testing.T) {
	url := harmonyServer(t, harmonyAnswer)
	for _, c := range []struct {
		field string
		body  map[string]any
	}{
		{"tools[0].function.parameters", map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{
			"name": "f", "strict": true, "parameters": map[string]any{"type": "object", "patternProperties": map[string]any{"^s": map[string]any{"type": "string"}}}}}}}},
		{"continue_final_message", map[string]any{"response_format": map[string]any{"type": "json_object"}, "continue_final_message": true,
			"messages": []map[string]any{{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}}}},
		{"max_reasoning_tokens", map[string]any{"max_reasoning_tokens": 0}},
		{"tools[0].function.name", map[string]any{"tools": []map[string]any{{"type": "function", "function": map[string]any{"name": "get weather<|message|>"}}},
			"tool_choice": "required"}},
		{"response_format.json_schema.schema", map[string]any{"response_format": map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "x", "schema": map[string]any{"type": "object", "patternProperties": map[string]any{"^a": map[string]any{}}}}}}},
		{"tool_choice", map[string]any{"tools": harmonyTools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}},
	} {
		code, raw := postChat(t, url, c.body)
		if code != http.StatusBadRequest || !bytes.Contains(raw, []byte(`"param":"`+c.field+`"`)) {
			t.Errorf("%s: status %d %s", c.field, code, raw)
		}
	}
	// Qwen3: the same field named
	q := newQwen3Server(t, qwen3Think)
	code, raw := postChat(t, q.url, map[string]any{"response_format": map[string]any{"type": "json_schema",
		"json_schema": map[string]any{"name": "x", "schema": map[string]any{"type": "object", "patternProperties": map[string]any{"^a": map[string]any{}}}}}})
	if code != http.StatusBadRequest || !bytes.Contains(raw, []byte(`"param":"response_format.json_schema.schema"`)) {
		t.Errorf("qwen3 schema: status %d %s", code, raw)
	}
	// Qwen3 reasons, but an unconstrained answer has no place to cap it
	if code, raw := postChat(t, q.url, map[string]any{"max_reasoning_tokens": 5}); code != http.StatusBadRequest || !bytes.Contains(raw, []byte(`"param":"max_reasoning_tokens"`)) {
		t.Errorf("qwen3 max_reasoning_tokens unconstrained: status %d %s", code, raw)
	}
	// a model that does not reason has no use for max_reasoning_tokens
	s := newGrammarServer(t)
	body := map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "x"}}, "max_tokens": 4, "max_reasoning_tokens": 8}
	if code := s.post(t, "/v1/chat/completions", body, nil); code != http.StatusBadRequest {
		t.Errorf("max_reasoning_tokens on a model that does not reason: status %d", code)
	}
}

// TestThinkConstrainedAnswers: on a Qwen3-template model, response_format
// and tool_choice "required" start after </think> (or at once when the
// model does not reason): the reasoning comes back untouched as
// reasoning_content, the answer validates, a forced call is parsed, and
// a stream joins to the same message; with a template whose prompt opens
// <think> the output starts free; max_reasoning_tokens closes an endless
// reasoning.
func TestThinkConstrainedAnswers(t *testing.T) {
	src, err := os.ReadFile("../chat/testdata/qwen3_real_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	opened := strings.Replace(string(src), `{{- '<|im_start|>assistant\n' }}`, `{{- '<|im_start|>assistant\n<think>\n' }}`, 1)
	point := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p", "schema": json.RawMessage(pointSchema)}}
	endless := strings.Repeat("hmm ", 60)
	user := []gen.Message{{Role: "user", Content: "hi"}}
	weather := apiTools(t, []any{cityTool})
	cases := []struct {
		name, template, gen string
		body                map[string]any
		reasoning           string // "prefix:" + text: a prefix of text
		call                string
	}{
		{"json_schema over prose", string(src), "<think>\nThe user wants a point. { not json }\n</think>\n\nSure: x is 3.",
			map[string]any{"response_format": point}, "The user wants a point. { not json }", ""},
		{"json_schema without reasoning", string(src), `{"x": 1, "tag": "a"}`, map[string]any{"response_format": point}, "<nil>", ""},
		{"required over prose", string(src), qwen3Think, map[string]any{"tools": []any{cityTool}, "tool_choice": "required", "parallel_tool_calls": false},
			"The user greets me.\nReply briefly.", "get_weather"},
		{"opened by the prompt", opened, "Thinking { about } it.\n</think>\n\nSure: x is 3.", map[string]any{"response_format": point}, "Thinking { about } it.", ""},
		{"max_reasoning_tokens", string(src), "<think>\n" + endless, map[string]any{"response_format": point, "max_reasoning_tokens": 6}, "prefix:" + endless, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := serveTemplate(t, c.template, c.gen)
			var tl []gen.Tool
			if c.call != "" {
				tl = weather
			}
			q.aim(t, user, tl)
			body := func() map[string]any {
				b := map[string]any{"max_tokens": 500, "temperature": 0}
				for k, v := range c.body {
					b[k] = v
				}
				return b
			}
			got, raw := chatWhole(t, q.url, body())
			t.Logf("%+v", got)
			if p, ok := strings.CutPrefix(c.reasoning, "prefix:"); ok {
				if got.reasoning == "" || got.reasoning == "<nil>" || !strings.HasPrefix(p, got.reasoning) || len(q.tok.Encode(got.reasoning)) > 6 {
					t.Errorf("reasoning %q: want at most 6 tokens of %q", got.reasoning, p)
				}
			} else if got.reasoning != c.reasoning {
				t.Errorf("reasoning %q, want %q", got.reasoning, c.reasoning)
			}
			if c.call != "" {
				if len(got.calls) != 1 || got.calls[0].Name != c.call || got.finish != "tool_calls" {
					t.Fatalf("want one call of %s: %+v\n%s", c.call, got, raw)
				}
				validate(t, validator(t, toolSchemas[c.call]), got.calls[0].Args)
			} else {
				if got.finish != "stop" {
					t.Fatalf("%+v", got)
				}
				validate(t, validator(t, pointSchema), got.content)
			}
			want := got
			want.content, want.reasoning = strings.TrimPrefix(want.content, "<nil>"), strings.TrimPrefix(want.reasoning, "<nil>")
			if s, raw := chatStream(t, q.url, body()); !reflect.DeepEqual(s, want) {
				t.Errorf("stream: %+v\nwant %+v\n%s", s, want, raw)
			}
		})
	}
}

// TestDeferredRandomWalks: generations made of random choices among the
// tokens each mask allows (a model that can be anything) always end, within
// a bound, in an answer that parses and validates: for gpt-oss's harmony
// under response_format, tool_choice "required" and a named tool, with a
// random reasoning budget; the reasoning never holds more tokens than the
// budget.
func TestDeferredRandomWalks(t *testing.T) {
	p := newPieceText()
	g := &Grammars{Text: p}
	tools := apiTools(t, []any{cityTool, addTool})
	reqs := map[string]*gen.Request{
		"response_format": {Chat: true, AddGenerationPrompt: true, ResponseFormat: harmonyRF},
		"required":        {Chat: true, AddGenerationPrompt: true, Tools: tools, ToolChoice: &gen.ToolChoice{Mode: "required"}},
		"named":           {Chat: true, AddGenerationPrompt: true, Tools: tools, ToolChoice: &gen.ToolChoice{Mode: "function", Name: "add"}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	reasoned, capped := 0, 0
	for name, req := range reqs {
		for walk := range 40 {
			r := *req
			r.MaxReasoningTokens = 1 + rng.IntN(30)
			c, err := g.NewConstraint(&r, chat.Start{})
			if err != nil {
				t.Fatal(err)
			}
			var text strings.Builder
			ended := false
			for step := 0; step < 2000 && !ended; step++ {
				allowed := keys(allowedBy(t, c, p.VocabSize()))
				slices.Sort(allowed)
				tok := allowed[rng.IntN(len(allowed))]
				if err := c.Accept(tok); err != nil {
					t.Fatalf("%s walk %d: %v", name, walk, err)
				}
				if tok == p.ids["<|return|>"] || tok == p.ids["<|call|>"] {
					ended = true
					continue
				}
				text.WriteString(p.vocab[tok])
			}
			if !ended || !c.Done() {
				t.Fatalf("%s walk %d: no end after 2000 tokens: %q", name, walk, text.String())
			}
			var rec recorder
			h := newAnswerEmitter(&rec, chat.Harmony.NewParser(true, chat.Start{}))
			if err := h.Text(text.String(), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := h.finish(); err != nil {
				t.Fatal(err)
			}
			n := len(p.encode(rec.reasoning.String()))
			if n > r.MaxReasoningTokens {
				t.Fatalf("%s walk %d: %d reasoning tokens, budget %d: %q", name, walk, n, r.MaxReasoningTokens, text.String())
			}
			if n > 0 {
				reasoned++
			}
			if n == r.MaxReasoningTokens {
				capped++
			}
			switch name {
			case "response_format":
				if len(rec.calls) != 0 {
					t.Fatalf("%s walk %d: calls in %q", name, walk, text.String())
				}
				validate(t, validator(t, pointSchema), rec.text.String())
			default:
				if len(rec.calls) != 1 || rec.text.Len() != 0 || name == "named" && rec.calls[0].Name != "add" {
					t.Fatalf("%s walk %d: %+v %q in %q", name, walk, rec.calls, rec.text.String(), text.String())
				}
				validate(t, validator(t, toolSchemas[rec.calls[0].Name]), rec.calls[0].Args)
			}
		}
	}
	if reasoned < 20 || capped < 10 {
		t.Fatalf("of 120 walks %d reasoned and %d reached their budget: the walks do not exercise the reasoning", reasoned, capped)
	}
	t.Logf("of 120 walks %d reasoned, %d reached their budget", reasoned, capped)
}

// TestThinkRandomWalks is TestDeferredRandomWalks for a Qwen3-template
// model (a byte-level BPE vocabulary whose tokens span several bytes, so
// </think> and the answer's wrappers are spelled across tokens): with the
// reasoning opened by the model or by the prompt, response_format and
// tool_choice "required" end in an answer that parses (reasoning split off
// as the server does) and validates.
func TestThinkRandomWalks(t *testing.T) {
	tok, err := tokenizer.Load("../tokenizer/testdata/tiny_qwen2")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../chat/testdata/qwen3_real_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Parse(string(src), "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	text := NewText(tok, tmpl)
	g := &Grammars{Text: text}
	tools := apiTools(t, []any{cityTool, addTool})
	no := false
	reqs := map[string]*gen.Request{
		"response_format": {Chat: true, AddGenerationPrompt: true, ResponseFormat: harmonyRF},
		"required":        {Chat: true, AddGenerationPrompt: true, Tools: tools, ToolChoice: &gen.ToolChoice{Mode: "required"}, ParallelToolCalls: &no},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	reasoned := 0
	for name, req := range reqs {
		for walk := range 30 {
			r := *req
			r.MaxReasoningTokens = 1 + rng.IntN(20)
			open := walk%2 == 1
			c, err := g.NewConstraint(&r, chat.Start{Reasoning: open})
			if err != nil {
				t.Fatal(err)
			}
			var ids []int32
			ended := false
			for step := 0; step < 3000 && !ended; step++ {
				allowed := keys(allowedBy(t, c, tok.VocabSize()))
				slices.Sort(allowed)
				id := allowed[rng.IntN(len(allowed))]
				if err := c.Accept(id); err != nil {
					t.Fatalf("%s walk %d: %v", name, walk, err)
				}
				if slices.Contains(tok.EOS(), id) {
					ended = true
					continue
				}
				ids = append(ids, id)
			}
			out := tok.Decode(ids)
			if !ended || !c.Done() {
				t.Fatalf("%s walk %d: no end after 3000 tokens: %q", name, walk, out)
			}
			var rec recorder
			th := newAnswerEmitter(&rec, chat.Think(chat.Hermes).NewParser(true, chat.Start{Reasoning: open}))
			if err := th.Text(out, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := th.finish(); err != nil {
				t.Fatal(err)
			}
			if rec.reasoning.Len() > 0 {
				reasoned++
			}
			if name == "response_format" {
				validate(t, validator(t, pointSchema), rec.text.String())
				continue
			}
			if len(rec.calls) != 1 || strings.TrimSpace(rec.text.String()) != "" {
				t.Fatalf("%s walk %d: %+v %q in %q", name, walk, rec.calls, rec.text.String(), out)
			}
			validate(t, validator(t, toolSchemas[rec.calls[0].Name]), rec.calls[0].Args)
		}
	}
	if reasoned < 30 {
		t.Fatalf("only %d of 60 walks reasoned", reasoned)
	}
	t.Logf("%d of 60 walks reasoned", reasoned)
}

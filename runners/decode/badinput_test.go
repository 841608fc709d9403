package decode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// postRaw sends raw JSON to url+path and returns the status and body.
func postRaw(t *testing.T, url, path string, body []byte) (int, string) {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

// TestBadInputSchemas: schemas built to cost unbounded work (10,000
// properties, nesting 1,000 deep, a pattern whose automaton explodes,
// one that admits nothing) are a 400 that says why, through the OpenAI
// response_format, a forced OpenAI tool, and a forced Anthropic tool.
func TestBadInputSchemas(t *testing.T) {
	s := newGrammarServer(t)
	var wide strings.Builder
	wide.WriteString(`{"type":"object","properties":{`)
	for i := range 10000 {
		if i > 0 {
			wide.WriteByte(',')
		}
		fmt.Fprintf(&wide, `"p%d":{"type":"string"}`, i)
	}
	wide.WriteString(`}}`)
	deep := strings.Repeat(`{"type":"object","properties":{"a":`, 1000) + `{"type":"string"}` + strings.Repeat(`}}`, 1000)
	cases := []struct {
		name, schema, want string
	}{
		{"10,000 properties", wide.String(), "more than 64"},
		{"depth 1,000", deep, "nested more than"},
		{"exploding pattern", `{"type":"object","properties":{"s":{"type":"string","pattern":"(a|b)*a(a|b){20}"}},"required":["s"]}`, "pattern too complex"},
		{"long pattern", `{"type":"object","properties":{"s":{"type":"string","pattern":"` + strings.Repeat("(a|b)", 1000) + `"}}}`, "too complex"},
		{"admits nothing", `{"type":"object","properties":{"s":false},"required":["s"]}`, "admits no JSON document"},
	}
	for _, c := range cases {
		bodies := map[string][2]string{
			"openai response_format": {"/v1/chat/completions", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"x"}],` +
				`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":` + c.schema + `}}}`},
			"openai forced tool": {"/v1/chat/completions", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"x"}],` +
				`"tools":[{"type":"function","function":{"name":"f","parameters":` + c.schema + `}}],"tool_choice":"required"}`},
			"anthropic forced tool": {"/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"x"}],` +
				`"tools":[{"name":"f","input_schema":` + c.schema + `}],"tool_choice":{"type":"any"}}`},
		}
		for api, pb := range bodies {
			code, body := postRaw(t, s.url, pb[0], []byte(pb[1]))
			if code != http.StatusBadRequest || !strings.Contains(body, c.want) {
				t.Errorf("%s via %s: status %d %.300s, want 400 saying %q", c.name, api, code, body, c.want)
			}
		}
	}
}

// TestBadInputPromptAndContent: a prompt longer than the context is a 400
// before any work (both APIs); max_tokens beyond the context ends the
// generation at the context with finish_reason "length"; invalid UTF-8 in
// content is replaced (U+FFFD, as encoding/json decodes it), not a 500.
func TestBadInputPromptAndContent(t *testing.T) {
	s := newGrammarServer(t) // context: 2,048 positions
	long := strings.Repeat("lorem ipsum dolor sit amet ", 1500)
	for _, p := range [][2]string{
		{"/v1/chat/completions", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + long + `"}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + long + `"}]}`},
		{"/v1/completions", `{"model":"m","max_tokens":4,"prompt":"` + long + `"}`},
	} {
		code, body := postRaw(t, s.url, p[0], []byte(p[1]))
		if code != http.StatusBadRequest || !strings.Contains(body, "context") {
			t.Errorf("%s, prompt over the context: status %d %.300s", p[0], code, body)
		}
	}
	var out struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	code, body := postRaw(t, s.url, "/v1/completions", []byte(`{"model":"m","max_tokens":100000,"ignore_eos":true,"temperature":0,"prompt":"`+strings.Repeat("word ", 500)+`"}`))
	if code != 200 {
		t.Fatalf("max_tokens beyond the context: status %d %.300s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	if out.Choices[0].FinishReason != "length" || out.Usage.PromptTokens+out.Usage.CompletionTokens > 2048 || out.Usage.CompletionTokens == 0 {
		t.Errorf("max_tokens beyond the context: finish %q, usage %+v (context 2048)", out.Choices[0].FinishReason, out.Usage)
	}
	for _, p := range [][2]string{
		{"/v1/chat/completions", "{\"model\":\"m\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9 \xff\xfe ok\"}]}"},
		{"/v1/messages", "{\"model\":\"m\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9 \xff\xfe ok\"}]}"},
	} {
		if code, body := postRaw(t, s.url, p[0], []byte(p[1])); code != 200 {
			t.Errorf("%s, invalid UTF-8 in content: status %d %.300s", p[0], code, body)
		}
	}
	// What the model saw: the replacement character where the bytes were.
	var tk struct {
		Tokens []int32 `json:"tokens"`
	}
	if code, body := postRaw(t, s.url, "/tokenize", []byte("{\"model\":\"m\",\"prompt\":\"a\xffb\"}")); code == 200 {
		if err := json.Unmarshal([]byte(body), &tk); err != nil {
			t.Fatal(err)
		}
		if got, want := s.tok.Decode(tk.Tokens), "a\uFFFDb"; !strings.Contains(got, want) {
			t.Errorf("tokenized %q, want it to hold %q", got, want)
		}
	} else {
		t.Errorf("/tokenize: status %d %.300s", code, body)
	}
}

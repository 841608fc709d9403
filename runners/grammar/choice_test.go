package grammar

import "testing"

// TestChoice: a head-only alternative is complete after its head, a
// headed body needs its head then a valid body, the head decides the
// body (a tool's header its arguments' schema), and white space before
// the first head is taken only with space.
func TestChoice(t *testing.T) {
	const (
		analysis = "<|channel|>analysis<|message|>"
		final    = "<|channel|>final<|message|>"
		callHead = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
	)
	alts := []Alt{
		{Head: analysis},
		{Head: final, Schema: []byte(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)},
		{Head: callHead, Schema: testTools[1].Parameters},
		{Head: "<|channel|>commentary to=functions.noargs <|constrain|>json<|message|>", Object: true},
		{Head: "<tool_call>", Tools: testTools[:1], Format: CallFormat{Prefix: "\n", ArgsKey: "arguments"}, Object: true},
	}
	g, err := Choice(alts, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{
		analysis,
		final + `{"n": 3}`,
		callHead + `{"a":1,"b":2}`,
		"<|channel|>commentary to=functions.noargs <|constrain|>json<|message|>{\"x\":[true]}",
		"<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}",
		"<tool_call>{\"any\":1}",
	} {
		if !complete(g, d) {
			t.Errorf("%q rejected", d)
		}
	}
	for _, d := range []string{
		" " + analysis, // no leading space without space
		analysis + "x",
		final,
		final + `{"a":1,"b":2}`,
		callHead + `{"n":3}`,
		"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}",
		`{"n": 3}`,
	} {
		if complete(g, d) {
			t.Errorf("%q accepted", d)
		}
	}
	sp, err := Choice(alts, true)
	if err != nil {
		t.Fatal(err)
	}
	if !complete(sp, "\n\n"+analysis) {
		t.Error("with space: leading white space rejected")
	}
	if _, err := Choice(nil, false); err == nil {
		t.Error("no alternatives accepted")
	}
	if _, err := Choice([]Alt{{}}, false); err == nil {
		t.Error("an empty alternative accepted")
	}
	if _, err := Choice([]Alt{{Head: "x", Schema: []byte(`{"patternProperties":{"a":{}}}`)}}, false); err == nil {
		t.Error("an unsupported schema accepted")
	}
}

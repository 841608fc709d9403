package anthropic

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/exo-pd/exo-pd/runners/openai"
)

// FuzzMessagesRoundTrip: a Messages request the decoder accepts encodes
// to JSON that it accepts again, that encoding is a fixed point, and
// nothing panics on the way.
func FuzzMessagesRoundTrip(f *testing.F) {
	f.Add(`{"model":"tiny","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`)
	f.Add(`{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{"type":"object","properties":{"a":{"type":"string","format":"date"}}}}],"tool_choice":{"type":"any"}}`)
	f.Add(`{"model":"tiny","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"x","name":"f","input":{}}]}],"stop_sequences":["a"]}`)
	f.Add("{\"model\":\"tiny\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}")
	f.Add(`{"model":"tiny","max_tokens":50,"thinking":{"type":"enabled","budget_tokens":10},"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"}]}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		if checkBlocks([]byte(s), true) != nil {
			return
		}
		var r Request
		if openai.DecodeStrict([]byte(s), &r, requestShape) != nil {
			return
		}
		b1, err := json.Marshal(&r)
		if err != nil {
			return
		}
		var r2 Request
		if e := openai.DecodeStrict(b1, &r2, requestShape); e != nil {
			t.Fatalf("its own encoding %s is refused: %v", b1, e)
		}
		b2, err := json.Marshal(&r2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("encoding is not a fixed point:\n%s\n%s", b1, b2)
		}
	})
}

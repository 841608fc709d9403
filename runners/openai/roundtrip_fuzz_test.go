package openai

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzRequestRoundTrip: a chat or completion request the decoder accepts
// encodes to JSON that it accepts again, and that encoding is a fixed
// point (decode, encode, decode, encode gives the same bytes), and
// nothing panics on the way.
func FuzzRequestRoundTrip(f *testing.F) {
	f.Add(`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stop":["a"],"max_tokens":3}`)
	f.Add(`{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object", "properties":{"a":{"type":"string","pattern":"^a+$"}}}}}}`)
	f.Add(`{"model":"tiny","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required"}`)
	f.Add(`{"model":"tiny","prompt":[1,2,3],"logit_bias":{"5":-100}}`)
	f.Add("{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}")
	f.Fuzz(func(t *testing.T, s string) {
		var r ChatRequest
		if decodeJSON([]byte(s), &r, chatShape) == nil {
			roundTrip(t, &r, func(b []byte, v *ChatRequest) *Error { return decodeJSON(b, v, chatShape) })
		}
		var c CompletionRequest
		if decodeJSON([]byte(s), &c, completionShape) == nil {
			roundTrip(t, &c, func(b []byte, v *CompletionRequest) *Error { return decodeJSON(b, v, completionShape) })
		}
	})
}

func roundTrip[T any](t *testing.T, r *T, decode func([]byte, *T) *Error) {
	t.Helper()
	b1, err := json.Marshal(r)
	if err != nil {
		return // values JSON cannot hold (none are expected; the decoder made them)
	}
	var r2 T
	if err := decode(b1, &r2); err != nil {
		t.Fatalf("its own encoding %s is refused: %v", b1, err)
	}
	b2, err := json.Marshal(&r2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("encoding is not a fixed point:\n%s\n%s", b1, b2)
	}
}

// TestEmptyKeyRefused: a key "" is a field like any other: refused by
// name, and it does not hide the keys after it (it once did: the check
// returned the empty path, which reads as "nothing refused").
func TestEmptyKeyRefused(t *testing.T) {
	var r ChatRequest
	e := decodeJSON([]byte(`{"":1,"model":"m","messages":[{"role":"user","content":"x"}],"zzz":2}`), &r, chatShape)
	if e == nil || e.Param != `""` {
		t.Fatalf("err %v, want one naming the empty key", e)
	}
}

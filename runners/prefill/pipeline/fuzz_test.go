package pipeline

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzParseMsg: an Open frame's body never panics the decoder, and one it
// accepts encodes back to a body that decodes to the same message.
func FuzzParseMsg(f *testing.F) {
	for _, m := range []pipeMsg{{Kind: "begin", Tokens: []int32{1, 2, 3}, From: 1, Origin: 1 << 60}, {Kind: "want", Tokens: []int32{5, 6}, Seen: 7}} {
		b, _ := json.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte(`{"kind":"begin","tokens":[1,-2],"from":0}`))
	f.Add([]byte(`{"kind":"x","tokens":[1,2],"from":9}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"kind":"want","tokens":[1,2],"from":0,"seen":-1}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := parseMsg(body, 100)
		if err != nil {
			return
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := parseMsg(b, 100)
		if err != nil || m2.Kind != m.Kind || m2.From != m.From || m2.Origin != m.Origin || m2.Seen != m.Seen || !slices.Equal(m2.Tokens, m.Tokens) {
			t.Fatalf("round trip: %+v -> %+v, %v", m, m2, err)
		}
	})
}

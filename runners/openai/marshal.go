package openai

import "encoding/json"

// The encodings of the request types that decode from more than one
// shape: each writes the shape its UnmarshalJSON reads back to the same
// value (FuzzRequestRoundTrip), so a request can be logged, replayed or
// forwarded as it was understood.

// MarshalJSON writes "auto" | "none" | "required" or the function object.
func (t ToolChoice) MarshalJSON() ([]byte, error) {
	if t.Mode == "function" {
		var o struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		o.Type, o.Function.Name = "function", t.Name
		return json.Marshal(o)
	}
	return json.Marshal(t.Mode)
}

// MarshalJSON writes the text, the token ids, or null when unset.
func (p Prompt) MarshalJSON() ([]byte, error) {
	switch {
	case !p.Set:
		return []byte("null"), nil
	case p.IsIDs:
		if p.Tokens == nil {
			return []byte("[]"), nil
		}
		return json.Marshal(p.Tokens)
	}
	return json.Marshal(p.Text)
}

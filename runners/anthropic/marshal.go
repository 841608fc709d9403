package anthropic

import "encoding/json"

// MarshalJSON writes content as UnmarshalJSON reads it back to the same
// value: the blocks when it came as blocks, else the string (null when
// absent), so a request can be logged or replayed as it was understood
// (FuzzMessagesRoundTrip).
func (c Content) MarshalJSON() ([]byte, error) {
	switch {
	case !c.Set:
		return []byte("null"), nil
	case c.Blocks != nil:
		return json.Marshal(c.Blocks)
	}
	return json.Marshal(c.Text)
}

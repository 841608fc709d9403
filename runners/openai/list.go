package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// Decoding errors carry their JSON path. encoding/json gives a
// *json.UnmarshalTypeError the path of the struct fields it is under (in
// its Field) and nothing else: no array index, and no path at all for an
// error of another type that a field's UnmarshalJSON returns. So every
// request type here that decodes itself fails with a
// *json.UnmarshalTypeError (its Field: the path inside the value, "" for
// the value itself; its Type: the type, whose JSONKind says what was
// expected), and every request array is a List, which adds the index of
// the element that failed. decodeJSON turns the path into the JSON path it
// names ("messages[1].content").

// JSONKinder is a request type that decodes from more than one JSON shape:
// JSONKind says which, for errors ("a string or an array of strings").
type JSONKinder interface{ JSONKind() string }

// List is a JSON array of T whose decoding errors name the element that
// failed (see above); null is an absent (nil) list.
type List[T any] []T

// UnmarshalJSON decodes the array element by element.
func (l *List[T]) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		*l = nil
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return typeError(b, reflect.TypeFor[List[T]]())
	}
	out := make(List[T], len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &out[i]); err != nil {
			return atIndex(i, err)
		}
	}
	*l = out
	return nil
}

// StringOrList decodes b, a field that is a string or an array of T, into
// *s or *l (null: a nil list); another value is a type error naming t,
// the field's type.
func StringOrList[T any](b []byte, s *string, l *[]T, t reflect.Type) error {
	switch valueKind(b) {
	case "string":
		return json.Unmarshal(b, s)
	case "array", "null":
		var items List[T]
		err := json.Unmarshal(b, &items)
		*l = items
		return err
	}
	return typeError(b, t)
}

// typeError is the error of a value b that cannot decode into a t.
func typeError(b []byte, t reflect.Type) *json.UnmarshalTypeError {
	return &json.UnmarshalTypeError{Value: valueKind(b), Type: t}
}

// atIndex puts element i of an array in front of a decoding error's path
// (an error of another kind is returned as it is).
func atIndex(i int, err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	p := fmt.Sprintf("[%d]", i)
	if te.Field != "" {
		p += "." + te.Field // ".[" is read as "[" (jsonPath)
	}
	te.Field = p
	return te // itself, not wrapped: encoding/json adds the fields above to this type only
}

// valueKind names the JSON value b as encoding/json's type errors do.
func valueKind(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

func isNull(b []byte) bool { return bytes.Equal(bytes.TrimSpace(b), []byte("null")) }

package sse

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func readAll(t testing.TB, s string, max int) ([]Event, error) {
	t.Helper()
	r := NewReaderSize(strings.NewReader(s), max)
	var out []Event
	for {
		ev, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		out = append(out, ev)
	}
}

func TestReader(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Event
		err      error
	}{
		{"openai", "data: {\"a\":1}\n\ndata: [DONE]\n\n",
			[]Event{{Data: `{"a":1}`, Retry: -1}, {Data: "[DONE]", Retry: -1}}, nil},
		{"anthropic", "event: message_start\ndata: {}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n",
			[]Event{{Type: "message_start", Data: "{}", Retry: -1}, {Type: "ping", Data: `{"type": "ping"}`, Retry: -1}}, nil},
		{"multi-line data", "data: a\ndata:b\ndata:  c\n\n", []Event{{Data: "a\nb\n c", Retry: -1}}, nil},
		{"CRLF and CR", "data: a\r\n\r\ndata: b\r\rdata: c\n\n",
			[]Event{{Data: "a", Retry: -1}, {Data: "b", Retry: -1}, {Data: "c", Retry: -1}}, nil},
		{"comments and unknown fields", ": keep-alive\n\nfoo: bar\ndata: x\n: mid\n\n", []Event{{Data: "x", Retry: -1}}, nil},
		{"no data: nothing dispatched", "event: lonely\n\ndata: y\n\n", []Event{{Data: "y", Retry: -1}}, nil},
		{"empty data line dispatches an empty event", "data\n\n", []Event{{Data: "", Retry: -1}}, nil},
		{"id and retry persist", "id: 7\nretry: 1500\ndata: a\n\ndata: b\n\nretry: x\nid\ndata: c\n\n",
			[]Event{{Data: "a", ID: "7", Retry: 1500}, {Data: "b", ID: "7", Retry: 1500}, {Data: "c", ID: "", Retry: 1500}}, nil},
		{"id with NUL ignored", "id: 1\ndata: a\n\nid: x\x00y\ndata: b\n\n",
			[]Event{{Data: "a", ID: "1", Retry: -1}, {Data: "b", ID: "1", Retry: -1}}, nil},
		{"BOM", "\xEF\xBB\xBFdata: a\n\n", []Event{{Data: "a", Retry: -1}}, nil},
		{"truncated event", "data: a\n\ndata: b\n", []Event{{Data: "a", Retry: -1}}, io.ErrUnexpectedEOF},
		{"truncated line", "data: a\n\ndata: b", []Event{{Data: "a", Retry: -1}}, io.ErrUnexpectedEOF},
		{"line too long", "data: " + strings.Repeat("x", 100) + "\n\n", nil, ErrTooLarge},
		{"data too large", strings.Repeat("data: "+strings.Repeat("x", 40)+"\n", 3) + "\n", nil, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(t, tc.in, 64)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("events = %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

// encode writes evs as a server would (multi-line data split into lines).
func encode(evs []Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Type != "" {
			b.WriteString("event: " + ev.Type + "\n")
		}
		for _, l := range strings.Split(ev.Data, "\n") {
			b.WriteString("data: " + l + "\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func FuzzReader(f *testing.F) {
	for _, s := range []string{"data: {\"a\":1}\n\ndata: [DONE]\n\n", "event: x\r\ndata: y\r\n\r\n", ": c\n\nid: 1\nretry: 5\ndata\n\n", "\xEF\xBB\xBFdata: a\rdata: b\r\r"} {
		f.Add(s, "t", "d1\nd2")
	}
	f.Fuzz(func(t *testing.T, raw, typ, data string) {
		// Never panics on any input, and no event passes the limit.
		evs, _ := readAll(t, raw, 1024)
		for _, ev := range evs {
			if len(ev.Data) > 1024 {
				t.Fatalf("event of %d bytes past the 1024 limit", len(ev.Data))
			}
		}
		// Round trip: what a server encodes comes back as it was, when
		// the fields hold no line breaks of their own.
		if strings.ContainsAny(typ, "\r\n") || strings.ContainsRune(data, '\r') || strings.HasPrefix(typ, " ") {
			return
		}
		want := []Event{{Type: typ, Data: data, Retry: -1}, {Data: "[DONE]", Retry: -1}}
		got, err := readAll(t, encode(want), 1<<20)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip of %q: %#v, %v", encode(want), got, err)
		}
	})
}

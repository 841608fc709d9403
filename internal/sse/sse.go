// Package sse owns the one client-side decoder of Server-Sent Events
// (text/event-stream, as the WHATWG HTML standard defines it) that exo's
// clients share: `exo bench` and the end-to-end tests read the OpenAI and
// Anthropic streams through it. It decodes bytes into events and knows
// nothing of what the data means (no JSON, no "[DONE]"), and it must not
// import runners/ or supervisor/, so both sides' tests can use it.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Event is one dispatched event.
type Event struct {
	// Type is the event field ("" when the stream named none; the
	// standard's default type is "message").
	Type string
	// Data is the data lines joined with "\n".
	Data string
	// ID is the last event ID seen so far in the stream.
	ID string
	// Retry is the last valid retry field in milliseconds (-1: none).
	Retry int
}

// DefaultMaxEvent bounds one event's bytes (a line or its data together).
const DefaultMaxEvent = 16 << 20

// ErrTooLarge is returned when a line or an event's data passes the limit.
var ErrTooLarge = errors.New("sse: event too large")

// Reader decodes events from a stream.
type Reader struct {
	br    *bufio.Reader
	max   int
	id    string
	retry int
	first bool // no byte read yet: a leading BOM is dropped
	cr    bool // the last line ended in '\r': a following '\n' is part of it
}

// NewReader decodes r, with events of at most DefaultMaxEvent bytes.
func NewReader(r io.Reader) *Reader { return NewReaderSize(r, DefaultMaxEvent) }

// NewReaderSize decodes r, with events of at most max bytes.
func NewReaderSize(r io.Reader, max int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 64<<10), max: max, retry: -1, first: true}
}

// Next returns the next event. At the end of the stream it returns io.EOF
// (an event not ended by a blank line is discarded, as the standard says);
// a stream that breaks mid-event returns io.ErrUnexpectedEOF.
func (r *Reader) Next() (Event, error) {
	var data bytes.Buffer
	typ := ""
	hasData := false
	pending := false // fields seen since the last dispatch
	for {
		line, err := r.line()
		if err != nil {
			if errors.Is(err, io.EOF) && pending {
				return Event{}, io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if !hasData {
				typ, pending = "", false
				continue
			}
			return Event{Type: typ, Data: data.String(), ID: r.id, Retry: r.retry}, nil
		}
		if line[0] == ':' {
			continue // a comment (keep-alive)
		}
		pending = true
		name, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			name, value = line[:i], line[i+1:]
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		switch string(name) {
		case "event":
			typ = string(value)
		case "data":
			if data.Len()+len(value)+1 > r.max {
				return Event{}, ErrTooLarge
			}
			if hasData {
				data.WriteByte('\n')
			}
			data.Write(value)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.id = string(value)
			}
		case "retry":
			if n, err := strconv.Atoi(string(value)); err == nil && n >= 0 && isDigits(value) {
				r.retry = n
			}
		}
	}
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// line reads one line without its terminator (CRLF, LF or CR).
func (r *Reader) line() ([]byte, error) {
	var out []byte
	for {
		c, err := r.br.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) && len(out) > 0 {
				return nil, io.ErrUnexpectedEOF // a line without its end
			}
			return nil, err
		}
		if r.first {
			r.first = false
			if c == 0xEF { // a UTF-8 BOM starts the stream
				bom, err := r.br.Peek(2)
				if err == nil && bom[0] == 0xBB && bom[1] == 0xBF {
					_, _ = r.br.Discard(2)
					continue
				}
			}
		}
		if r.cr {
			r.cr = false
			if c == '\n' {
				continue
			}
		}
		switch c {
		case '\n':
			return out, nil
		case '\r':
			r.cr = true
			return out, nil
		}
		if len(out) >= r.max {
			return nil, fmt.Errorf("%w: a line passes %d bytes", ErrTooLarge, r.max)
		}
		out = append(out, c)
	}
}

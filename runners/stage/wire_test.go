package stage

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/exo-pd/exo-pd/runners/gen"
)

const testHidden = 4

func sampleMessages() []any {
	return []any{
		Open{Ticket: 1, Seq: 2, Body: []byte(`{"request":{"Prompt":"hi"},"start":{},"history":[1,2]}`)},
		&Step{Ticket: 3, DType: DTypeF32, Seqs: []StepSeq{{Seq: 7, Pos: 0, N: 2, Pick: false}, {Seq: 8, Pos: 5, N: 1, Pick: true}},
			Tokens: []int32{1, 2, 3}, Hidden: []float32{1, 2, 3, 4, 5, 6, 7, 8, -9, 10.5, 11, 12}},
		&Step{Ticket: 4, DType: DTypeBF16, Seqs: []StepSeq{{Seq: 1, Pos: 9, N: 1, Pick: true}}, Tokens: []int32{42}, Hidden: []float32{1, -2, 0.5, 256}},
		Truncate{Ticket: 5, Seq: 6, N: 10, Apply: true, OK: true, Len: 9},
		Drop{Seq: 11},
		Fill{Ticket: 16, Seq: 17, Start: 3, OK: true, Len: 9, Bytes: 1 << 40, Endpoint: "127.0.0.1:9", ID: "m-1", Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		Picks{Ticket: 12, Picks: []Pick{{Seq: 1, Tok: 5, Done: true}, {Seq: 2, Tok: 6, Logprob: &gen.TokenLogprob{Bytes: []byte("a"), Logprob: -0.5,
			Top: []gen.TopToken{{Bytes: []byte("b"), Logprob: -1}}}}}},
		Picks{Ticket: 13},
		Ack{Ticket: 14},
		ErrorFrame{Ticket: 15, Code: CodeInternal, Reason: "stage 1: step failed"},
	}
}

// TestFrameRoundTrip: every message decodes to itself from its frame.
func TestFrameRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		b, err := encode(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		typ, p, err := readFrame(bytes.NewReader(b), nil, DefaultMaxStepBytes)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		got, err := decodeFrame(typ, p, testHidden, false)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if pk, ok := m.(Picks); ok && pk.Picks == nil {
			pk.Picks = []Pick{}
			m = pk
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%T: got %+v, want %+v", m, got, m)
		}
	}
}

// TestGroupStep: a Step whose hidden states go over the group carries
// none and round-trips on a link that agreed to it; elsewhere it is
// corrupt, as is such a Step with hidden states or a Hello with an
// unknown flag.
func TestGroupStep(t *testing.T) {
	m := &Step{Ticket: 3, DType: DTypeGroup, Seqs: []StepSeq{{Seq: 7, Pos: 0, N: 2}, {Seq: 8, Pos: 5, N: 1, Pick: true}}, Tokens: []int32{1, 2, 3}}
	b, err := encode(m)
	if err != nil {
		t.Fatal(err)
	}
	typ, p, err := readFrame(bytes.NewReader(b), nil, DefaultMaxStepBytes)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeFrame(typ, p, testHidden, true)
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("group step: %+v, %v; want %+v", got, err, m)
	}
	if _, err := decodeFrame(typ, p, testHidden, false); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a group step on a link without a group: %v, want ErrCorrupt", err)
	}
	m.Hidden = make([]float32, 3*testHidden)
	if _, err := encode(m); err == nil {
		t.Error("a group step with hidden states encoded")
	}
	h := Hello{Version: Version, Flags: flagAuth | flagGroup, Stage: 1, Stages: 3, First: 4, End: 8}
	if got, err := parseHello(h.encode()); err != nil || got.Flags != flagAuth|flagGroup {
		t.Errorf("hello with GROUP: %+v, %v", got, err)
	}
	h.Flags |= 1 << 2
	if _, err := parseHello(h.encode()); !errors.Is(err, ErrVersion) {
		t.Errorf("hello with an unknown flag: %v", err)
	}
}

// TestCorruptFramesRefused: a flipped bit anywhere in a frame (header or
// payload), a truncated frame, an oversize length, an unknown type and a
// Step whose hidden states do not match the model's width all fail with
// ErrCorrupt or a short read, never a message.
func TestCorruptFramesRefused(t *testing.T) {
	for _, m := range sampleMessages() {
		b, _ := encode(m)
		for i := range b {
			for _, bit := range []byte{1, 0x80} {
				c := bytes.Clone(b)
				c[i] ^= bit
				typ, p, err := readFrame(bytes.NewReader(c), nil, DefaultMaxStepBytes)
				if err == nil {
					_, err = decodeFrame(typ, p, testHidden, false)
				}
				if err == nil {
					t.Fatalf("%T: byte %d bit %#x flipped: accepted", m, i, bit)
				}
			}
		}
		if _, _, err := readFrame(bytes.NewReader(b[:len(b)-1]), nil, DefaultMaxStepBytes); err == nil {
			t.Errorf("%T: a truncated frame was read", m)
		}
	}
	step, _ := encode(sampleMessages()[1])
	typ, p, err := readFrame(bytes.NewReader(step), nil, DefaultMaxStepBytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeFrame(typ, p, testHidden+1, false); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a step of width 4 read as width 5: %v", err)
	}
	if _, _, err := readFrame(bytes.NewReader(step), nil, 64); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a step over the size limit: %v", err)
	}
}

// FuzzFrame: the frame reader and decoder never panic on any bytes, and
// whatever they accept encodes back to a frame that decodes the same.
func FuzzFrame(f *testing.F) {
	for _, m := range sampleMessages() {
		b, _ := encode(m)
		f.Add(b)
	}
	g, _ := encode(&Step{Ticket: 3, DType: DTypeGroup, Seqs: []StepSeq{{Seq: 7, N: 2}}, Tokens: []int32{1, 2}})
	f.Add(g)
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, p, err := readFrame(bytes.NewReader(b), nil, 1<<20)
		if err != nil {
			return
		}
		group := len(b)%2 == 1 // both kinds of link
		m, err := decodeFrame(typ, p, testHidden, group)
		if err != nil {
			return
		}
		if _, ok := m.(keepalive); ok {
			return
		}
		b2, err := encode(m)
		if err != nil {
			if _, ok := m.(authFrame); ok {
				return
			}
			t.Fatalf("%T decoded but does not encode: %v", m, err)
		}
		typ2, p2, err := readFrame(bytes.NewReader(b2), nil, 1<<20)
		if err != nil {
			t.Fatalf("%T re-encoded unreadable: %v", m, err)
		}
		m2, err := decodeFrame(typ2, p2, testHidden, group)
		if err != nil {
			t.Fatalf("%T: round trip: %v", m, err)
		}
		if b3, _ := encode(m2); !bytes.Equal(b2, b3) { // bytes, not values: a NaN is not equal to itself
			t.Fatalf("%T: round trip %+v → %+v", m, m, m2)
		}
	})
}

// FuzzHello: parseHello never panics, and accepts only what encodes back
// to the same bytes.
func FuzzHello(f *testing.F) {
	h := Hello{Version: Version, Flags: flagAuth, Stage: 1, Stages: 3, First: 4, End: 8}
	f.Add(h.encode())
	h.Flags |= flagGroup
	f.Add(h.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(h.encode(), b) {
			t.Fatalf("hello %x parsed as %+v, encodes as %x", b, h, h.encode())
		}
	})
}

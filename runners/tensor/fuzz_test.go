package tensor

import (
	"bytes"
	"io"
	"math"
	"net"
	"reflect"
	"testing"
	"time"

	wire "github.com/exo-pd/exo-pd/runners/internal/link"
)

// FuzzCall: a call that decodes re-encodes to its bytes, and no input
// panics the decoder.
func FuzzCall(f *testing.F) {
	for _, c := range []*call{
		{op: opForward, ids: []uint64{7}, tokens: []int32{1, 2, 3}},
		{op: opBatch, ids: []uint64{1, 2}, tokens: []int32{9, 8}},
		{op: opAll, ids: []uint64{3}, tokens: []int32{4}},
		{op: opPrefill, ids: []uint64{3}, tokens: []int32{4, 5}},
		{op: opTruncate, ids: []uint64{3}, n: 17},
		{op: opFree, ids: []uint64{3}},
		{op: opFill, ids: []uint64{3}, n: 2, tokens: []int32{1, 2, 3, 4}, reqID: "r1", prefer: []string{"a:1", "b:2"}},
		{op: opBegin, ids: []uint64{4}, n: 2, tokens: []int32{1, 2, 3, 4}},
		{op: opChunk, ids: []uint64{4}, tokens: []int32{3, 4}},
		{op: opEnd, ids: []uint64{4}, n: 1},
		{op: opStage, ids: []uint64{1, 2}, counts: []int{2, 1}, tokens: []int32{5, 6, 7}},
		{op: opStage, ids: []uint64{3}, counts: []int{1}, tokens: []int32{5}, hidden: []byte{0, 0, 128, 63, 0, 0, 0, 64}},
	} {
		f.Add(c.encode(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCall(b)
		if err != nil {
			return
		}
		if got := c.encode(nil); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, decoded from %x", got, b)
		}
		c2, err := decodeCall(c.encode(nil))
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("round trip: %+v %+v %v", c, c2, err)
		}
	})
}

// FuzzFrame: a frame that reads re-writes to its bytes, as does a hello
// that decodes; hellos and acks never panic.
func FuzzFrame(f *testing.F) {
	var buf bytes.Buffer
	l := &link{conn: nopConn{&buf}}
	_ = l.write(frameSum, []byte{1, 2, 3, 4})
	_ = l.write(frameAck, encodeAck(nil))
	f.Add(buf.Bytes())
	for _, h := range []struct {
		rank, size     int
		auth           bool
		group, backend string
	}{{1, 2, true, "", ""}, {0, 2, false, "", "cpu"}, {1, 4, false, "ring", "mlx-cpu"}, {3, 4, true, "nccl", "mlx-gpu"}, {2, 3, false, "jaccl", "mlx-gpu"}} {
		flags, _ := wire.GroupFlags(h.group)
		if h.auth {
			flags |= wire.FlagAuth
		}
		f.Add(spec.Encode(&wire.Hello{Version: linkVersion, Flags: flags, Index: h.rank, Count: h.size, Backend: h.backend}))
	}
	f.Add(append([]byte("EXOTP\x02\x01\x00\x02\x00\x00\x01"), make([]byte, 48)...)) // version 2's hello
	f.Add(encodeAck(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := spec.Parse(b); err == nil && !bytes.Equal(spec.Encode(&h), b) {
			t.Fatalf("hello re-encoded %x, decoded from %x", spec.Encode(&h), b)
		}
		_ = decodeAck(b, 1)
		typ, payload, err := readFrame(bytes.NewReader(b), nil, 1)
		if err != nil {
			return
		}
		var out bytes.Buffer
		w := &link{conn: nopConn{&out}}
		if err := w.write(typ, payload); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), b[:out.Len()]) {
			t.Fatalf("re-written %x, read from %x", out.Bytes(), b)
		}
	})
}

// nopConn is a net.Conn that writes to a buffer (link.write only writes).
type nopConn struct{ w *bytes.Buffer }

func (c nopConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (c nopConn) Write(b []byte) (int, error)      { return c.w.Write(b) }
func (c nopConn) Close() error                     { return nil }
func (c nopConn) LocalAddr() net.Addr              { return nil }
func (c nopConn) RemoteAddr() net.Addr             { return nil }
func (c nopConn) SetDeadline(time.Time) error      { return nil }
func (c nopConn) SetReadDeadline(time.Time) error  { return nil }
func (c nopConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzWant: a prefill rank's Want that decodes re-encodes to its bytes
// (at least two tokens, from inside them), and no input panics.
func FuzzWant(f *testing.F) {
	f.Add(encodeWant([]int32{1, 2, 3}, 1, 7))
	f.Add(encodeWant([]int32{1}, 0, 0))
	f.Add(encodeWant([]int32{4, 5}, 0, math.MaxUint64))
	f.Fuzz(func(t *testing.T, b []byte) {
		tokens, from, seen, err := decodeWant(b)
		if err != nil {
			return
		}
		if len(tokens) < 2 || from < 0 || from >= len(tokens) {
			t.Fatalf("decoded %d tokens from %d", len(tokens), from)
		}
		if got := encodeWant(tokens, from, seen); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, decoded from %x", got, b)
		}
	})
}

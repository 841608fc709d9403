package tensor

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A call is one engine operation rank 0 asks every follower to run on its
// share, in the order rank 0 runs it (docs/PROTOCOL.md "Tensor link"):
//
//	call     = op u8 | body
//	forward  (op 1): id u64 | n u32 | tokens i32[n]            Forward on cache id
//	batch    (op 2): n u32 | ids u64[n] | tokens i32[n]         ForwardBatch, one token per cache
//	all      (op 3): id u64 | n u32 | tokens i32[n]            ForwardAll (speculative verification)
//	prefill  (op 4): id u64 | n u32 | tokens i32[n]            one prefill chunk
//	truncate (op 5): id u64 | n u32                            Truncate(n)
//	free     (op 6): id u64                                    Free
//	fill     (op 7): id u64 | start u32 | n u32 | prompt i32[n] | reqid string | prefer n u16, string[n]
//	                                                           remote prefill of the rank's KV heads
//	begin    (op 8): id u64 | from u32 | n u32 | prompt i32[n]  a prefill rank's computation of prompt (its
//	                                                           positions [from, n−1)) begins: take [0, from) from
//	                                                           the rank's prefix cache (runners/tensor/prefill.go)
//	chunk    (op 9): id u64 | n u32 | tokens i32[n]            the computation's next chunk
//	end      (op 10): id u64 | abort u32                       the computation ends (abort 1: it failed)
//	stage    (op 11): n u32 | ids u64[n] | counts u32[n] | tokens i32[Σ counts] | h u32 | hidden f32[h]
//	                                                           a pipeline stage's step (engine StageStep) of n
//	                                                           sequences, counts[i] ≥ 1 tokens each; hidden: the
//	                                                           previous stage's output rows (h = 0 on stage 0,
//	                                                           which embeds the tokens)
//	string   = len u16 | bytes
//
//	ack      = status u8 (0 ok, 1 failed) | message (the rest: UTF-8)
//
// A follower creates the cache of an id it has not seen (empty); Free
// forgets it.

// Call ops.
const (
	opForward  = 1
	opBatch    = 2
	opAll      = 3
	opPrefill  = 4
	opTruncate = 5
	opFree     = 6
	opFill     = 7
	opBegin    = 8
	opChunk    = 9
	opEnd      = 10
	opStage    = 11
)

// call is a decoded call.
type call struct {
	op     byte
	ids    []uint64
	tokens []int32
	n      int // truncate: the length; fill: start
	reqID  string
	prefer []string
	counts []int  // stage: each sequence's tokens
	hidden []byte // stage: the input rows, f32 little-endian (nil: none)
}

var errShort = errors.New("short call")

func opName(op byte) string {
	switch op {
	case opForward:
		return "forward"
	case opBatch:
		return "forward batch"
	case opAll:
		return "forward all"
	case opPrefill:
		return "prefill"
	case opTruncate:
		return "truncate"
	case opFree:
		return "free"
	case opFill:
		return "remote fill"
	case opBegin:
		return "prefill begin"
	case opChunk:
		return "prefill chunk"
	case opEnd:
		return "prefill end"
	case opStage:
		return "stage step"
	}
	return fmt.Sprintf("op %d", op)
}

func appendTokens(b []byte, toks []int32) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(toks)))
	for _, t := range toks {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// encode appends c's bytes to b.
func (c *call) encode(b []byte) []byte {
	b = append(b, c.op)
	switch c.op {
	case opForward, opAll, opPrefill, opChunk:
		b = binary.LittleEndian.AppendUint64(b, c.ids[0])
		b = appendTokens(b, c.tokens)
	case opBegin:
		b = binary.LittleEndian.AppendUint64(b, c.ids[0])
		b = binary.LittleEndian.AppendUint32(b, uint32(c.n))
		b = appendTokens(b, c.tokens)
	case opBatch:
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.ids)))
		for _, id := range c.ids {
			b = binary.LittleEndian.AppendUint64(b, id)
		}
		for _, t := range c.tokens {
			b = binary.LittleEndian.AppendUint32(b, uint32(t))
		}
	case opTruncate, opEnd:
		b = binary.LittleEndian.AppendUint64(b, c.ids[0])
		b = binary.LittleEndian.AppendUint32(b, uint32(c.n))
	case opFree:
		b = binary.LittleEndian.AppendUint64(b, c.ids[0])
	case opStage:
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.ids)))
		for _, id := range c.ids {
			b = binary.LittleEndian.AppendUint64(b, id)
		}
		for _, n := range c.counts {
			b = binary.LittleEndian.AppendUint32(b, uint32(n))
		}
		for _, t := range c.tokens {
			b = binary.LittleEndian.AppendUint32(b, uint32(t))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.hidden)/4))
		b = append(b, c.hidden...)
	case opFill:
		b = binary.LittleEndian.AppendUint64(b, c.ids[0])
		b = binary.LittleEndian.AppendUint32(b, uint32(c.n))
		b = appendTokens(b, c.tokens)
		b = appendString(b, c.reqID)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(c.prefer)))
		for _, p := range c.prefer {
			b = appendString(b, p)
		}
	}
	return b
}

// reader takes fields off a call's bytes.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || len(r.b) < n {
		r.err = errShort
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) u16() int {
	p := r.take(2)
	if p == nil {
		return 0
	}
	return int(binary.LittleEndian.Uint16(p))
}

func (r *reader) u32() uint32 {
	p := r.take(4)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(p)
}

func (r *reader) u64() uint64 {
	p := r.take(8)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(p)
}

func (r *reader) tokens(n int) []int32 {
	if r.err != nil || n < 0 || n > len(r.b)/4 {
		r.err = errShort
		return nil
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(r.u32())
	}
	return out
}

func (r *reader) str() string { return string(r.take(r.u16())) }

// maxCallTokens bounds a call's token ids (and a batch's sequences).
const maxCallTokens = 1 << 24

// decodeCall parses a call frame's payload.
func decodeCall(b []byte) (*call, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty call", ErrLink)
	}
	c := &call{op: b[0]}
	r := &reader{b: b[1:]}
	switch c.op {
	case opForward, opAll, opPrefill, opChunk:
		c.ids = []uint64{r.u64()}
		n := r.u32()
		if n == 0 || n > maxCallTokens {
			return nil, fmt.Errorf("%w: %s call with %d tokens", ErrLink, opName(c.op), n)
		}
		c.tokens = r.tokens(int(n))
	case opBatch:
		n := r.u32()
		if n == 0 || n > maxCallTokens {
			return nil, fmt.Errorf("%w: batch call of %d sequences", ErrLink, n)
		}
		if uint64(len(r.b)) < uint64(n)*12 {
			return nil, fmt.Errorf("%w: batch call: %w", ErrLink, errShort)
		}
		c.ids = make([]uint64, n)
		for i := range c.ids {
			c.ids[i] = r.u64()
		}
		c.tokens = r.tokens(int(n))
	case opTruncate:
		c.ids = []uint64{r.u64()}
		c.n = int(r.u32())
	case opEnd:
		c.ids = []uint64{r.u64()}
		if c.n = int(r.u32()); c.n > 1 {
			return nil, fmt.Errorf("%w: prefill end call with abort %d", ErrLink, c.n)
		}
	case opBegin:
		c.ids = []uint64{r.u64()}
		c.n = int(r.u32())
		n := r.u32()
		if n < 2 || n > maxCallTokens || uint32(c.n) >= n {
			return nil, fmt.Errorf("%w: prefill begin call of %d tokens from %d", ErrLink, n, c.n)
		}
		c.tokens = r.tokens(int(n))
	case opFree:
		c.ids = []uint64{r.u64()}
	case opStage:
		if err := c.decodeStage(r); err != nil {
			return nil, err
		}
	case opFill:
		c.ids = []uint64{r.u64()}
		c.n = int(r.u32())
		n := r.u32()
		if n > maxCallTokens {
			return nil, fmt.Errorf("%w: fill call with %d tokens", ErrLink, n)
		}
		c.tokens = r.tokens(int(n))
		c.reqID = r.str()
		np := r.u16()
		for range np {
			if r.err != nil {
				break
			}
			c.prefer = append(c.prefer, r.str())
		}
	default:
		return nil, fmt.Errorf("%w: unknown call op %d", ErrLink, c.op)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %s call: %w", ErrLink, opName(c.op), r.err)
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %s call: %d trailing bytes", ErrLink, opName(c.op), len(r.b))
	}
	return c, nil
}

// decodeStage reads a stage call's body.
func (c *call) decodeStage(r *reader) error {
	n := r.u32()
	if n == 0 || n > maxCallTokens || uint64(len(r.b)) < uint64(n)*12 {
		return fmt.Errorf("%w: stage call of %d sequences in %d bytes", ErrLink, n, len(r.b))
	}
	c.ids, c.counts = make([]uint64, n), make([]int, n)
	for i := range c.ids {
		c.ids[i] = r.u64()
	}
	total := uint64(0)
	for i := range c.counts {
		k := r.u32()
		if k == 0 {
			return fmt.Errorf("%w: stage call: sequence %d with no tokens", ErrLink, i)
		}
		c.counts[i] = int(k)
		total += uint64(k)
	}
	if total > maxCallTokens {
		return fmt.Errorf("%w: stage call of %d tokens", ErrLink, total)
	}
	c.tokens = r.tokens(int(total))
	h := r.u32()
	if uint64(h)*4 > uint64(len(r.b)) {
		return fmt.Errorf("%w: stage call: %d hidden values in %d bytes", ErrLink, h, len(r.b))
	}
	if h > 0 {
		c.hidden = r.take(int(h) * 4)
	}
	return nil
}

// encodeAck is a call's outcome (nil: ok).
func encodeAck(err error) []byte {
	if err == nil {
		return []byte{0}
	}
	msg := err.Error()
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	return append([]byte{1}, msg...)
}

// ErrRank is wrapped by a follower's failure of a call, as rank 0 reports
// it.
var ErrRank = errors.New("tensor rank failed")

// decodeAck returns the follower's error (wrapping ErrRank), nil when ok.
func decodeAck(b []byte, rank int) error {
	if len(b) == 0 || b[0] > 1 {
		return fmt.Errorf("%w: rank %d sent a malformed ack", ErrLink, rank)
	}
	if b[0] == 0 {
		if len(b) != 1 {
			return fmt.Errorf("%w: rank %d sent a malformed ack", ErrLink, rank)
		}
		return nil
	}
	return fmt.Errorf("%w: rank %d: %s", ErrRank, rank, b[1:])
}

package stage

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/internal/half"
	"github.com/exo-pd/exo-pd/runners/internal/link"
)

// Version is the stage link's protocol version (PROTOCOL.md S7): 2 added
// the Hello's GROUP flag and the Step's group dtype (hidden states carried
// over an MLX group).
const Version = 2

// spec is the stage link's hello (runners/internal/link's, whose framing,
// Error and Keepalive frames and handshake it uses too): no backend, and
// GROUP offers only MLX's ring.
var spec = link.Spec{Name: "stage link", Noun: "stage", Magic: "EXOSTAGE", Version: Version,
	Flags: flagAuth | flagGroup, Label: fmt.Sprintf("exo-stage/%d", Version)}

const (
	headerSize = link.HeaderSize

	flagAuth  = link.FlagAuth
	flagGroup = link.FlagGroup // the stage offers to carry hidden states over its backend's group

	maxSeqs       = 256
	maxStepTokens = 8192
	maxOpenJSON   = 8 << 20
	maxLogprobLen = 64 << 10
	maxName       = 256     // a Fill's endpoint and request id
	maxFillTokens = 1 << 20 // a Fill's prompt
	fillFixed     = 44
	// DefaultMaxStepBytes bounds a Step frame (Config.MaxStepBytes).
	DefaultMaxStepBytes = 256 << 20
)

// Frame types (PROTOCOL.md S3).
const (
	frameAuthProof = link.TypeAuthProof
	frameAuthOK    = link.TypeAuthOK
	frameOpen      = 3
	frameStep      = 4
	frameTruncate  = 5
	frameDrop      = 6
	framePicks     = 7
	frameAck       = 8
	frameError     = link.TypeError
	frameKeepalive = link.TypeKeepalive
	frameFill      = 11
)

// Hidden-state dtypes of a Step. DTypeGroup: the Step carries no hidden
// states; they travel over the stages' group (an MLX ring's send and
// recv, in the activations' dtype), on links whose ends both offered it.
const (
	DTypeF32   = 1
	DTypeBF16  = 2
	DTypeGroup = 3
)

// Code is an Error frame's code (PROTOCOL.md S3).
type Code = link.Code

// Error codes (PROTOCOL.md S3).
const (
	CodeVersion    = link.CodeVersion
	CodeAuth       = link.CodeAuth
	CodeMismatch   = link.CodeMismatch
	CodeBadRequest = link.CodeBadRequest
	CodeInternal   = link.CodeInternal
	CodeCorrupt    = link.CodeCorrupt
)

// Errors callers branch on: the shared link layer's (RemoteError maps a
// peer's codes to them), and ErrDown.
var (
	ErrCorrupt, ErrAuth, ErrMismatch, ErrVersion = link.ErrCorrupt, link.ErrAuth, link.ErrMismatch, link.ErrVersion
	// ErrDown: the ring is not whole (a link is down or was lost). It is
	// gen.ErrUnavailable too: the APIs answer a request it ends 503.
	ErrDown = gen.Unavailable("stage link: ring down")
)

var corruptf = link.Corruptf

// RemoteError is an Error frame: a peer's refusal or a failed step.
type RemoteError = link.RemoteError

func remoteError(code Code, reason string) error {
	return &RemoteError{Link: spec.Name, Code: code, Reason: reason}
}

// Hello is one side's fixed introduction (PROTOCOL.md S1).
type Hello struct {
	Version     uint16
	Flags       uint16
	Stage       int
	Stages      int
	First, End  int // the stage's layers [First, End)
	Fingerprint [32]byte
	Nonce       [32]byte
}

func (h *Hello) encode() []byte { return spec.Encode(h.wire()) }

func (h *Hello) wire() *link.Hello {
	return &link.Hello{Version: h.Version, Flags: h.Flags, Index: h.Stage, Count: h.Stages, First: h.First, End: h.End,
		Fingerprint: h.Fingerprint, Nonce: h.Nonce}
}

func fromWire(w link.Hello) Hello {
	return Hello{Version: w.Version, Flags: w.Flags, Stage: w.Index, Stages: w.Count, First: w.First, End: w.End,
		Fingerprint: w.Fingerprint, Nonce: w.Nonce}
}

func parseHello(b []byte) (Hello, error) {
	w, err := spec.Parse(b)
	return fromWire(w), err
}

// Messages (PROTOCOL.md S3, S5). Each is one frame.

// Open installs a request's Picker for a sequence on the last stage.
type Open struct {
	Ticket, Seq uint64
	Body        []byte // JSON of OpenBody
}

// OpenBody is what the last stage builds the Picker from.
type OpenBody struct {
	Request *gen.Request `json:"request"`
	Start   struct {
		Reasoning bool `json:"reasoning,omitempty"`
	} `json:"start"`
	History []int32 `json:"history"`
}

// StepSeq is one sequence's chunk in a Step.
type StepSeq struct {
	Seq  uint64
	Pos  int  // the cache length the chunk continues
	N    int  // its tokens
	Pick bool // the last stage picks a token from its last position
}

// Step is one step of several sequences' chunks.
type Step struct {
	Ticket uint64
	DType  uint8
	Seqs   []StepSeq
	Tokens []int32   // Σ N, sequence after sequence
	Hidden []float32 // [Σ N, D]
}

// Truncate asks (and with Apply orders) every stage to truncate a
// sequence's cache to N; OK and Len accumulate down the ring.
type Truncate struct {
	Ticket, Seq uint64
	N           int
	Apply, OK   bool
	Len         int
}

// Fill asks every stage to fetch its layers' KV of Tokens[Start:len-1]
// from the prefill runner at Endpoint (remote prefill into a pipeline);
// OK, Len and Bytes accumulate down the ring.
type Fill struct {
	Ticket, Seq uint64
	Start       int
	OK          bool
	Len         int   // the shortest cache length after the fill
	Bytes       int64 // KV payload bytes the later stages received
	Endpoint    string
	ID          string
	Tokens      []int32
}

// Drop frees a sequence on every stage.
type Drop struct{ Seq uint64 }

// Pick is one sequence's picked token.
type Pick struct {
	Seq     uint64
	Tok     int32
	Done    bool
	Logprob *gen.TokenLogprob
}

// Picks is the last stage's answer to a Step.
type Picks struct {
	Ticket uint64
	Picks  []Pick
}

// Ack answers an Open.
type Ack struct{ Ticket uint64 }

// ErrorFrame is an Error frame; Ticket 0 is about the link itself.
type ErrorFrame struct {
	Ticket uint64
	Code   Code
	Reason string
}

type keepalive struct{}

// authFrame is an AuthProof or AuthOK met after the handshake (which
// runners/internal/link reads): work, not auth, belongs there.
type authFrame struct{ typ byte }

var frame = link.Seal

// encode returns msg's frame bytes.
func encode(msg any) ([]byte, error) {
	le := binary.LittleEndian
	switch m := msg.(type) {
	case Open:
		if len(m.Body) > maxOpenJSON {
			return nil, fmt.Errorf("stage link: open body of %d bytes (limit %d)", len(m.Body), maxOpenJSON)
		}
		b := make([]byte, headerSize+16+len(m.Body))
		le.PutUint64(b[12:], m.Ticket)
		le.PutUint64(b[20:], m.Seq)
		copy(b[28:], m.Body)
		return frame(frameOpen, b), nil
	case Step:
		return encodeStep(&m)
	case *Step:
		return encodeStep(m)
	case Truncate:
		b := make([]byte, headerSize+28)
		p := b[headerSize:]
		le.PutUint64(p, m.Ticket)
		le.PutUint64(p[8:], m.Seq)
		le.PutUint32(p[16:], uint32(m.N))
		if m.Apply {
			p[20] = 1
		}
		if m.OK {
			p[21] = 1
		}
		le.PutUint32(p[24:], uint32(m.Len))
		return frame(frameTruncate, b), nil
	case Fill:
		if len(m.Endpoint) > maxName || len(m.ID) > maxName || len(m.Tokens) > maxFillTokens || m.Start < 0 || m.Len < 0 || m.Bytes < 0 {
			return nil, fmt.Errorf("stage link: a fill of %d tokens from %q", len(m.Tokens), m.Endpoint)
		}
		b := make([]byte, headerSize+fillFixed, headerSize+fillFixed+len(m.Endpoint)+len(m.ID)+4*len(m.Tokens))
		p := b[headerSize:]
		le.PutUint64(p, m.Ticket)
		le.PutUint64(p[8:], m.Seq)
		le.PutUint32(p[16:], uint32(m.Start))
		if m.OK {
			p[20] = 1
		}
		le.PutUint32(p[24:], uint32(m.Len))
		le.PutUint64(p[28:], uint64(m.Bytes))
		le.PutUint16(p[36:], uint16(len(m.Endpoint)))
		le.PutUint16(p[38:], uint16(len(m.ID)))
		le.PutUint32(p[40:], uint32(len(m.Tokens)))
		b = append(append(b, m.Endpoint...), m.ID...)
		for _, t := range m.Tokens {
			b = le.AppendUint32(b, uint32(t))
		}
		return frame(frameFill, b), nil
	case Drop:
		b := make([]byte, headerSize+8)
		le.PutUint64(b[12:], m.Seq)
		return frame(frameDrop, b), nil
	case Ack:
		b := make([]byte, headerSize+8)
		le.PutUint64(b[12:], m.Ticket)
		return frame(frameAck, b), nil
	case Picks:
		if len(m.Picks) > maxSeqs {
			return nil, fmt.Errorf("stage link: %d picks (limit %d)", len(m.Picks), maxSeqs)
		}
		b := make([]byte, headerSize+12+16*len(m.Picks), headerSize+12+32*len(m.Picks))
		p := b[headerSize:]
		le.PutUint64(p, m.Ticket)
		le.PutUint16(p[8:], uint16(len(m.Picks)))
		for i, pk := range m.Picks {
			e := p[12+16*i:]
			le.PutUint64(e, pk.Seq)
			le.PutUint32(e[8:], uint32(pk.Tok))
			if pk.Done {
				e[12] |= 1
			}
			if pk.Logprob != nil {
				e[12] |= 2
			}
		}
		for _, pk := range m.Picks {
			if pk.Logprob == nil {
				continue
			}
			j, err := json.Marshal(pk.Logprob)
			if err != nil {
				return nil, err
			}
			if len(j) > maxLogprobLen {
				return nil, fmt.Errorf("stage link: a logprob record of %d bytes (limit %d)", len(j), maxLogprobLen)
			}
			b = le.AppendUint32(b, uint32(len(j)))
			b = append(b, j...)
		}
		return frame(framePicks, b), nil
	case ErrorFrame:
		return link.EncodeError(m.Ticket, m.Code, m.Reason), nil
	case keepalive:
		return frame(frameKeepalive, make([]byte, headerSize)), nil
	}
	return nil, fmt.Errorf("stage link: cannot encode %T", msg)
}

func encodeStep(m *Step) ([]byte, error) {
	le := binary.LittleEndian
	if len(m.Seqs) == 0 || len(m.Seqs) > maxSeqs {
		return nil, fmt.Errorf("stage link: a step of %d sequences (1 to %d)", len(m.Seqs), maxSeqs)
	}
	total := 0
	for _, s := range m.Seqs {
		if s.N < 1 || s.N > math.MaxUint16 || s.Pos < 0 || int64(s.Pos)+int64(s.N) >= math.MaxInt32 {
			return nil, fmt.Errorf("stage link: a chunk of %d tokens at %d", s.N, s.Pos)
		}
		total += s.N
	}
	if total != len(m.Tokens) || total > maxStepTokens {
		return nil, fmt.Errorf("stage link: %d tokens for chunks of %d (limit %d)", len(m.Tokens), total, maxStepTokens)
	}
	size := 4
	switch m.DType {
	case DTypeF32:
	case DTypeBF16:
		size = 2
	case DTypeGroup:
		size = 0
	default:
		return nil, fmt.Errorf("stage link: hidden dtype %d", m.DType)
	}
	if size == 0 && len(m.Hidden) != 0 {
		return nil, fmt.Errorf("stage link: a step whose hidden states go over the group carries %d of them", len(m.Hidden))
	}
	if size != 0 && (len(m.Hidden)%total != 0 || len(m.Hidden) == 0) {
		return nil, fmt.Errorf("stage link: %d hidden values for %d tokens", len(m.Hidden), total)
	}
	b := make([]byte, headerSize+12+16*len(m.Seqs)+4*total+size*len(m.Hidden))
	p := b[headerSize:]
	le.PutUint64(p, m.Ticket)
	le.PutUint16(p[8:], uint16(len(m.Seqs)))
	p[10] = m.DType
	o := 12
	for _, s := range m.Seqs {
		le.PutUint64(p[o:], s.Seq)
		le.PutUint32(p[o+8:], uint32(s.Pos))
		le.PutUint16(p[o+12:], uint16(s.N))
		if s.Pick {
			p[o+14] = 1
		}
		o += 16
	}
	for _, t := range m.Tokens {
		le.PutUint32(p[o:], uint32(t))
		o += 4
	}
	switch m.DType {
	case DTypeF32:
		for _, v := range m.Hidden {
			le.PutUint32(p[o:], math.Float32bits(v))
			o += 4
		}
	case DTypeBF16:
		for _, v := range m.Hidden {
			le.PutUint16(p[o:], half.F32ToBF16(v))
			o += 2
		}
	}
	return frame(frameStep, b), nil
}

// limitOf is how big each frame type may be (PROTOCOL.md S4).
func limitOf(typ byte, maxStep int) (min, max int, ok bool) {
	switch typ {
	case frameTruncate:
		return 28, 28, true
	case frameDrop, frameAck:
		return 8, 8, true
	case frameOpen:
		return 16, 16 + maxOpenJSON, true
	case framePicks:
		return 12, 12 + 16*maxSeqs + maxSeqs*(4+maxLogprobLen), true
	case frameStep:
		return 12 + 16 + 4, maxStep, true
	case frameFill:
		return fillFixed, fillFixed + 2*maxName + 4*maxFillTokens, true
	}
	return link.Limit(typ)
}

// readFrame reads one frame's type and checked payload (into buf when it
// has room).
func readFrame(r io.Reader, buf []byte, maxStep int) (byte, []byte, error) {
	return link.ReadFrame(r, buf, func(typ byte) (int, int, bool) { return limitOf(typ, maxStep) })
}

// decodeFrame parses a checked payload of typ; hidden is the model's hidden
// width (Step), group whether the link carries hidden states over the
// stages' group (a Step of DTypeGroup is corrupt elsewhere). The result
// does not alias p.
func decodeFrame(typ byte, p []byte, hidden int, group bool) (any, error) {
	le := binary.LittleEndian
	switch typ {
	case frameOpen:
		return Open{Ticket: le.Uint64(p), Seq: le.Uint64(p[8:]), Body: append([]byte(nil), p[16:]...)}, nil
	case frameStep:
		return decodeStep(p, hidden, group)
	case frameTruncate:
		if p[20] > 1 || p[21] > 1 || le.Uint16(p[22:]) != 0 {
			return nil, corruptf("truncate: flags %d ok %d reserved %d", p[20], p[21], le.Uint16(p[22:]))
		}
		n, l := le.Uint32(p[16:]), le.Uint32(p[24:])
		if n > math.MaxInt32 || l > math.MaxInt32 {
			return nil, corruptf("truncate to %d, len %d", n, l)
		}
		return Truncate{Ticket: le.Uint64(p), Seq: le.Uint64(p[8:]), N: int(n), Apply: p[20] == 1, OK: p[21] == 1, Len: int(l)}, nil
	case frameFill:
		return decodeFill(p)
	case frameDrop:
		return Drop{Seq: le.Uint64(p)}, nil
	case frameAck:
		return Ack{Ticket: le.Uint64(p)}, nil
	case framePicks:
		return decodePicks(p)
	case frameError:
		t, code, reason, err := link.DecodeError(p)
		return ErrorFrame{Ticket: t, Code: code, Reason: reason}, err
	case frameKeepalive:
		return keepalive{}, nil
	case frameAuthProof, frameAuthOK:
		return authFrame{typ: typ}, nil
	}
	return nil, corruptf("unknown frame type %d", typ)
}

func decodeStep(p []byte, hidden int, group bool) (*Step, error) {
	le := binary.LittleEndian
	count := int(le.Uint16(p[8:]))
	m := &Step{Ticket: le.Uint64(p), DType: p[10]}
	size := 0
	switch {
	case m.DType == DTypeF32:
		size = 4
	case m.DType == DTypeBF16:
		size = 2
	case m.DType == DTypeGroup && group:
	case m.DType == DTypeGroup:
		return nil, corruptf("step: hidden states over the group on a link that did not agree to it")
	default:
		return nil, corruptf("step: hidden dtype %d", m.DType)
	}
	if count < 1 || count > maxSeqs || p[11] != 0 || len(p) < 12+16*count {
		return nil, corruptf("step: %d sequences in %d bytes", count, len(p))
	}
	m.Seqs = make([]StepSeq, count)
	total := 0
	o := 12
	for i := range m.Seqs {
		pos, n := le.Uint32(p[o+8:]), int(le.Uint16(p[o+12:]))
		if p[o+14] > 1 || p[o+15] != 0 || n < 1 || int64(pos)+int64(n) >= math.MaxInt32 {
			return nil, corruptf("step: sequence %d: %d tokens at %d, flags %d", i, n, pos, p[o+14])
		}
		m.Seqs[i] = StepSeq{Seq: le.Uint64(p[o:]), Pos: int(pos), N: n, Pick: p[o+14] == 1}
		total += n
		o += 16
	}
	if total > maxStepTokens || hidden <= 0 {
		return nil, corruptf("step: %d tokens (limit %d)", total, maxStepTokens)
	}
	want := int64(o) + 4*int64(total) + int64(size)*int64(total)*int64(hidden)
	if int64(len(p)) != want {
		return nil, corruptf("step: %d bytes, %d tokens of width %d want %d", len(p), total, hidden, want)
	}
	m.Tokens = make([]int32, total)
	for i := range m.Tokens {
		m.Tokens[i] = int32(le.Uint32(p[o:]))
		o += 4
	}
	if size == 0 {
		return m, nil
	}
	m.Hidden = make([]float32, total*hidden)
	if size == 4 {
		for i := range m.Hidden {
			m.Hidden[i] = math.Float32frombits(le.Uint32(p[o:]))
			o += 4
		}
	} else {
		for i := range m.Hidden {
			m.Hidden[i] = half.BF16ToF32(le.Uint16(p[o:]))
			o += 2
		}
	}
	return m, nil
}

func decodePicks(p []byte) (Picks, error) {
	le := binary.LittleEndian
	count := int(le.Uint16(p[8:]))
	m := Picks{Ticket: le.Uint64(p)}
	if count > maxSeqs || le.Uint16(p[10:]) != 0 || len(p) < 12+16*count {
		return m, corruptf("picks: %d entries in %d bytes", count, len(p))
	}
	m.Picks = make([]Pick, count)
	o := 12
	for i := range m.Picks {
		e := p[o:]
		if e[12] > 3 || e[13] != 0 || e[14] != 0 || e[15] != 0 {
			return m, corruptf("picks: entry %d flags %d", i, e[12])
		}
		m.Picks[i] = Pick{Seq: le.Uint64(e), Tok: int32(le.Uint32(e[8:])), Done: e[12]&1 != 0}
		o += 16
	}
	for i := range m.Picks {
		if p[12+16*i+12]&2 == 0 {
			continue
		}
		if len(p) < o+4 {
			return m, corruptf("picks: entry %d's logprob record missing", i)
		}
		n := int(le.Uint32(p[o:]))
		if n > maxLogprobLen || len(p) < o+4+n {
			return m, corruptf("picks: entry %d's logprob record of %d bytes", i, n)
		}
		lp := new(gen.TokenLogprob)
		if err := json.Unmarshal(p[o+4:o+4+n], lp); err != nil {
			return m, corruptf("picks: entry %d's logprob record: %v", i, err)
		}
		m.Picks[i].Logprob = lp
		o += 4 + n
	}
	if o != len(p) {
		return m, corruptf("picks: %d trailing bytes", len(p)-o)
	}
	return m, nil
}

func decodeFill(p []byte) (Fill, error) {
	le := binary.LittleEndian
	m := Fill{Ticket: le.Uint64(p), Seq: le.Uint64(p[8:]), OK: p[20] == 1}
	start, l, bytes := le.Uint32(p[16:]), le.Uint32(p[24:]), le.Uint64(p[28:])
	ne, ni, nt := int(le.Uint16(p[36:])), int(le.Uint16(p[38:])), int64(le.Uint32(p[40:]))
	switch {
	case p[20] > 1 || p[21] != 0 || le.Uint16(p[22:]) != 0:
		return m, corruptf("fill: flags %d, reserved %d %d", p[20], p[21], le.Uint16(p[22:]))
	case start > math.MaxInt32 || l > math.MaxInt32 || bytes > math.MaxInt64:
		return m, corruptf("fill: start %d len %d bytes %d", start, l, bytes)
	case ne > maxName || ni > maxName || nt > maxFillTokens || int64(len(p)) != int64(fillFixed+ne+ni)+4*nt:
		return m, corruptf("fill: %d bytes for an endpoint of %d, an id of %d and %d tokens", len(p), ne, ni, nt)
	}
	m.Start, m.Len, m.Bytes = int(start), int(l), int64(bytes)
	m.Endpoint = string(p[fillFixed : fillFixed+ne])
	m.ID = string(p[fillFixed+ne : fillFixed+ne+ni])
	o := fillFixed + ne + ni
	m.Tokens = make([]int32, nt)
	for i := range m.Tokens {
		m.Tokens[i] = int32(le.Uint32(p[o:]))
		o += 4
	}
	return m, nil
}

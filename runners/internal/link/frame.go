// Package link owns what the runners' peer-to-peer links share, the stage
// link (runners/stage) and the tensor link (runners/tensor): the frame
// header and its fail-closed reading (limits checked before allocating,
// then the CRC32C), the AuthProof, AuthOK, Error and Keepalive frames, the
// 96-byte hello with its backend and MLX group offer, and the bounded,
// authenticated handshake (docs/PROTOCOL.md "Shared link layer"). Each link
// keeps its own message types, layouts, limits and peer checks (Spec,
// Handshake.Check). It holds no state and must not import runners/stage,
// runners/tensor or any engine.
package link

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// HeaderSize is a frame header's size: type u8, flags u8 (0), reserved u16
// (0), payload length u32, CRC32C (Castagnoli) over header bytes 0..7 then
// the payload.
const HeaderSize = 12

// Frame types every link has; a link numbers its own around them.
const (
	TypeAuthProof = 1  // the dialer's proof (32 bytes)
	TypeAuthOK    = 2  // the acceptor's proof (32 bytes)
	TypeError     = 9  // ticket u64, code u16, reason length u16, reason
	TypeKeepalive = 10 // empty; the acceptor's "ready" without auth
)

// MaxReason bounds an Error frame's reason (a longer one is cut).
const MaxReason = 1024

// Errors callers branch on; a link wraps them with its name.
var (
	// ErrCorrupt: a frame failed its checks (type, length, CRC, layout).
	ErrCorrupt = errors.New("corrupt frame")
	// ErrAuth: the peers do not share the secret, or one has none.
	ErrAuth = errors.New("authentication failed")
	// ErrMismatch: the peer is not this end's peer (another model, group,
	// layer split or backend).
	ErrMismatch = errors.New("peer mismatch")
	// ErrVersion: the peer speaks another protocol or version.
	ErrVersion = errors.New("protocol version")
)

// Corruptf is an ErrCorrupt saying what failed.
func Corruptf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, a...))
}

// Code is an Error frame's code.
type Code uint16

// Error codes.
const (
	CodeVersion    Code = 1
	CodeAuth       Code = 2
	CodeMismatch   Code = 3
	CodeBadRequest Code = 4
	CodeInternal   Code = 5
	CodeCorrupt    Code = 6
)

var codeNames = [...]string{CodeVersion: "version", CodeAuth: "auth", CodeMismatch: "mismatch",
	CodeBadRequest: "bad_request", CodeInternal: "internal", CodeCorrupt: "corrupt"}

func (c Code) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return fmt.Sprintf("code %d", uint16(c))
}

// CodeOf is the code that refuses err (CodeInternal when none fits).
func CodeOf(err error) Code {
	switch {
	case errors.Is(err, ErrAuth):
		return CodeAuth
	case errors.Is(err, ErrMismatch):
		return CodeMismatch
	case errors.Is(err, ErrVersion):
		return CodeVersion
	case errors.Is(err, ErrCorrupt):
		return CodeCorrupt
	}
	return CodeInternal
}

// RemoteError is a peer's Error frame: its refusal or a failed step.
type RemoteError struct {
	Link   string // the link's name, for the message ("stage link")
	Code   Code
	Reason string
}

func (e *RemoteError) Error() string { return fmt.Sprintf("%s: %s: %s", e.Link, e.Code, e.Reason) }

// Is maps the refusal codes to the sentinels.
func (e *RemoteError) Is(target error) bool {
	c := CodeOf(target)
	return c != CodeInternal && c == e.Code
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is the header of a frame of typ carrying payload (to write a big
// payload without copying it behind its header).
func Header(typ byte, payload []byte) [HeaderSize]byte {
	var h [HeaderSize]byte
	h[0] = typ
	binary.LittleEndian.PutUint32(h[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[8:], crc32.Update(crc32.Checksum(h[:8], castagnoli), castagnoli, payload))
	return h
}

// Seal writes the header of a frame of typ into b[:HeaderSize], whose
// payload is b[HeaderSize:], and returns b.
func Seal(typ byte, b []byte) []byte {
	h := Header(typ, b[HeaderSize:])
	copy(b, h[:])
	return b
}

// Limits says how big a payload of each type a link takes: ok false for a
// type it does not know.
type Limits func(typ byte) (min, max int, ok bool)

// Limit is the limits of the frames every link has (ok false for the others).
func Limit(typ byte) (min, max int, ok bool) {
	switch typ {
	case TypeAuthProof, TypeAuthOK:
		return 32, 32, true
	case TypeError:
		return 12, 12 + MaxReason, true
	case TypeKeepalive:
		return 0, 0, true
	}
	return 0, 0, false
}

// ReadFrame reads one frame's type and checked payload (into buf when it
// has room). It checks the type, the zero flags and reserved bits and the
// length against lim before allocating, then the CRC: any failure is
// ErrCorrupt (a short read is the reader's error, io.ErrUnexpectedEOF
// inside a frame).
func ReadFrame(r io.Reader, buf []byte, lim Limits) (byte, []byte, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	le := binary.LittleEndian
	typ, n := h[0], int(le.Uint32(h[4:]))
	lo, hi, ok := lim(typ)
	switch {
	case !ok:
		return 0, nil, Corruptf("unknown frame type %d", typ)
	case h[1] != 0 || le.Uint16(h[2:]) != 0:
		return 0, nil, Corruptf("frame type %d: reserved header bits set", typ)
	case n < lo || n > hi:
		return 0, nil, Corruptf("frame type %d of %d bytes (%d to %d)", typ, n, lo, hi)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	p := buf[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	if c := crc32.Update(crc32.Checksum(h[:8], castagnoli), castagnoli, p); c != le.Uint32(h[8:]) {
		return 0, nil, Corruptf("frame type %d (%d bytes): crc32c %08x, header says %08x", typ, n, c, le.Uint32(h[8:]))
	}
	return typ, p, nil
}

// EncodeError is an Error frame (ticket 0: about the link itself); a
// reason over MaxReason bytes is cut.
func EncodeError(ticket uint64, code Code, reason string) []byte {
	reason = reason[:min(len(reason), MaxReason)]
	b := make([]byte, HeaderSize+12+len(reason))
	p := b[HeaderSize:]
	binary.LittleEndian.PutUint64(p, ticket)
	binary.LittleEndian.PutUint16(p[8:], uint16(code))
	binary.LittleEndian.PutUint16(p[10:], uint16(len(reason)))
	copy(p[12:], reason)
	return Seal(TypeError, b)
}

// DecodeError parses an Error frame's checked payload.
func DecodeError(p []byte) (ticket uint64, code Code, reason string, err error) {
	le := binary.LittleEndian
	if len(p) < 12 {
		return 0, 0, "", Corruptf("error frame of %d bytes", len(p))
	}
	if n := int(le.Uint16(p[10:])); n > MaxReason || 12+n != len(p) {
		return 0, 0, "", Corruptf("error frame: reason of %d bytes in %d", n, len(p))
	}
	return le.Uint64(p), Code(le.Uint16(p[8:])), string(p[12:]), nil
}

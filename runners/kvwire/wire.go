package kvwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"time"
	"unicode/utf8"
)

// Version is the protocol version this package speaks (PROTOCOL.md §14).
const Version uint16 = 6

// Sizes of the fixed parts of the wire (PROTOCOL.md §2, §4, §8).
const (
	helloSize       = 40
	frameHeaderSize = 12
	chunkPrefixSize = 20
	requestFixed    = 68
	headerFixed     = 64
	stateFixed      = 12
	doneSize        = 24
	macSize         = 32

	maxIDLen     = 128
	maxModelLen  = 256
	maxReasonLen = 1024
	maxLayers    = 1024
	maxWindow    = 1 << 30 // a sliding layer's window, in positions
	maxKVHeads   = 1024
	maxHeadDim   = 4096
	maxArrays    = 64
)

var (
	magic  = [4]byte{'E', 'X', 'K', 'V'}
	castag = crc32.MakeTable(crc32.Castagnoli)
	le     = binary.LittleEndian
)

// Frame types (PROTOCOL.md §4).
const (
	frameRequest   uint8 = 1
	frameAuthProof uint8 = 2
	frameAuthOK    uint8 = 3
	frameHeader    uint8 = 4
	frameChunk     uint8 = 5
	frameState     uint8 = 6
	frameDone      uint8 = 7
	frameError     uint8 = 8
	frameKeepalive uint8 = 9
	frameStreams   uint8 = 10 // version 4: stripe.go
	frameJoin      uint8 = 11 // version 4: stripe.go
	framePrefix    uint8 = 12 // the answer to a prefix probe: prefix.go
)

// Hello flags.
const (
	flagHasSecret    uint16 = 1 // client
	flagAuthRequired uint16 = 1 // server
	flagPrefixProbe  uint16 = 2 // server: answers prefix probes (prefix.go)
)

// DType is the element type of KV bytes on the wire.
type DType uint8

// Wire dtypes. The zero value in a Request means "the server's cache dtype".
const (
	DTypeF32  DType = 1
	DTypeF16  DType = 2
	DTypeBF16 DType = 3
	// DTypeF8E4M3 is FP8 E4M3 with a float32 scale per head per K and per
	// V section of each Chunk (fp8.go); opt-in, attention KV only.
	DTypeF8E4M3 DType = 4
)

// Size is the size of one element in bytes (0 for an invalid dtype).
func (d DType) Size() int {
	switch d {
	case DTypeF32:
		return 4
	case DTypeF16, DTypeBF16:
		return 2
	case DTypeF8E4M3:
		return 1
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case DTypeF32:
		return "f32"
	case DTypeF16:
		return "f16"
	case DTypeBF16:
		return "bf16"
	case DTypeF8E4M3:
		return "fp8"
	case 0:
		return "native"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// LayerKind says what a layer carries on the wire.
type LayerKind uint8

// Layer kinds.
const (
	// LayerAttention layers carry K and V in Chunk frames.
	LayerAttention LayerKind = 0
	// LayerRecurrent layers carry state arrays in State frames.
	LayerRecurrent LayerKind = 1
)

func (k LayerKind) String() string {
	switch k {
	case LayerAttention:
		return "attention"
	case LayerRecurrent:
		return "recurrent"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Fingerprint identifies a model's KV layout (opaque to this package; the
// engine computes it).
type Fingerprint [32]byte

// IsZero reports whether f is all zero (unspecified).
func (f Fingerprint) IsZero() bool { return f == Fingerprint{} }

func (f Fingerprint) String() string { return fmt.Sprintf("%x", f[:8]) }

// Limits bound what a peer may make this side allocate or compute.
type Limits struct {
	// MaxTokens bounds a request's token count (default 262144).
	MaxTokens int
	// MaxFrame bounds a Chunk or State payload in bytes (default 64 MiB).
	MaxFrame int
}

// Default limits.
const (
	DefaultMaxTokens = 262144
	DefaultMaxFrame  = 64 << 20
)

func (l Limits) withDefaults() Limits {
	if l.MaxTokens <= 0 {
		l.MaxTokens = DefaultMaxTokens
	}
	if l.MaxFrame <= 0 {
		l.MaxFrame = DefaultMaxFrame
	}
	return l
}

// maxPayload is the largest payload a frame of type typ may declare.
func (l Limits) maxPayload(typ uint8) int {
	switch typ {
	case frameRequest:
		return requestFixed + maxIDLen + maxModelLen + 4*l.MaxTokens
	case frameAuthProof, frameAuthOK:
		return macSize
	case frameHeader:
		return headerFixed + 5*maxLayers
	case frameChunk, frameState:
		return l.MaxFrame
	case frameDone:
		return doneSize
	case framePrefix:
		return prefixSize
	case frameError:
		return 4 + maxReasonLen
	case frameKeepalive:
		return 0
	case frameStreams, frameJoin:
		return streamsSize
	}
	return -1
}

// Request asks a server for the KV of a prompt (PROTOCOL.md §5).
type Request struct {
	// ID names the request in logs on both sides.
	ID string
	// Model is the served model name.
	Model string
	// Fingerprint is the KV fingerprint the client expects (zero: any).
	Fingerprint Fingerprint
	// Tokens is the whole prompt from position 0.
	Tokens []int32
	// StartPos is how many leading tokens the client already holds.
	StartPos int
	// DType is the wire dtype wanted (0: the server's cache dtype).
	DType DType
	// Deadline is how long the client allows (0: the server's default);
	// sent in milliseconds. Client.Fetch sends what is left of its
	// context plus a second instead when that is sooner (or Deadline is
	// 0), without changing the Request.
	Deadline time.Duration
	// Streams is how many connections the client asks to stripe the
	// chunks over (0 or 1: this one only; at most MaxStreams; PROTOCOL.md
	// §17).
	Streams int
	// PrefixProbe asks only how many leading tokens of Tokens the server
	// already holds (PROTOCOL.md §18): answered with a Prefix frame, no KV.
	// Send it only to a server whose Hello advertises prefix probes
	// (Client.PrefixHit does).
	PrefixProbe bool
	// LayerStart and LayerEnd ask for the model's layers [LayerStart,
	// LayerEnd) only (PROTOCOL.md §19: a pipeline stage's); both zero asks
	// for every layer. The header then starts at FirstLayer = LayerStart
	// and its layers, the frames' layer indices and the sink's are those
	// of the range, counted from 0.
	LayerStart, LayerEnd int
	// HeadStart and HeadEnd ask for the model's KV heads [HeadStart,
	// HeadEnd) only (PROTOCOL.md §20: a tensor-parallel rank's); both zero
	// asks for every head. The header then says FirstHead = HeadStart and
	// KVHeads = HeadEnd − HeadStart, and every chunk carries those heads.
	HeadStart, HeadEnd int
}

// HasRange reports whether r asks for a layer range rather than every
// layer.
func (r *Request) HasRange() bool { return r.LayerStart != 0 || r.LayerEnd != 0 }

// HasHeads reports whether r asks for a KV head range rather than every
// head.
func (r *Request) HasHeads() bool { return r.HeadStart != 0 || r.HeadEnd != 0 }

// checkHeads checks a request's KV head range on its own: unset, or
// 0 ≤ start < end ≤ maxKVHeads.
func checkHeads(start, end int) error {
	if start == 0 && end == 0 {
		return nil
	}
	if start < 0 || start >= end || end > maxKVHeads {
		return fmt.Errorf("kv head range [%d, %d) invalid (0 ≤ start < end ≤ %d, or both 0 for every head)", start, end, maxKVHeads)
	}
	return nil
}

// checkRange checks a request's layer range on its own (not against a
// model): unset, or 0 ≤ start < end ≤ maxLayers.
func checkRange(start, end int) error {
	if start == 0 && end == 0 {
		return nil
	}
	if start < 0 || start >= end || end > maxLayers {
		return fmt.Errorf("layer range [%d, %d) invalid (0 ≤ start < end ≤ %d, or both 0 for every layer)", start, end, maxLayers)
	}
	return nil
}

// Header describes the KV a stream carries (PROTOCOL.md §6).
type Header struct {
	Fingerprint Fingerprint
	DType       DType
	// KVHeads is the heads every chunk carries: the request's head
	// range's count, or the model's KV heads.
	KVHeads int
	HeadDim int
	// FirstHead is the model's KV head that the stream's head 0 is: the
	// request's HeadStart (0 for every head; PROTOCOL.md §20).
	FirstHead int
	// FirstLayer is the model layer that the stream's layer 0 is: the
	// request's LayerStart (0 for a whole model; PROTOCOL.md §19).
	FirstLayer int
	// Kinds has one entry per layer the stream carries.
	Kinds []LayerKind
	// Windows, when not nil, has one entry per layer: 0 for a full
	// attention (or recurrent) layer, W > 0 for a sliding-window layer,
	// which carries only the positions [LayerStart, TokenEnd) the decode
	// side can still attend to (PROTOCOL.md §6).
	Windows []int
	// TokenStart and TokenEnd are the positions [TokenStart, TokenEnd) the
	// stream carries.
	TokenStart, TokenEnd int
}

// Layers is the layer count.
func (h *Header) Layers() int { return len(h.Kinds) }

// Window is layer's window (0: full attention).
func (h *Header) Window(layer int) int {
	if h.Windows == nil {
		return 0
	}
	return h.Windows[layer]
}

// LayerStart is the first position an attention layer's chunks carry:
// TokenStart for a full layer; for a sliding layer of window W, the window
// of position TokenEnd (the first one the decode side computes), that is
// max(TokenStart, TokenEnd-W+1).
func (h *Header) LayerStart(layer int) int {
	w := h.Window(layer)
	if w <= 0 {
		return h.TokenStart
	}
	return max(h.TokenStart, h.TokenEnd-w+1)
}

// KVBytes is the size of K (and of V) for tokens positions of one layer.
func (h *Header) KVBytes(tokens int) int64 {
	if h.DType == DTypeF8E4M3 {
		return int64(FP8Len(h.KVHeads, h.KVHeads*tokens*h.HeadDim))
	}
	return int64(h.KVHeads) * int64(tokens) * int64(h.HeadDim) * int64(h.DType.Size())
}

// Totals is what a Done frame reports (PROTOCOL.md §10).
type Totals struct {
	TokenEnd     int
	Chunks       int
	States       int
	PayloadBytes int64
}

// ---- hello ----

func putHello(b []byte, version, flags uint16, nonce *[32]byte) {
	copy(b[0:4], magic[:])
	le.PutUint16(b[4:6], version)
	le.PutUint16(b[6:8], flags)
	copy(b[8:40], nonce[:])
}

// parseHello returns the peer's flags and nonce, or an ErrVersion error.
func parseHello(b []byte) (version, flags uint16, nonce [32]byte, err error) {
	if [4]byte(b[0:4]) != magic {
		return 0, 0, nonce, fmt.Errorf("%w: bad magic %q (not a kvwire peer)", ErrVersion, b[0:4])
	}
	version = le.Uint16(b[4:6])
	flags = le.Uint16(b[6:8])
	copy(nonce[:], b[8:40])
	if version != Version {
		return version, flags, nonce, fmt.Errorf("%w: peer speaks kvwire version %d, this side speaks %d", ErrVersion, version, Version)
	}
	return version, flags, nonce, nil
}

// ---- frame header ----

// putFrameHeader writes type and length; the CRC is set by sealFrame.
func putFrameHeader(b []byte, typ uint8, length int) {
	b[0] = typ
	b[1] = 0
	b[2], b[3] = 0, 0
	le.PutUint32(b[4:8], uint32(length))
}

// frameCRC is the CRC32C of header bytes 0..7 followed by the payload parts.
func frameCRC(hdr []byte, parts ...[]byte) uint32 {
	c := crc32.Update(0, castag, hdr[0:8])
	for _, p := range parts {
		c = crc32.Update(c, castag, p)
	}
	return c
}

// smallFrame builds a complete frame (header + payload) with its CRC.
func smallFrame(typ uint8, payload []byte) []byte {
	b := make([]byte, frameHeaderSize+len(payload))
	putFrameHeader(b, typ, len(payload))
	copy(b[frameHeaderSize:], payload)
	le.PutUint32(b[8:12], frameCRC(b, payload))
	return b
}

// parseFrameHeader checks a frame header against the limits before any
// payload is read or allocated.
func parseFrameHeader(h []byte, lim Limits) (typ uint8, length int, crc uint32, err error) {
	typ = h[0]
	max := lim.maxPayload(typ)
	if max < 0 {
		return 0, 0, 0, corruptf("unknown frame type %d", typ)
	}
	if h[1] != 0 || h[2] != 0 || h[3] != 0 {
		return 0, 0, 0, corruptf("frame type %d: non-zero flags/reserved % x", typ, h[1:4])
	}
	n := le.Uint32(h[4:8])
	if uint64(n) > uint64(max) {
		return 0, 0, 0, corruptf("frame type %d: length %d exceeds limit %d", typ, n, max)
	}
	return typ, int(n), le.Uint32(h[8:12]), nil
}

// rawFrame is one frame read from the wire, CRC not yet checked.
type rawFrame struct {
	hdr     [frameHeaderSize]byte
	typ     uint8
	crc     uint32
	payload []byte // aliases buf
	buf     []byte // the (possibly grown) buffer to hand back for reuse
	err     error
	checked bool // the CRC has been verified
	waited  bool // a striped chunk that arrived before its layer's previous one
}

// readFrame reads one frame into buf, growing it only up to the limit the
// header's type allows. It does not check the CRC (see rawFrame.check).
// EOF before a frame starts is io.EOF; inside a frame io.ErrUnexpectedEOF.
func readFrame(r io.Reader, buf []byte, lim Limits) rawFrame {
	f := rawFrame{buf: buf}
	if _, err := io.ReadFull(r, f.hdr[:]); err != nil {
		f.err = err
		return f
	}
	typ, n, crc, err := parseFrameHeader(f.hdr[:], lim)
	if err != nil {
		f.err = err
		return f
	}
	f.typ, f.crc = typ, crc
	if cap(f.buf) < n {
		f.buf = make([]byte, n)
	}
	f.payload = f.buf[:n]
	if _, err := io.ReadFull(r, f.payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		f.err = err
	}
	return f
}

// check verifies the frame's CRC32C.
func (f *rawFrame) check() error {
	if f.checked {
		return nil
	}
	if got := frameCRC(f.hdr[:], f.payload); got != f.crc {
		return corruptf("frame type %d (%d bytes): crc32c %08x, header says %08x", f.typ, len(f.payload), got, f.crc)
	}
	f.checked = true
	return nil
}

// ---- request ----

func encodeRequest(req *Request) ([]byte, error) {
	if len(req.ID) > maxIDLen || len(req.Model) > maxModelLen {
		return nil, fmt.Errorf("%w: id (%d bytes) or model name (%d bytes) too long", ErrBadRequest, len(req.ID), len(req.Model))
	}
	if len(req.Tokens) == 0 || req.StartPos < 0 || req.StartPos >= len(req.Tokens) {
		return nil, fmt.Errorf("%w: start_pos %d with %d tokens", ErrBadRequest, req.StartPos, len(req.Tokens))
	}
	if req.DType != 0 && req.DType.Size() == 0 {
		return nil, fmt.Errorf("%w: dtype %v", ErrBadRequest, req.DType)
	}
	if req.Streams < 0 || req.Streams > MaxStreams {
		return nil, fmt.Errorf("%w: %d streams (0..%d)", ErrBadRequest, req.Streams, MaxStreams)
	}
	if err := checkRange(req.LayerStart, req.LayerEnd); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if err := checkHeads(req.HeadStart, req.HeadEnd); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	ms := req.Deadline.Milliseconds()
	if ms < 0 || ms > 1<<32-1 {
		return nil, fmt.Errorf("%w: deadline %v", ErrBadRequest, req.Deadline)
	}
	if req.Deadline > 0 && ms == 0 {
		ms = 1
	}
	n := requestFixed + len(req.ID) + len(req.Model) + 4*len(req.Tokens)
	b := make([]byte, frameHeaderSize+n)
	p := b[frameHeaderSize:]
	p[0] = byte(req.DType)
	p[1] = byte(req.Streams)
	if req.PrefixProbe {
		p[2] = reqFlagPrefixProbe
	}
	le.PutUint32(p[4:8], uint32(req.StartPos))
	le.PutUint32(p[8:12], uint32(ms))
	copy(p[12:44], req.Fingerprint[:])
	le.PutUint16(p[44:46], uint16(len(req.ID)))
	le.PutUint16(p[46:48], uint16(len(req.Model)))
	le.PutUint32(p[48:52], uint32(len(req.Tokens)))
	le.PutUint32(p[52:56], uint32(req.LayerStart))
	le.PutUint32(p[56:60], uint32(req.LayerEnd))
	le.PutUint32(p[60:64], uint32(req.HeadStart))
	le.PutUint32(p[64:68], uint32(req.HeadEnd))
	o := requestFixed
	o += copy(p[o:], req.ID)
	o += copy(p[o:], req.Model)
	for _, t := range req.Tokens {
		le.PutUint32(p[o:], uint32(t))
		o += 4
	}
	putFrameHeader(b, frameRequest, n)
	le.PutUint32(b[8:12], frameCRC(b, p))
	return b, nil
}

// parseRequest decodes and bounds-checks a Request payload. Errors wrap
// ErrBadRequest. It allocates at most the token slice the payload holds.
func parseRequest(p []byte, lim Limits) (*Request, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadRequest}, args...)...)
	}
	if len(p) < requestFixed {
		return nil, bad("request of %d bytes, need at least %d", len(p), requestFixed)
	}
	dt := DType(p[0])
	if dt != 0 && dt.Size() == 0 {
		return nil, bad("unknown dtype %d", p[0])
	}
	if p[1] > MaxStreams {
		return nil, bad("%d streams (at most %d)", p[1], MaxStreams)
	}
	if p[2]&^reqFlagPrefixProbe != 0 || p[3] != 0 {
		return nil, bad("non-zero reserved bytes")
	}
	start := le.Uint32(p[4:8])
	ms := le.Uint32(p[8:12])
	idLen := int(le.Uint16(p[44:46]))
	modelLen := int(le.Uint16(p[46:48]))
	n := le.Uint32(p[48:52])
	ls, lend := le.Uint32(p[52:56]), le.Uint32(p[56:60])
	if ls > maxLayers || lend > maxLayers {
		return nil, bad("layer range [%d, %d) beyond %d layers", ls, lend, maxLayers)
	}
	if err := checkRange(int(ls), int(lend)); err != nil {
		return nil, bad("%v", err)
	}
	hs, he := le.Uint32(p[60:64]), le.Uint32(p[64:68])
	if hs > maxKVHeads || he > maxKVHeads {
		return nil, bad("kv head range [%d, %d) beyond %d heads", hs, he, maxKVHeads)
	}
	if err := checkHeads(int(hs), int(he)); err != nil {
		return nil, bad("%v", err)
	}
	if idLen > maxIDLen || modelLen > maxModelLen {
		return nil, bad("id length %d or model length %d beyond %d/%d", idLen, modelLen, maxIDLen, maxModelLen)
	}
	if n == 0 || uint64(n) > uint64(lim.MaxTokens) {
		return nil, bad("%d tokens (limit %d)", n, lim.MaxTokens)
	}
	if want := uint64(requestFixed) + uint64(idLen) + uint64(modelLen) + 4*uint64(n); uint64(len(p)) != want {
		return nil, bad("request of %d bytes, layout says %d", len(p), want)
	}
	if uint64(start) >= uint64(n) {
		return nil, bad("start_pos %d with %d tokens", start, n)
	}
	req := &Request{
		PrefixProbe: p[2]&reqFlagPrefixProbe != 0,
		StartPos:    int(start),
		Streams:     int(p[1]),
		DType:       dt,
		Deadline:    time.Duration(ms) * time.Millisecond,
		LayerStart:  int(ls),
		LayerEnd:    int(lend),
		HeadStart:   int(hs),
		HeadEnd:     int(he),
	}
	copy(req.Fingerprint[:], p[12:44])
	o := requestFixed
	id := p[o : o+idLen]
	o += idLen
	model := p[o : o+modelLen]
	o += modelLen
	if !utf8.Valid(id) || !utf8.Valid(model) {
		return nil, bad("id or model name is not UTF-8")
	}
	req.ID, req.Model = string(id), string(model)
	req.Tokens = make([]int32, n)
	for i := range req.Tokens {
		t := int32(le.Uint32(p[o:]))
		if t < 0 {
			return nil, bad("token %d is negative (%d)", i, t)
		}
		req.Tokens[i] = t
		o += 4
	}
	return req, nil
}

// ---- header ----

// validateHeader checks a header's own consistency (not against a model).
func validateHeader(h *Header) error {
	if h.DType.Size() == 0 {
		return fmt.Errorf("header dtype %d unknown", h.DType)
	}
	if len(h.Kinds) < 1 || len(h.Kinds) > maxLayers {
		return fmt.Errorf("header layer count %d outside 1..%d", len(h.Kinds), maxLayers)
	}
	if h.FirstLayer < 0 || h.FirstLayer > maxLayers-len(h.Kinds) {
		return fmt.Errorf("header layers [%d, %d) beyond %d", h.FirstLayer, h.FirstLayer+len(h.Kinds), maxLayers)
	}
	if h.KVHeads < 1 || h.KVHeads > maxKVHeads || h.HeadDim < 1 || h.HeadDim > maxHeadDim {
		return fmt.Errorf("header kv_heads %d / head_dim %d outside 1..%d / 1..%d", h.KVHeads, h.HeadDim, maxKVHeads, maxHeadDim)
	}
	if h.FirstHead < 0 || h.FirstHead > maxKVHeads-h.KVHeads {
		return fmt.Errorf("header kv heads [%d, %d) beyond %d", h.FirstHead, h.FirstHead+h.KVHeads, maxKVHeads)
	}
	for i, k := range h.Kinds {
		if k != LayerAttention && k != LayerRecurrent {
			return fmt.Errorf("header layer %d kind %d unknown", i, k)
		}
	}
	if h.Windows != nil && len(h.Windows) != len(h.Kinds) {
		return fmt.Errorf("header has %d windows for %d layers", len(h.Windows), len(h.Kinds))
	}
	for i, w := range h.Windows {
		if w < 0 || w > maxWindow || (w > 0 && h.Kinds[i] != LayerAttention) {
			return fmt.Errorf("header layer %d (%v) window %d invalid", i, h.Kinds[i], w)
		}
	}
	if h.TokenStart < 0 || h.TokenEnd < h.TokenStart || int64(h.TokenEnd) > 1<<32-1 {
		return fmt.Errorf("header token range [%d, %d) invalid", h.TokenStart, h.TokenEnd)
	}
	return nil
}

func encodeHeader(h *Header) []byte {
	p := make([]byte, headerFixed+5*len(h.Kinds))
	copy(p[0:32], h.Fingerprint[:])
	p[32] = byte(h.DType)
	le.PutUint32(p[36:40], uint32(len(h.Kinds)))
	le.PutUint32(p[40:44], uint32(h.KVHeads))
	le.PutUint32(p[44:48], uint32(h.HeadDim))
	le.PutUint32(p[48:52], uint32(h.TokenStart))
	le.PutUint32(p[52:56], uint32(h.TokenEnd))
	le.PutUint32(p[56:60], uint32(h.FirstLayer))
	le.PutUint32(p[60:64], uint32(h.FirstHead))
	for i, k := range h.Kinds {
		p[headerFixed+i] = byte(k)
		le.PutUint32(p[headerFixed+len(h.Kinds)+4*i:], uint32(h.Window(i)))
	}
	return smallFrame(frameHeader, p)
}

// parseHeader decodes a Header payload; errors wrap ErrCorrupt.
func parseHeader(p []byte) (*Header, error) {
	if len(p) < headerFixed {
		return nil, corruptf("header of %d bytes", len(p))
	}
	if p[33] != 0 || p[34] != 0 || p[35] != 0 {
		return nil, corruptf("header reserved bytes non-zero")
	}
	layers := le.Uint32(p[36:40])
	if layers < 1 || layers > maxLayers || len(p) != headerFixed+5*int(layers) {
		return nil, corruptf("header of %d bytes for %d layers", len(p), layers)
	}
	first := le.Uint32(p[56:60])
	if first > maxLayers {
		return nil, corruptf("header first layer %d", first)
	}
	fh := le.Uint32(p[60:64])
	if fh > maxKVHeads {
		return nil, corruptf("header first kv head %d", fh)
	}
	h := &Header{
		DType:      DType(p[32]),
		KVHeads:    int(le.Uint32(p[40:44])),
		HeadDim:    int(le.Uint32(p[44:48])),
		TokenStart: int(le.Uint32(p[48:52])),
		TokenEnd:   int(le.Uint32(p[52:56])),
		FirstLayer: int(first),
		FirstHead:  int(fh),
		Kinds:      make([]LayerKind, layers),
	}
	copy(h.Fingerprint[:], p[0:32])
	for i := range h.Kinds {
		h.Kinds[i] = LayerKind(p[headerFixed+i])
		if w := le.Uint32(p[headerFixed+int(layers)+4*i:]); w != 0 {
			if h.Windows == nil {
				h.Windows = make([]int, layers)
			}
			h.Windows[i] = int(min(w, maxWindow+1))
		}
	}
	if err := validateHeader(h); err != nil {
		return nil, corruptf("%v", err)
	}
	return h, nil
}

// ---- chunk ----

// putChunkPrefix writes the frame header and the chunk prefix into b
// (frameHeaderSize+chunkPrefixSize bytes) and seals the CRC over k and v.
func putChunkPrefix(b []byte, layer, start, count int, k, v []byte) {
	putFrameHeader(b, frameChunk, chunkPrefixSize+len(k)+len(v))
	p := b[frameHeaderSize:]
	le.PutUint32(p[0:4], uint32(layer))
	le.PutUint32(p[4:8], uint32(start))
	le.PutUint32(p[8:12], uint32(count))
	le.PutUint32(p[12:16], uint32(len(k)))
	le.PutUint32(p[16:20], uint32(len(v)))
	le.PutUint32(b[8:12], frameCRC(b, p[:chunkPrefixSize], k, v))
}

// parseChunk splits a Chunk payload; k and v alias p. Errors wrap ErrCorrupt.
func parseChunk(p []byte) (layer, start, count int, k, v []byte, err error) {
	if len(p) < chunkPrefixSize {
		return 0, 0, 0, nil, nil, corruptf("chunk of %d bytes", len(p))
	}
	layer = int(le.Uint32(p[0:4]))
	start = int(le.Uint32(p[4:8]))
	count = int(le.Uint32(p[8:12]))
	kl := uint64(le.Uint32(p[12:16]))
	vl := uint64(le.Uint32(p[16:20]))
	if uint64(chunkPrefixSize)+kl+vl != uint64(len(p)) {
		return 0, 0, 0, nil, nil, corruptf("chunk of %d bytes says K %d + V %d", len(p), kl, vl)
	}
	k = p[chunkPrefixSize : chunkPrefixSize+int(kl)]
	v = p[chunkPrefixSize+int(kl):]
	return layer, start, count, k, v, nil
}

// ---- state ----

// encodeStatePrefix returns the frame header plus the state prefix (layer,
// token_end, count, lengths) with the CRC sealed over the arrays.
func encodeStatePrefix(layer, tokenEnd int, arrays [][]byte) []byte {
	n := stateFixed + 4*len(arrays)
	total := n
	for _, a := range arrays {
		total += len(a)
	}
	b := make([]byte, frameHeaderSize+n)
	putFrameHeader(b, frameState, total)
	p := b[frameHeaderSize:]
	le.PutUint32(p[0:4], uint32(layer))
	le.PutUint32(p[4:8], uint32(tokenEnd))
	le.PutUint32(p[8:12], uint32(len(arrays)))
	for i, a := range arrays {
		le.PutUint32(p[stateFixed+4*i:], uint32(len(a)))
	}
	c := frameCRC(b, p)
	for _, a := range arrays {
		c = crc32.Update(c, castag, a)
	}
	le.PutUint32(b[8:12], c)
	return b
}

// parseState splits a State payload; the arrays alias p and are appended
// to arrays[:0]. Errors wrap ErrCorrupt.
func parseState(p []byte, arrays [][]byte) (layer, tokenEnd int, out [][]byte, err error) {
	if len(p) < stateFixed {
		return 0, 0, nil, corruptf("state of %d bytes", len(p))
	}
	layer = int(le.Uint32(p[0:4]))
	tokenEnd = int(le.Uint32(p[4:8]))
	m := le.Uint32(p[8:12])
	if m < 1 || m > maxArrays || uint64(len(p)) < uint64(stateFixed)+4*uint64(m) {
		return 0, 0, nil, corruptf("state of %d bytes with %d arrays", len(p), m)
	}
	o := uint64(stateFixed) + 4*uint64(m)
	sum := o
	for i := range int(m) {
		sum += uint64(le.Uint32(p[stateFixed+4*i:]))
	}
	if sum != uint64(len(p)) {
		return 0, 0, nil, corruptf("state of %d bytes, layout says %d", len(p), sum)
	}
	out = arrays[:0]
	for i := range int(m) {
		n := uint64(le.Uint32(p[stateFixed+4*i:]))
		out = append(out, p[o:o+n])
		o += n
	}
	return layer, tokenEnd, out, nil
}

// ---- done ----

func encodeDone(t Totals) []byte {
	var p [doneSize]byte
	le.PutUint32(p[0:4], uint32(t.TokenEnd))
	le.PutUint32(p[4:8], uint32(t.Chunks))
	le.PutUint32(p[8:12], uint32(t.States))
	le.PutUint64(p[16:24], uint64(t.PayloadBytes))
	return smallFrame(frameDone, p[:])
}

func parseDone(p []byte) (Totals, error) {
	if len(p) != doneSize {
		return Totals{}, corruptf("done of %d bytes", len(p))
	}
	if le.Uint32(p[12:16]) != 0 {
		return Totals{}, corruptf("done reserved bytes non-zero")
	}
	pb := le.Uint64(p[16:24])
	if pb > 1<<62 {
		return Totals{}, corruptf("done payload bytes %d", pb)
	}
	return Totals{
		TokenEnd:     int(le.Uint32(p[0:4])),
		Chunks:       int(le.Uint32(p[4:8])),
		States:       int(le.Uint32(p[8:12])),
		PayloadBytes: int64(pb),
	}, nil
}

// ---- error ----

func encodeError(code uint16, reason string) []byte {
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	p := make([]byte, 4+len(reason))
	le.PutUint16(p[0:2], code)
	le.PutUint16(p[2:4], uint16(len(reason)))
	copy(p[4:], reason)
	return smallFrame(frameError, p)
}

// parseError decodes an Error payload into a *RemoteError.
func parseError(p []byte) error {
	if len(p) < 4 {
		return corruptf("error frame of %d bytes", len(p))
	}
	r := int(le.Uint16(p[2:4]))
	if r > maxReasonLen || len(p) != 4+r {
		return corruptf("error frame of %d bytes with a %d-byte reason", len(p), r)
	}
	return &RemoteError{Code: le.Uint16(p[0:2]), Reason: string(p[4:])}
}

// LogValue summarizes a request for log/slog (without its token ids).
func (r *Request) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("id", r.ID),
		slog.String("model", r.Model),
		slog.Int("tokens", len(r.Tokens)),
		slog.Int("start_pos", r.StartPos),
		slog.String("dtype", r.DType.String()),
		slog.Duration("deadline", r.Deadline),
		slog.Int("streams", max(r.Streams, 1)),
	}
	if r.HasRange() {
		attrs = append(attrs, slog.String("layers", fmt.Sprintf("%d:%d", r.LayerStart, r.LayerEnd)))
	}
	if r.HasHeads() {
		attrs = append(attrs, slog.String("kv_heads", fmt.Sprintf("%d:%d", r.HeadStart, r.HeadEnd)))
	}
	return slog.GroupValue(attrs...)
}

// LogValue summarizes a header for log/slog.
func (h *Header) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("fingerprint", h.Fingerprint.String()),
		slog.String("dtype", h.DType.String()),
		slog.Int("first_layer", h.FirstLayer),
		slog.Int("layers", len(h.Kinds)),
		slog.Int("kv_heads", h.KVHeads),
		slog.Int("head_dim", h.HeadDim),
		slog.Int("token_start", h.TokenStart),
		slog.Int("token_end", h.TokenEnd),
	)
}

package tensor

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/runners/internal/wireauth"
)

// The tensor link (docs/PROTOCOL.md "Tensor link"): one TCP connection
// from each follower rank to rank 0, carrying rank 0's calls to the
// follower, the follower's acknowledgements and, on the cpu backend, the
// all_sum partials and sums.
//
// Handshake (each side writes its hello, then reads the other's):
//
//	hello  = magic "EXOTP" | version u8 | rank u16 | size u16 | auth u8 | sum u8 | backend [16] | nonce [32]
//
// (sum: 0 = the ranks sum over this link (the cpu backend), 1 = over
// MLX's ring, 2 = MLX's NCCL group, 3 = MLX's JACCL group; backend: the
// rank's engine backend name, "cpu", "mlx-cpu" or "mlx-gpu", NUL padded.
// Every rank must say the same sum: a mismatch is refused, on both sides,
// naming both ranks' backends. On MLX the ranks link before any joins
// MLX's group, so that a rank on another backend is refused by name
// instead of leaving the others waiting in MLX's join.)
//
// With a secret (auth = 1 on both sides, else refused) the follower then
// writes HMAC-SHA256(secret, "exo-tensor/<version> follower" || n0 || nf)
// and rank 0 answers with the "leader" proof (wireauth.MAC; n0 is rank
// 0's nonce, nf the follower's); a wrong proof closes the link. After
// that every message is a frame:
//
//	frame = type u8 | length u32 | payload [length] | crc32c u32 (over type, length and payload)
//
// All integers are little-endian.

const (
	linkMagic   = "EXOTP"
	linkVersion = 2
	backendLen  = 16
	helloLen    = len(linkMagic) + 1 + 2 + 2 + 1 + 1 + backendLen + 32
	// maxFrame bounds a frame's payload: an all_sum of a prefill chunk
	// (chunk × hidden × 4 bytes) or a call's token ids.
	maxFrame = 1 << 28
	// handshakeTimeout bounds the hello and the proofs.
	handshakeTimeout = 10 * time.Second
)

// Frame types.
const (
	frameCall    = 1 // rank 0 → follower: one engine call (call.go)
	frameAck     = 2 // follower → rank 0: the call's outcome
	framePartial = 3 // follower → rank 0: this rank's all_sum operand
	frameSum     = 4 // rank 0 → follower: the all_sum's result
	// frameWant (follower → rank 0, between calls, unasked): a prefill
	// rank's request for a prompt its prefix cache lacks and no
	// computation brings; rank 0 computes it (prefill.go).
	frameWant = 5
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ErrLink is wrapped by every failure of the tensor link: a broken or
// refused connection, a framing or checksum error, a failed handshake.
var ErrLink = errors.New("tensor link")

// ErrAuth is wrapped (with ErrLink) by a failed authentication.
var ErrAuth = errors.New("authentication failed")

// ErrMismatch is wrapped (with ErrLink) by the refusal of a rank that runs
// another backend, or sums over another group, than this one.
var ErrMismatch = errors.New("every rank of a tensor group must run the same backend")

// sums are the hello's sum values: where the ranks sum ("" = the link).
var sums = []string{"", "ring", "nccl", "jaccl"}

// sumName says where a group sums, for errors.
func sumName(group string) string {
	if group == "" {
		return "the tensor link"
	}
	return "MLX's " + group
}

// hello is one side's first message.
type hello struct {
	rank, size int
	auth       bool
	// group is MLX's group the ranks sum over ("ring", "nccl",
	// "jaccl"), "" for the link (the cpu backend).
	group string
	// backend is the rank's engine backend name ("" unknown).
	backend string
	nonce   [32]byte
}

func (h hello) encode() []byte {
	b := make([]byte, 0, helloLen)
	b = append(b, linkMagic...)
	b = append(b, linkVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(h.rank))
	b = binary.LittleEndian.AppendUint16(b, uint16(h.size))
	a := byte(0)
	if h.auth {
		a = 1
	}
	b = append(b, a)
	b = append(b, byte(max(0, slices.Index(sums, h.group))))
	var be [backendLen]byte
	copy(be[:], h.backend)
	b = append(b, be[:]...)
	return append(b, h.nonce[:]...)
}

// checkHead checks a hello's magic and version (its first bytes).
func checkHead(b []byte) error {
	if len(b) < len(linkMagic)+1 || string(b[:len(linkMagic)]) != linkMagic {
		return fmt.Errorf("%w: not a tensor link peer", ErrLink)
	}
	if v := b[len(linkMagic)]; v != linkVersion {
		return fmt.Errorf("%w: peer speaks version %d, this runner %d (every rank must run the same exo)", ErrLink, v, linkVersion)
	}
	return nil
}

func decodeHello(b []byte) (hello, error) {
	if err := checkHead(b); err != nil {
		return hello{}, err
	}
	if len(b) != helloLen {
		return hello{}, fmt.Errorf("%w: a hello of %d bytes, want %d", ErrLink, len(b), helloLen)
	}
	p := b[len(linkMagic):]
	h := hello{rank: int(binary.LittleEndian.Uint16(p[1:])), size: int(binary.LittleEndian.Uint16(p[3:]))}
	switch p[5] {
	case 0:
	case 1:
		h.auth = true
	default:
		return hello{}, fmt.Errorf("%w: bad auth flag %d", ErrLink, p[5])
	}
	if int(p[6]) >= len(sums) {
		return hello{}, fmt.Errorf("%w: bad sum flag %d", ErrLink, p[6])
	}
	h.group = sums[p[6]]
	be := p[7 : 7+backendLen]
	n := bytes.IndexByte(be, 0)
	if n < 0 {
		n = backendLen
	}
	for i, c := range be {
		if i < n && !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') || i >= n && c != 0 {
			return hello{}, fmt.Errorf("%w: bad backend name %q", ErrLink, be)
		}
	}
	h.backend = string(be[:n])
	copy(h.nonce[:], p[7+backendLen:])
	return h, nil
}

func authLabel() string { return fmt.Sprintf("exo-tensor/%d", linkVersion) }

// link is one authenticated connection. Writes are serialized; reads are
// the owner's (one goroutine).
type link struct {
	conn net.Conn
	br   *bufio.Reader
	peer int // the other side's rank
	wmu  sync.Mutex
	hdr  [5]byte
}

// handshake runs the hello and, with a secret, the proofs. me is this
// side's rank and size; leader is whether this side is rank 0 (which
// checks the follower's proof first).
func handshake(conn net.Conn, me hello, secret []byte) (*link, hello, error) {
	me.auth = len(secret) > 0
	if _, err := rand.Read(me.nonce[:]); err != nil {
		return nil, hello{}, err
	}
	_ = conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	if _, err := conn.Write(me.encode()); err != nil {
		return nil, hello{}, fmt.Errorf("%w: write hello: %w", ErrLink, err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	// The magic and version first: a peer of another version (whose
	// hello may be shorter) is refused as that, not as a short read.
	buf := make([]byte, helloLen)
	head := len(linkMagic) + 1
	if _, err := io.ReadFull(br, buf[:head]); err != nil {
		return nil, hello{}, fmt.Errorf("%w: read hello: %w", ErrLink, err)
	}
	if string(buf[:len(linkMagic)]) != linkMagic || buf[len(linkMagic)] != linkVersion {
		return nil, hello{}, checkHead(buf[:head])
	}
	if _, err := io.ReadFull(br, buf[head:]); err != nil {
		return nil, hello{}, fmt.Errorf("%w: read hello: %w", ErrLink, err)
	}
	peer, err := decodeHello(buf)
	if err != nil {
		return nil, hello{}, err
	}
	if peer.size != me.size {
		return nil, hello{}, fmt.Errorf("%w: peer rank %d is in a group of %d, this one of %d", ErrLink, peer.rank, peer.size, me.size)
	}
	if peer.group != me.group {
		name := func(b string) string {
			if b == "" {
				return "unknown"
			}
			return b
		}
		return nil, hello{}, fmt.Errorf("%w: rank %d runs backend %s (sums over %s), rank %d %s (over %s): %w",
			ErrLink, peer.rank, name(peer.backend), sumName(peer.group), me.rank, name(me.backend), sumName(me.group), ErrMismatch)
	}
	if peer.auth != me.auth {
		return nil, hello{}, fmt.Errorf("%w: %w: one side has a secret and the other none", ErrLink, ErrAuth)
	}
	l := &link{conn: conn, br: br, peer: peer.rank}
	if !me.auth {
		return l, peer, nil
	}
	leader := me.rank == 0
	n0, nf := &me.nonce, &peer.nonce
	if !leader {
		n0, nf = nf, n0
	}
	proof := func(role string) []byte { return wireauth.MAC(secret, authLabel(), role, n0, nf) }
	mac := make([]byte, 32)
	if leader {
		if _, err := io.ReadFull(br, mac); err != nil {
			return nil, hello{}, fmt.Errorf("%w: read proof: %w", ErrLink, err)
		}
		if !wireauth.Equal(mac, proof("follower")) {
			return nil, hello{}, fmt.Errorf("%w: %w: rank %d's proof is wrong (another secret?)", ErrLink, ErrAuth, peer.rank)
		}
		if _, err := conn.Write(proof("leader")); err != nil {
			return nil, hello{}, fmt.Errorf("%w: write proof: %w", ErrLink, err)
		}
		return l, peer, nil
	}
	if _, err := conn.Write(proof("follower")); err != nil {
		return nil, hello{}, fmt.Errorf("%w: write proof: %w", ErrLink, err)
	}
	if _, err := io.ReadFull(br, mac); err != nil {
		return nil, hello{}, fmt.Errorf("%w: %w: rank 0 refused this rank's proof (another secret?): %w", ErrLink, ErrAuth, err)
	}
	if !wireauth.Equal(mac, proof("leader")) {
		return nil, hello{}, fmt.Errorf("%w: %w: rank 0's proof is wrong (another secret?)", ErrLink, ErrAuth)
	}
	return l, peer, nil
}

// write sends one frame.
func (l *link) write(typ byte, payload []byte) error {
	if len(payload) > maxFrame {
		return fmt.Errorf("%w: frame of %d bytes (at most %d)", ErrLink, len(payload), maxFrame)
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.hdr[0] = typ
	binary.LittleEndian.PutUint32(l.hdr[1:5], uint32(len(payload)))
	crc := crc32.Update(0, crcTable, l.hdr[:5])
	crc = crc32.Update(crc, crcTable, payload)
	var tail [4]byte
	binary.LittleEndian.PutUint32(tail[:], crc)
	bufs := net.Buffers{l.hdr[:5], payload, tail[:]}
	if _, err := bufs.WriteTo(l.conn); err != nil {
		return fmt.Errorf("%w: write to rank %d: %w", ErrLink, l.peer, err)
	}
	return nil
}

// read reads one frame into buf's storage (grown when short).
func (l *link) read(buf []byte) (typ byte, payload []byte, err error) {
	return readFrame(l.br, buf, l.peer)
}

func readFrame(r io.Reader, buf []byte, peer int) (typ byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, fmt.Errorf("%w: read from rank %d: %w", ErrLink, peer, err)
	}
	n := binary.LittleEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("%w: rank %d sent a frame of %d bytes (at most %d)", ErrLink, peer, n, maxFrame)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	payload = buf[:n]
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("%w: read from rank %d: %w", ErrLink, peer, err)
	}
	var tail [4]byte
	if _, err := io.ReadFull(r, tail[:]); err != nil {
		return 0, nil, fmt.Errorf("%w: read from rank %d: %w", ErrLink, peer, err)
	}
	crc := crc32.Update(0, crcTable, hdr[:])
	crc = crc32.Update(crc, crcTable, payload)
	if crc != binary.LittleEndian.Uint32(tail[:]) {
		return 0, nil, fmt.Errorf("%w: rank %d's frame fails its CRC32C", ErrLink, peer)
	}
	switch hdr[0] {
	case frameCall, frameAck, framePartial, frameSum, frameWant:
	default:
		return 0, nil, fmt.Errorf("%w: rank %d sent frame type %d", ErrLink, peer, hdr[0])
	}
	return hdr[0], payload, nil
}

func (l *link) close() error { return l.conn.Close() }

package tensor

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	wire "github.com/exo-pd/exo-pd/runners/internal/link"
)

// The tensor link (docs/PROTOCOL.md "Tensor link"): one TCP connection
// from each follower rank (the dialer) to rank 0, framed, hello'd and
// authenticated by runners/internal/link, carrying rank 0's calls, the
// followers' acks and, on the cpu backend, the all_sum partials and sums.

const (
	linkVersion = 3
	// maxFrame bounds a frame's payload: an all_sum of a prefill chunk
	// (chunk × hidden × 4 bytes) or a call's token ids.
	maxFrame = 1 << 28
	// handshakeTimeout bounds the hellos and the proofs.
	handshakeTimeout = 10 * time.Second
)

// Frame types (around the shared layer's 1, 2, 9 and 10, which only the
// handshake uses).
const (
	frameCall    = 3 // rank 0 → follower: one engine call (call.go)
	frameAck     = 4 // follower → rank 0: the call's outcome
	framePartial = 5 // follower → rank 0: this rank's all_sum operand
	frameSum     = 6 // rank 0 → follower: the all_sum's result
	// frameWant (follower → rank 0, between calls, unasked): a prefill
	// rank's request for a prompt its prefix cache lacks and no
	// computation brings; rank 0 computes it (prefill.go).
	frameWant = 7
)

// spec is the tensor link's hello. Its magic begins as versions 1 and 2's
// hellos did ("EXOTP", then their version byte), so that either side of a
// mixed pair refuses the other as its version.
var spec = wire.Spec{Name: "tensor link", Noun: "rank", Magic: "EXOTP\x03\x00\x00", Version: linkVersion,
	Flags: wire.FlagAuth | wire.FlagGroup | wire.FlagKinds, Backend: true, Legacy: legacy,
	Label: fmt.Sprintf("exo-tensor/%d", linkVersion)}

// legacy names a rank of version 1 or 2 from its hello's first bytes.
func legacy(head []byte) error {
	if string(head[:5]) != "EXOTP" || head[5] == linkVersion {
		return nil
	}
	return fmt.Errorf("%w: the peer speaks tensor link version %d, this side %d (every rank must run the same exo)", wire.ErrVersion, head[5], linkVersion)
}

// ErrLink is wrapped by every failure of the tensor link: a broken or
// refused connection, a framing or checksum error, a failed handshake.
var ErrLink = errors.New("tensor link")

// ErrAuth is wrapped (with ErrLink) by a failed authentication.
var ErrAuth = wire.ErrAuth

// ErrMismatch is wrapped (with ErrLink) by the refusal of a rank that runs
// another backend, or sums over another group, than this one.
var ErrMismatch = errors.New("every rank of a tensor group must run the same backend")

// sumName says where a group sums, for errors.
func sumName(group string) string {
	if group == "" {
		return "the tensor link"
	}
	return "MLX's " + group
}

// handshake runs the link's handshake as rank of size ranks, summing over
// group ("" the link, else MLX's "ring", "nccl" or "jaccl") on backend;
// a follower dials, rank 0 accepts. It returns the peer's hello.
func handshake(conn net.Conn, rank, size int, group, backend string, secret []byte) (*link, wire.Hello, error) {
	flags, err := wire.GroupFlags(group)
	if err != nil {
		return nil, wire.Hello{}, fmt.Errorf("%w: %w", ErrLink, err)
	}
	me := wire.Hello{Index: rank, Count: size, Flags: flags, Backend: backend}
	hs := &wire.Handshake{Spec: &spec, Me: me, Secret: secret, Dialer: rank != 0, Timeout: handshakeTimeout,
		Check: func(peer *wire.Hello) error { return checkPeer(&me, peer) }}
	br := bufio.NewReaderSize(conn, 64<<10)
	_, peer, err := hs.Run(context.Background(), conn, br)
	if err != nil {
		return nil, peer, fmt.Errorf("%w: %w", ErrLink, err)
	}
	return &link{conn: conn, br: br, peer: peer.Index}, peer, nil
}

// checkPeer says why peer is not a rank of me's group.
func checkPeer(me, peer *wire.Hello) error {
	switch {
	case peer.Count != me.Count:
		return fmt.Errorf("%w: peer rank %d is in a group of %d, this one of %d", wire.ErrMismatch, peer.Index, peer.Count, me.Count)
	case me.Index != 0 && peer.Index != 0:
		return fmt.Errorf("%w: rank %d dialled rank %d, not rank 0", wire.ErrMismatch, me.Index, peer.Index)
	}
	if _, same := wire.Agree(me, peer); !same {
		return fmt.Errorf("rank %d runs backend %s (sums over %s), rank %d %s (over %s): %w",
			peer.Index, cmp.Or(peer.Backend, "unknown"), sumName(peer.Group()), me.Index, cmp.Or(me.Backend, "unknown"), sumName(me.Group()), ErrMismatch)
	}
	return nil
}

// link is one authenticated connection. Writes are serialized; reads are
// the owner's (one goroutine).
type link struct {
	conn net.Conn
	br   *bufio.Reader
	peer int // the other side's rank
	wmu  sync.Mutex
}

// write sends one frame.
func (l *link) write(typ byte, payload []byte) error {
	if len(payload) > maxFrame {
		return fmt.Errorf("%w: frame of %d bytes (at most %d)", ErrLink, len(payload), maxFrame)
	}
	h := wire.Header(typ, payload)
	bufs := net.Buffers{h[:], payload}
	l.wmu.Lock()
	defer l.wmu.Unlock()
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
	typ, payload, err = wire.ReadFrame(r, buf, limits)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: read from rank %d: %w", ErrLink, peer, err)
	}
	return typ, payload, nil
}

// limits bounds the tensor link's frames (the handshake's are not
// read after it).
func limits(typ byte) (min, max int, ok bool) {
	return 0, maxFrame, typ >= frameCall && typ <= frameWant
}

func (l *link) close() error { return l.conn.Close() }

package link

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
)

// A hello's size, each way, and the most bytes of its backend name.
const HelloSize, BackendLen = 96, 8

// Hello flags. FlagGroup offers to carry the link's heavy traffic (a
// stage's hidden states, a tensor rank's all_sums) over an MLX group,
// whose kind bits 2-3 name: 0 ring, 1 NCCL, 2 JACCL.
const (
	FlagAuth   = 1 << 0 // the dialer has a secret; the acceptor requires one
	FlagGroup  = 1 << 1
	FlagKinds  = 3 << 2 // the kind bits, which a link naming only the ring never sets
	groupShift = 2
)

// groups are the MLX groups a hello names, by kind.
var groups = []string{"ring", "nccl", "jaccl"}

// Hello is one side's fixed introduction (PROTOCOL.md "Shared link layer").
type Hello struct {
	Version     uint16
	Flags       uint16
	Index       int // the side's stage or rank
	Count       int // stages or ranks
	First, End  int // the side's layers [First, End) (0 where the link has none)
	Fingerprint [32]byte
	Nonce       [32]byte
	Backend     string // the side's engine backend ("" where the link carries none)
}

// Auth says whether the hello's side has (dialer) or requires (acceptor) a secret.
func (h *Hello) Auth() bool { return h.Flags&FlagAuth != 0 }

// Group is the MLX group the side offers ("" none).
func (h *Hello) Group() string {
	if h.Flags&FlagGroup == 0 {
		return ""
	}
	return groups[h.Flags&FlagKinds>>groupShift]
}

// GroupFlags are the flags that offer group ("" none, "ring", "nccl", "jaccl").
func GroupFlags(group string) (uint16, error) {
	if group == "" {
		return 0, nil
	}
	k := slices.Index(groups, group)
	if k < 0 {
		return 0, fmt.Errorf("MLX group %q (ring, nccl or jaccl)", group)
	}
	return FlagGroup | uint16(k)<<groupShift, nil
}

// Agree is the group both hellos offer: "" when either offers none or
// they offer different ones (same false).
func Agree(me, peer *Hello) (group string, same bool) {
	if me.Group() != peer.Group() {
		return "", false
	}
	return me.Group(), true
}

// Spec is what a link's hello is: its magic, version, the flags it uses
// and whether it carries the backend.
type Spec struct {
	Name    string // "stage link", for errors
	Noun    string // what a peer is ("stage", "rank"), for errors
	Magic   string // 8 bytes
	Version uint16
	Flags   uint16 // the flags this link may set; others are refused
	Backend bool   // the hello carries the backend (else its bytes are 0)
	// Legacy, when set, names a peer of an older hello layout from its
	// first 8 bytes (which differ from Magic): an ErrVersion, or nil when
	// it is no such peer.
	Legacy func(head []byte) error
	// Label is the authentication label ("exo-stage/2").
	Label string
}

// Encode is h's bytes (h.Version as given; a backend longer than
// BackendLen is cut).
func (s *Spec) Encode(h *Hello) []byte {
	b := make([]byte, HelloSize)
	le := binary.LittleEndian
	copy(b, s.Magic)
	le.PutUint16(b[8:], h.Version)
	le.PutUint16(b[10:], h.Flags)
	le.PutUint16(b[12:], uint16(h.Index))
	le.PutUint16(b[14:], uint16(h.Count))
	le.PutUint32(b[16:], uint32(h.First))
	le.PutUint32(b[20:], uint32(h.End))
	copy(b[24:56], h.Fingerprint[:])
	copy(b[56:88], h.Nonce[:])
	copy(b[88:88+BackendLen], h.Backend)
	return b
}

// Parse checks and reads a hello: its magic, version (s.Version only),
// flags and backend; anything else is ErrVersion.
func (s *Spec) Parse(b []byte) (Hello, error) {
	var h Hello
	if len(b) < len(s.Magic) || string(b[:len(s.Magic)]) != s.Magic {
		if s.Legacy != nil && len(b) >= len(s.Magic) {
			if err := s.Legacy(b[:len(s.Magic)]); err != nil {
				return h, err
			}
		}
		return h, fmt.Errorf("%w: not a %s peer (bad magic)", ErrVersion, s.Name)
	}
	if len(b) != HelloSize {
		return h, fmt.Errorf("%w: a hello of %d bytes, want %d", ErrVersion, len(b), HelloSize)
	}
	le := binary.LittleEndian
	h.Version, h.Flags = le.Uint16(b[8:]), le.Uint16(b[10:])
	if h.Version != s.Version {
		return h, fmt.Errorf("%w: the peer speaks %s version %d, this side %d", ErrVersion, s.Name, h.Version, s.Version)
	}
	if h.Flags&^s.Flags != 0 || h.Flags&FlagKinds != 0 && (h.Flags&FlagGroup == 0 || int(h.Flags&FlagKinds>>groupShift) >= len(groups)) {
		return h, fmt.Errorf("%w: reserved hello bits set (flags %#x)", ErrVersion, h.Flags)
	}
	be := b[88 : 88+BackendLen]
	n := bytes.IndexByte(be, 0)
	if n < 0 {
		n = BackendLen
	}
	for i, c := range be {
		if i < n && (!s.Backend || !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_')) || i >= n && c != 0 {
			return h, fmt.Errorf("%w: reserved hello bytes or a bad backend name %q", ErrVersion, be)
		}
	}
	h.Backend = string(be[:n])
	h.Index, h.Count = int(le.Uint16(b[12:])), int(le.Uint16(b[14:]))
	h.First, h.End = int(le.Uint32(b[16:])), int(le.Uint32(b[20:]))
	copy(h.Fingerprint[:], b[24:56])
	copy(h.Nonce[:], b[56:88])
	return h, nil
}

package link

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/exo-pd/exo-pd/runners/internal/wireauth"
)

// DefaultHandshakeTimeout bounds a handshake whose Timeout is 0.
const DefaultHandshakeTimeout = 10 * time.Second

// Handshake is one end's part in a link's opening: each side writes its
// hello, then reads the peer's; each checks the other's (Spec.Parse, then
// Check) and refuses with an Error frame naming why; then, when both have
// a secret, the dialer proves it knows it (AuthProof =
// HMAC-SHA256(secret, Label+" client" ‖ na ‖ nd), na the acceptor's nonce,
// nd the dialer's) and the acceptor answers (AuthOK, the same with
// "server"); without secrets the acceptor answers a Keepalive. Only then
// does the link's own traffic flow.
type Handshake struct {
	Spec *Spec
	// Me is this side's hello; Run fills in its version, nonce and
	// FlagAuth (set exactly when Secret is).
	Me     Hello
	Secret []byte
	// Dialer: this side dialled (it proves first); else it accepted.
	Dialer bool
	// Timeout bounds the whole handshake (DefaultHandshakeTimeout when 0).
	Timeout time.Duration
	// Check, when set, is the link's own check of the peer's hello; its
	// error refuses the peer (as CodeOf says, else CodeMismatch).
	Check func(peer *Hello) error
}

// Run runs the handshake on conn, reading through br. It returns both
// hellos; on an error it has written the refusal it owed the peer (the
// caller closes conn). ctx's end stops it.
func (hs *Handshake) Run(ctx context.Context, conn net.Conn, br *bufio.Reader) (me, peer Hello, err error) {
	s := hs.Spec
	me = hs.Me
	me.Version = s.Version
	me.Flags &^= FlagAuth
	if len(hs.Secret) > 0 {
		me.Flags |= FlagAuth
	}
	if _, err := rand.Read(me.Nonce[:]); err != nil {
		return me, peer, err
	}
	t := hs.Timeout
	if t <= 0 {
		t = DefaultHandshakeTimeout
	}
	dl := time.Now().Add(t)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if peer, err = hs.run(conn, br, &me); err != nil {
		return me, peer, err
	}
	if !stop() {
		return me, peer, ctx.Err()
	}
	conn.SetDeadline(time.Time{})
	return me, peer, nil
}

func (hs *Handshake) run(conn net.Conn, br *bufio.Reader, me *Hello) (Hello, error) {
	s := hs.Spec
	refuse := func(code Code, err error) error {
		conn.Write(EncodeError(0, code, err.Error()))
		return err
	}
	if _, err := conn.Write(s.Encode(me)); err != nil {
		return Hello{}, fmt.Errorf("write hello: %w", err)
	}
	// The magic first: a peer of an older, shorter hello (Spec.Legacy) is
	// refused as that version, not as a short read.
	b := make([]byte, HelloSize)
	if _, err := io.ReadFull(br, b[:len(s.Magic)]); err != nil {
		return Hello{}, fmt.Errorf("read hello: %w", err)
	}
	if string(b[:len(s.Magic)]) != s.Magic {
		_, err := s.Parse(b[:len(s.Magic)])
		return Hello{}, refuse(CodeVersion, err)
	}
	if _, err := io.ReadFull(br, b[len(s.Magic):]); err != nil {
		return Hello{}, fmt.Errorf("read hello: %w", err)
	}
	peer, err := s.Parse(b)
	if err != nil {
		return peer, refuse(CodeVersion, err)
	}
	if hs.Check != nil {
		if err := hs.Check(&peer); err != nil {
			code := CodeOf(err)
			if code == CodeInternal {
				code = CodeMismatch
			}
			return peer, refuse(code, err)
		}
	}
	who := fmt.Sprintf("%s %d", s.Noun, peer.Index)
	switch {
	case peer.Auth() && !me.Auth() && hs.Dialer:
		return peer, refuse(CodeAuth, fmt.Errorf("%w: %s requires a secret and this %s has none", ErrAuth, who, s.Noun))
	case peer.Auth() && !me.Auth():
		return peer, refuse(CodeAuth, fmt.Errorf("%w: %s has a secret and this %s none", ErrAuth, who, s.Noun))
	case !peer.Auth() && me.Auth():
		return peer, refuse(CodeAuth, fmt.Errorf("%w: %s does not authenticate; this %s requires a secret", ErrAuth, who, s.Noun))
	}
	na, nd := &me.Nonce, &peer.Nonce
	if hs.Dialer {
		na, nd = nd, na
	}
	proof := func(role string) []byte { return wireauth.MAC(hs.Secret, s.Label, role, na, nd) }
	if hs.Dialer && me.Auth() {
		if _, err := conn.Write(Seal(TypeAuthProof, append(make([]byte, HeaderSize), proof("client")...))); err != nil {
			return peer, fmt.Errorf("write auth proof: %w", err)
		}
	}
	if !hs.Dialer && !me.Auth() {
		if _, err := conn.Write(Seal(TypeKeepalive, make([]byte, HeaderSize))); err != nil {
			return peer, fmt.Errorf("write ready: %w", err)
		}
		return peer, nil
	}
	// The dialer reads the handshake's end (AuthOK or Keepalive), the
	// acceptor the proof; either may be the peer's refusal.
	typ, p, err := ReadFrame(br, nil, Limit)
	if err != nil {
		if hs.Dialer {
			return peer, fmt.Errorf("read the handshake's end: %w", err)
		}
		return peer, refuse(CodeCorrupt, fmt.Errorf("read auth proof: %w", err))
	}
	want := map[bool]byte{true: TypeAuthOK, false: TypeAuthProof}[hs.Dialer]
	switch {
	case typ == TypeError:
		_, code, reason, err := DecodeError(p)
		if err != nil {
			return peer, err
		}
		return peer, &RemoteError{Link: s.Name, Code: code, Reason: reason}
	case hs.Dialer && !me.Auth() && typ == TypeKeepalive:
		return peer, nil
	case typ != want || !me.Auth():
		return peer, refuse(CodeCorrupt, Corruptf("frame type %d where the handshake's end belongs", typ))
	case hs.Dialer && !wireauth.Equal(p, proof("server")):
		return peer, fmt.Errorf("%w: %s's proof is wrong (it does not know the secret)", ErrAuth, who)
	case hs.Dialer:
		return peer, nil
	case !wireauth.Equal(p, proof("client")):
		return peer, refuse(CodeAuth, fmt.Errorf("%w: %s's proof is wrong (another secret?)", ErrAuth, who))
	}
	if _, err := conn.Write(Seal(TypeAuthOK, append(make([]byte, HeaderSize), proof("server")...))); err != nil {
		return peer, fmt.Errorf("write auth ok: %w", err)
	}
	return peer, nil
}

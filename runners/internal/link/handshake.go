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

// Handshake is one end's part in a link's opening (PROTOCOL.md "Shared
// link layer"): hellos both ways, each checked (Spec.Parse, then Check)
// and refused with an Error frame naming why, then the proofs or the
// acceptor's Keepalive.
type Handshake struct {
	Spec *Spec
	// Me is this side's hello; Run sets its version, nonce and FlagAuth.
	Me     Hello
	Secret []byte
	Dialer bool // this side dialled (it proves first)
	// Timeout bounds the whole handshake (10 s when 0).
	Timeout time.Duration
	// Check, when set, is the link's own check of the peer's hello; its
	// error refuses the peer (code as CodeOf says, else CodeMismatch).
	Check func(peer *Hello) error
}

// Run runs the handshake on conn, reading through br, until ctx ends or
// the timeout. It returns both hellos; on an error it has written the
// refusal it owed the peer (the caller closes conn).
func (hs *Handshake) Run(ctx context.Context, conn net.Conn, br *bufio.Reader) (me, peer Hello, err error) {
	me = hs.Me
	me.Version, me.Flags = hs.Spec.Version, me.Flags&^FlagAuth
	if len(hs.Secret) > 0 {
		me.Flags |= FlagAuth
	}
	rand.Read(me.Nonce[:])
	t := hs.Timeout
	if t <= 0 {
		t = 10 * time.Second
	}
	dl := time.Now().Add(t)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if peer, err = hs.run(conn, br, &me); err == nil && !stop() {
		err = ctx.Err()
	}
	conn.SetDeadline(time.Time{})
	return me, peer, err
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
	m := len(s.Magic)
	if _, err := io.ReadFull(br, b[:m]); err != nil {
		return Hello{}, fmt.Errorf("read hello: %w", err)
	}
	if _, err := s.Parse(b[:m]); string(b[:m]) != s.Magic {
		return Hello{}, refuse(CodeVersion, err)
	}
	if _, err := io.ReadFull(br, b[m:]); err != nil {
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
	case peer.Auth() && !me.Auth():
		return peer, refuse(CodeAuth, fmt.Errorf("%w: %s has or requires a secret and this %s has none", ErrAuth, who, s.Noun))
	case !peer.Auth() && me.Auth():
		return peer, refuse(CodeAuth, fmt.Errorf("%w: %s has no secret and this %s has one", ErrAuth, who, s.Noun))
	}
	na, nd := &me.Nonce, &peer.Nonce
	if hs.Dialer {
		na, nd = nd, na
	}
	proof := func(typ byte) []byte {
		role := map[byte]string{TypeAuthProof: "client", TypeAuthOK: "server"}[typ]
		return Seal(typ, append(make([]byte, HeaderSize), wireauth.MAC(hs.Secret, s.Label, role, na, nd)...))
	}
	switch {
	case !me.Auth() && !hs.Dialer:
		if _, err := conn.Write(Seal(TypeKeepalive, make([]byte, HeaderSize))); err != nil {
			return peer, fmt.Errorf("write ready: %w", err)
		}
		return peer, nil
	case hs.Dialer && me.Auth():
		if _, err := conn.Write(proof(TypeAuthProof)); err != nil {
			return peer, fmt.Errorf("write auth proof: %w", err)
		}
	}
	// The dialer reads the handshake's end (AuthOK or Keepalive), the
	// acceptor the proof; either may be the peer's refusal.
	typ, p, err := ReadFrame(br, nil, Limit)
	want := byte(TypeAuthProof)
	if hs.Dialer {
		want = TypeAuthOK
	}
	switch {
	case err != nil:
		return peer, fmt.Errorf("read the handshake's end: %w", err)
	case typ == TypeError:
		_, code, reason, err := DecodeError(p)
		if err == nil {
			err = &RemoteError{Link: s.Name, Code: code, Reason: reason}
		}
		return peer, err
	case !me.Auth() && typ == TypeKeepalive:
		return peer, nil
	case !me.Auth() || typ != want:
		return peer, refuse(CodeCorrupt, Corruptf("frame type %d where the handshake's end belongs", typ))
	case !wireauth.Equal(p, proof(want)[HeaderSize:]):
		return peer, refuse(CodeAuth, fmt.Errorf("%w: %s's proof is wrong (another secret?)", ErrAuth, who))
	case !hs.Dialer:
		if _, err := conn.Write(proof(TypeAuthOK)); err != nil {
			return peer, fmt.Errorf("write auth ok: %w", err)
		}
	}
	return peer, nil
}

package link

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// The two kinds of spec the links use: one without a backend whose group
// is only the ring (the stage link's), one with both (the tensor link's).
var (
	ringSpec = Spec{Name: "test link", Noun: "stage", Magic: "EXOTESTL", Version: 2, Flags: FlagAuth | FlagGroup, Label: "exo-test/2"}
	fullSpec = Spec{Name: "full link", Noun: "rank", Magic: "EXOFULL\x03", Version: 3, Flags: FlagAuth | FlagGroup | FlagKinds,
		Backend: true, Label: "exo-full/3", Legacy: func(head []byte) error {
			if string(head[:4]) == "EXOF" && head[4] < 3 {
				return fmt.Errorf("%w: old %d", ErrVersion, head[4])
			}
			return nil
		}}
)

func testLimits(typ byte) (int, int, bool) {
	if typ == 3 {
		return 1, 64, true
	}
	return Limit(typ)
}

func sampleFrames() [][]byte {
	return [][]byte{
		Seal(3, append(make([]byte, HeaderSize), "payload"...)),
		Seal(TypeKeepalive, make([]byte, HeaderSize)),
		Seal(TypeAuthProof, make([]byte, HeaderSize+32)),
		EncodeError(7, CodeMismatch, "rank 1 runs backend cpu"),
		EncodeError(0, CodeInternal, strings.Repeat("x", 2*MaxReason)),
	}
}

// TestReadFrame: every sealed frame reads back; a flipped bit anywhere, a
// truncation, an oversize or undersize length, reserved bits and an
// unknown type all fail closed.
func TestReadFrame(t *testing.T) {
	for _, b := range sampleFrames() {
		typ, p, err := ReadFrame(bytes.NewReader(b), nil, testLimits)
		if err != nil || typ != b[0] || !bytes.Equal(p, b[HeaderSize:]) {
			t.Fatalf("%x: %d %x %v", b[:HeaderSize], typ, p, err)
		}
		for i := range b {
			for _, bit := range []byte{1, 0x80} {
				c := bytes.Clone(b)
				c[i] ^= bit
				if _, _, err := ReadFrame(bytes.NewReader(c), nil, testLimits); err == nil {
					t.Fatalf("type %d: byte %d bit %#x flipped: read", b[0], i, bit)
				}
			}
		}
		if _, _, err := ReadFrame(bytes.NewReader(b[:len(b)-1]), nil, testLimits); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("type %d truncated: %v", b[0], err)
		}
	}
	for _, b := range [][]byte{
		Seal(3, make([]byte, HeaderSize)),                      // under the type's least
		Seal(3, make([]byte, HeaderSize+65)),                   // over its most
		Seal(4, make([]byte, HeaderSize+1)),                    // unknown type
		Seal(TypeAuthOK, make([]byte, HeaderSize+31)),          // auth is exactly 32
		Seal(TypeError, make([]byte, HeaderSize+13+MaxReason)), // reason over the limit
	} {
		if _, _, err := ReadFrame(bytes.NewReader(b), nil, testLimits); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%x: %v, want ErrCorrupt", b[:HeaderSize], err)
		}
	}
	// A length past the limit fails before the payload is waited for.
	h := Header(3, make([]byte, 1<<20))
	if _, _, err := ReadFrame(bytes.NewReader(h[:]), nil, testLimits); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a 1 MiB header alone: %v, want ErrCorrupt", err)
	}
	_, code, reason, err := DecodeError(sampleFrames()[4][HeaderSize:])
	if err != nil || code != CodeInternal || len(reason) != MaxReason {
		t.Errorf("a long reason: %v %d bytes %v", code, len(reason), err)
	}
}

// FuzzFrame: ReadFrame and DecodeError never panic, and whatever they
// accept seals back to the same bytes.
func FuzzFrame(f *testing.F) {
	for _, b := range sampleFrames() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, p, err := ReadFrame(bytes.NewReader(b), nil, testLimits)
		if err != nil {
			return
		}
		if got := Seal(typ, append(make([]byte, HeaderSize), p...)); !bytes.Equal(got, b[:len(got)]) {
			t.Fatalf("resealed %x, read from %x", got, b)
		}
		if typ != TypeError {
			return
		}
		ticket, code, reason, err := DecodeError(p)
		if err != nil {
			return
		}
		if got := EncodeError(ticket, code, reason); !bytes.Equal(got, b[:len(got)]) {
			t.Fatalf("error frame re-encoded %x, read from %x", got, b)
		}
	})
}

// FuzzHello: Parse never panics, and accepts only what encodes back to
// the same bytes, with either spec.
func FuzzHello(f *testing.F) {
	ring, _ := GroupFlags("ring")
	nccl, _ := GroupFlags("nccl")
	f.Add(ringSpec.Encode(&Hello{Version: 2, Flags: FlagAuth | ring, Index: 1, Count: 3, First: 4, End: 8}))
	f.Add(fullSpec.Encode(&Hello{Version: 3, Flags: nccl, Index: 3, Count: 4, Backend: "mlx-gpu"}))
	f.Add(fullSpec.Encode(&Hello{Version: 3, Flags: FlagAuth, Index: 0, Count: 2, Backend: "cpu"}))
	f.Add([]byte("EXOF\x02\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, s := range []*Spec{&ringSpec, &fullSpec} {
			h, err := s.Parse(b)
			if err == nil && !bytes.Equal(s.Encode(&h), b) {
				t.Fatalf("%s: hello %x parsed as %+v, encodes as %x", s.Name, b, h, s.Encode(&h))
			}
			if err != nil && !errors.Is(err, ErrVersion) {
				t.Fatalf("%s: %x: %v, want ErrVersion", s.Name, b, err)
			}
		}
	})
}

// TestParseHello: what each spec refuses.
func TestParseHello(t *testing.T) {
	jaccl, _ := GroupFlags("jaccl")
	ok := fullSpec.Encode(&Hello{Version: 3, Flags: jaccl, Index: 1, Count: 2, Backend: "mlx-gpu"})
	if h, err := fullSpec.Parse(ok); err != nil || h.Group() != "jaccl" || h.Backend != "mlx-gpu" {
		t.Fatalf("%+v %v", h, err)
	}
	mod := func(f func(b []byte)) []byte { b := bytes.Clone(ok); f(b); return b }
	for _, tc := range []struct {
		what string
		spec *Spec
		b    []byte
		want string
	}{
		{"another version", &fullSpec, mod(func(b []byte) { b[8] = 4 }), "the peer speaks full link version 4, this side 3"},
		{"a legacy peer", &fullSpec, []byte("EXOF\x02..."), "old 2"},
		{"another magic", &fullSpec, mod(func(b []byte) { b[0] = 'X' }), "not a full link peer"},
		{"short", &fullSpec, ok[:95], "a hello of 95 bytes"},
		{"kind 3", &fullSpec, mod(func(b []byte) { b[10] |= 3 << 2 }), "reserved hello bits"},
		{"a kind without GROUP", &fullSpec, mod(func(b []byte) { b[10] &^= FlagGroup }), "reserved hello bits"},
		{"an unknown flag", &fullSpec, mod(func(b []byte) { b[11] = 1 }), "reserved hello bits"},
		{"a bad backend", &fullSpec, mod(func(b []byte) { b[88] = 'A' }), "bad backend name"},
		{"bytes after the backend's NUL", &fullSpec, mod(func(b []byte) { b[91] = 0 }), "bad backend name"},
		{"a kind on a ring-only link", &ringSpec, ringSpec.Encode(&Hello{Version: 2, Flags: jaccl}), "reserved hello bits"},
		{"a backend where the link has none", &ringSpec, ringSpec.Encode(&Hello{Version: 2, Backend: "cpu"}), "reserved hello bytes"},
	} {
		if _, err := tc.spec.Parse(tc.b); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrVersion saying %q", tc.what, err, tc.want)
		}
	}
	if _, err := GroupFlags("mpi"); err == nil {
		t.Error("GroupFlags took an unknown group")
	}
}

// pair runs a dialer's and an acceptor's handshake over real TCP.
func pair(t *testing.T, d, a *Handshake) (dp, ap Hello, derr, aerr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		h   Hello
		err error
	}
	done := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- res{err: err}
			return
		}
		defer c.Close()
		_, p, err := a.Run(context.Background(), c, bufio.NewReader(c))
		done <- res{p, err}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, dp, derr = d.Run(context.Background(), c, bufio.NewReader(c))
	c.Close()
	r := <-done
	return dp, r.h, derr, r.err
}

// TestHandshake: secrets, groups and the links' own checks, both ends
// over real TCP; every refusal reaches both ends as its sentinel.
func TestHandshake(t *testing.T) {
	ring, _ := GroupFlags("ring")
	nccl, _ := GroupFlags("nccl")
	differ := errors.New("differs")
	for _, tc := range []struct {
		what           string
		dsec, asec     string
		dflags, aflags uint16
		dcheck, acheck bool // the dialer's (acceptor's) Check refuses
		wantD, wantA   error
		group          string
	}{
		{what: "no secrets", group: ""},
		{what: "one secret", dsec: "s", asec: "s", dflags: ring, aflags: ring, group: "ring"},
		{what: "ring and none", dflags: ring, group: ""},
		{what: "ring and nccl", dsec: "s", asec: "s", dflags: ring, aflags: nccl, group: ""},
		{what: "other secrets", dsec: "a", asec: "b", wantD: ErrAuth, wantA: ErrAuth},
		{what: "dialer without", asec: "b", wantD: ErrAuth, wantA: ErrAuth},
		{what: "acceptor without", dsec: "a", wantD: ErrAuth, wantA: ErrAuth},
		// Without secrets the acceptor has ended its handshake before the
		// dialer's refusal comes (its next read gets it); with them it
		// reads the refusal in place of the proof.
		{what: "the dialer's check", dsec: "s", asec: "s", dcheck: true, wantD: differ, wantA: ErrMismatch},
		{what: "the acceptor's check", acheck: true, wantD: ErrMismatch, wantA: differ},
	} {
		t.Run(tc.what, func(t *testing.T) {
			check := func(refuse bool) func(*Hello) error {
				if !refuse {
					return nil
				}
				return func(*Hello) error { return fmt.Errorf("the peer %w", differ) }
			}
			d := &Handshake{Spec: &fullSpec, Me: Hello{Index: 1, Count: 2, Flags: tc.dflags, Backend: "cpu"}, Secret: []byte(tc.dsec), Dialer: true, Check: check(tc.dcheck)}
			a := &Handshake{Spec: &fullSpec, Me: Hello{Index: 0, Count: 2, Flags: tc.aflags, Backend: "mlx-cpu"}, Secret: []byte(tc.asec), Check: check(tc.acheck)}
			dp, ap, derr, aerr := pair(t, d, a)
			if !errors.Is(derr, tc.wantD) || tc.wantD == nil && derr != nil {
				t.Errorf("dialer: %v, want %v", derr, tc.wantD)
			}
			if !errors.Is(aerr, tc.wantA) || tc.wantA == nil && aerr != nil {
				t.Errorf("acceptor: %v, want %v", aerr, tc.wantA)
			}
			if tc.wantD != nil {
				return
			}
			if dp.Backend != "mlx-cpu" || ap.Backend != "cpu" || dp.Index != 0 || ap.Index != 1 || dp.Auth() != (tc.asec != "") {
				t.Errorf("hellos: dialer saw %+v, acceptor %+v", dp, ap)
			}
			me := Hello{Flags: tc.dflags}
			if g, _ := Agree(&me, &dp); g != tc.group {
				t.Errorf("agreed on %q, want %q", g, tc.group)
			}
		})
	}
}

// TestHandshakeBounded: a peer that says nothing, or a cancelled
// context, ends the handshake at its deadline, not later.
func TestHandshakeBounded(t *testing.T) {
	for _, tc := range []struct {
		what    string
		timeout time.Duration
		cancel  bool
	}{{"timeout", 50 * time.Millisecond, false}, {"cancelled", time.Hour, true}} {
		silent := testutil.Peer(t, func(c net.Conn) { io.Copy(io.Discard, c) }) // writes nothing
		c, err := net.Dial("tcp", silent)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if tc.cancel {
			cancel()
		}
		hs := &Handshake{Spec: &ringSpec, Dialer: true, Timeout: tc.timeout}
		_, _, err = hs.Run(ctx, c, bufio.NewReader(c))
		var ne net.Error
		if err == nil || !(errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.Canceled)) {
			t.Errorf("%s: %v, want a timeout", tc.what, err)
		}
		cancel()
		c.Close()
	}
}

// TestLegacyPeer: a peer of an older, shorter hello is refused as that
// version, not as a short read.
func TestLegacyPeer(t *testing.T) {
	legacy := testutil.Peer(t, func(c net.Conn) {
		c.Write([]byte("EXOF\x02\x01\x00\x02"))
		io.Copy(io.Discard, c)
	})
	c, err := net.Dial("tcp", legacy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hs := &Handshake{Spec: &fullSpec, Dialer: true}
	if _, _, err := hs.Run(context.Background(), c, bufio.NewReader(c)); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "old 2") {
		t.Fatalf("%v, want the legacy refusal", err)
	}
}

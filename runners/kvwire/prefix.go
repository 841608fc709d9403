package kvwire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
)

// Prefix probes (PROTOCOL.md §18): before choosing among prefill hosts the
// decode side may ask each how many leading tokens of a prompt it already
// holds in its prefix cache. A server advertises that it answers them
// with Hello flag bit 1; the probe is a Request with bit 0 of its byte 2
// set, and the answer a single Prefix frame (or an Error), after which
// the server closes. Nothing is computed or queued for a probe.

const (
	prefixSize         = 8 // Prefix payload: u32 tokens held, u32 reserved
	reqFlagPrefixProbe = 1 // Request byte 2
)

// PrefixProber is implemented by a Producer that can tell, without
// computing anything, how many leading tokens of req.Tokens it holds
// (0 ≤ n ≤ len(req.Tokens)). Errors wrap ErrMismatch (another model or
// fingerprint) or ErrBadRequest. A Server whose Producer implements it
// advertises prefix probes in its Hello.
type PrefixProber interface {
	CachedPrefix(ctx context.Context, req *Request) (int, error)
}

// ErrNoPrefixProbe is returned by Client.PrefixHit for a server that does
// not answer prefix probes (an older server, or one without a prefix
// cache): the caller assumes no hit.
var ErrNoPrefixProbe = errors.New("kvwire: server does not answer prefix probes")

func encodePrefix(held int) []byte {
	var p [prefixSize]byte
	le.PutUint32(p[0:4], uint32(held))
	return smallFrame(framePrefix, p[:])
}

// parsePrefix decodes a Prefix payload for a probe of n tokens.
func parsePrefix(p []byte, n int) (int, error) {
	if len(p) != prefixSize {
		return 0, corruptf("prefix frame of %d bytes, want %d", len(p), prefixSize)
	}
	if le.Uint32(p[4:8]) != 0 {
		return 0, corruptf("prefix frame: non-zero reserved bytes")
	}
	held := le.Uint32(p[0:4])
	if uint64(held) > uint64(n) {
		return 0, corruptf("prefix frame: %d tokens held of a %d-token prompt", held, n)
	}
	return int(held), nil
}

// servePrefix answers a prefix probe: one Prefix or Error frame.
func (s *Server) servePrefix(ctx context.Context, conn net.Conn, req *Request, log *slog.Logger) {
	var frame []byte
	pp, ok := s.cfg.Producer.(PrefixProber)
	held := 0
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("%w: this server does not answer prefix probes", ErrBadRequest)
	case req.StartPos != 0 || req.Streams > 1:
		err = fmt.Errorf("%w: a prefix probe has no start_pos and no streams", ErrBadRequest)
	default:
		held, err = pp.CachedPrefix(ctx, req)
		if err == nil && (held < 0 || held > len(req.Tokens)) {
			err = fmt.Errorf("%w: producer says %d tokens held of %d", ErrRemoteInternal, held, len(req.Tokens))
		}
	}
	if err != nil {
		log.Info("kvwire: prefix probe refused", "err", err)
		frame = encodeError(errorCode(err), err.Error())
	} else {
		log.Debug("kvwire: prefix probe", "held", held)
		frame = encodePrefix(held)
	}
	conn.SetWriteDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	conn.Write(frame)
	lingerClose(conn)
}

// PrefixHit asks the server at addr how many leading tokens of
// req.Tokens it holds in its prefix cache (req: Model, Fingerprint, Tokens
// and ID as for Fetch; StartPos 0). A server that does not advertise
// prefix probes gives ErrNoPrefixProbe without being sent anything. The
// whole exchange is bounded by ctx and the client's ConnectTimeout and
// IdleTimeout.
func (c *Client) PrefixHit(ctx context.Context, addr string, req *Request) (int, error) {
	q := *req
	q.PrefixProbe, q.StartPos, q.Streams, q.DType, q.Deadline = true, 0, 0, 0, 0
	frame, err := encodeRequest(&q)
	if err != nil {
		return 0, err
	}
	var st Stats
	conn, br, err := c.connect(ctx, addr, &st)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if st.serverFlags&flagPrefixProbe == 0 {
		return 0, ErrNoPrefixProbe
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	conn.SetDeadline(time.Now().Add(c.cfg.IdleTimeout))
	if _, err := conn.Write(frame); err != nil {
		return 0, c.netErr(ctx, fmt.Errorf("write prefix probe: %w", err))
	}
	f := readFrame(br, nil, c.cfg.Limits)
	if f.err != nil {
		return 0, c.netErr(ctx, fmt.Errorf("read prefix answer: %w", f.err))
	}
	if err := f.check(); err != nil {
		return 0, err
	}
	switch f.typ {
	case framePrefix:
		return parsePrefix(f.payload, len(q.Tokens))
	case frameError:
		return 0, parseError(f.payload)
	}
	return 0, corruptf("frame type %d where a prefix answer belongs", f.typ)
}

package e2e

import (
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// joinProxy forwards loopback TCP connections to a KV-wire target and can
// drop one secondary connection of a striped transfer (PROTOCOL.md §17):
// it recognizes a secondary by the Join frame (type 11) right after the
// client's 40-byte Hello (no secret in these tests), and closes the
// cutNth such connection once cutAfter bytes have gone back through it.
type joinProxy struct {
	l        net.Listener
	target   string
	cutNth   int32 // 1-based; 0: never
	cutAfter int64
	joins    atomic.Int32
	cut      atomic.Bool
	wg       sync.WaitGroup
}

func newJoinProxy(t *testing.T, target string) *joinProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &joinProxy{l: l, target: target}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.handle(c)
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *joinProxy) addr() string { return p.l.Addr().String() }

func (p *joinProxy) handle(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	nth := make(chan int32, 1)
	go func() {
		// Client → server: the Hello and the first frame header tell a
		// secondary's Join apart from a Request or a ping.
		// The Hello goes through first: the client waits for the server's.
		head := make([]byte, 41)
		n, _ := io.ReadFull(c, head[:40])
		s.Write(head[:n])
		k := int32(0)
		if n == 40 {
			if m, _ := io.ReadFull(c, head[40:]); m == 1 {
				if head[40] == 11 {
					k = p.joins.Add(1)
				}
				s.Write(head[40:])
			}
		}
		nth <- k
		io.Copy(s, c)
		s.(*net.TCPConn).CloseWrite()
	}()
	var cut bool
	var seen int64
	buf := make([]byte, 16<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if seen == 0 || (!cut && len(nth) > 0) {
				select {
				case k := <-nth:
					cut = k != 0 && k == p.cutNth
				default:
				}
			}
			if cut && seen+int64(n) >= p.cutAfter {
				c.Write(buf[:p.cutAfter-seen])
				p.cut.Store(true)
				return // both directions closed: a dropped connection
			}
			seen += int64(n)
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestStripedRemoteEqualsLocal: a decode runner with --kv-streams 4 gets
// its prompt KV over four connections and generates the same text as a
// runner that prefills locally; with one of those connections dropped in
// the middle of a transfer, the transfer fails closed and the request
// still gets the same text by local prefill.
func TestStripedRemoteEqualsLocal(t *testing.T) {
	dir := tinyModel(t, "main")
	pre := start(t, "prefill", "prefill", "--model", dir, "--prefill-chunk", "64", "--prefix-cache-mib", "0")
	ref := start(t, "decode-local", "decode", "--model", dir)
	px := newJoinProxy(t, pre.listen)
	dec := start(t, "decode-streams", "decode", "--model", dir, "--prefill", px.addr(), "--kv-streams", "4")

	for i, n := range []int{125, 830} {
		m := user(words(300+i, n))
		before := dec.metric(t, outcome("ok"))
		joins := px.joins.Load()
		got := chatStream(t, dec.listen, m, genTokens, ignoreEOS)
		want := chatStream(t, ref.listen, m, genTokens, ignoreEOS)
		expectSame(t, "striped", got, want)
		if dec.metric(t, outcome("ok")) != before+1 {
			t.Fatalf("%d words: not prefilled remotely; last outcome %q", n, dec.lastOutcome())
		}
		if d := px.joins.Load() - joins; d != 3 {
			t.Fatalf("%d words: %d secondary connections joined, want 3", n, d)
		}
	}
	fourStreams := func() bool {
		return slices.ContainsFunc(pre.records("kvwire: sent"), func(r testutil.Record) bool { return r["streams"] == "4" })
	}
	if !testutil.Until(5*time.Second, fourStreams) { // the record follows the stream's end
		t.Fatalf("the prefill runner never logged a 4-stream transfer:\n%s", tail(pre.logs(), 3000))
	}

	t.Run("one connection dropped mid-transfer", func(t *testing.T) {
		m := user(words(99, 830))
		want := chatStream(t, ref.listen, m, genTokens, ignoreEOS)
		px.cutNth = px.joins.Load() + 2 // the second secondary of the next transfer
		px.cutAfter = 3000              // past its Hello, inside its chunks
		before := dec.metric(t, outcome("fallback_error"))
		got := chatStream(t, dec.listen, m, genTokens, ignoreEOS)
		expectSame(t, "dropped stream", got, want)
		if !px.cut.Load() {
			t.Fatal("the proxy dropped no connection")
		}
		t.Logf("decode runner log tail:\n%s", tail(dec.logs(), 1500))
		if after := dec.metric(t, outcome("fallback_error")); after != before+1 {
			t.Fatalf("fallback_error %v → %v; last outcome %q", before, after, dec.lastOutcome())
		}
	})
}

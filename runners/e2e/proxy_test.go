package e2e

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy forwards loopback TCP connections to a target. On the way back
// (server → client) it can flip one byte at a given offset of each
// connection, or call onBytes once the server has sent more than a given
// number of bytes (to kill the server mid-stream).
type proxy struct {
	l       net.Listener
	target  string
	flipAt  int64 // byte offset to flip in server→client data; <0 none
	trigger int64 // call onTrigger once this many bytes went server→client; <=0 none
	onTrig  func()
	// cut stops forwarding at trigger: a short stream (a sliding model's
	// windows) can be in the socket buffers whole before the kill lands.
	cut      bool
	trigOnce sync.Once
	flipped  atomic.Int64
	wg       sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, flipAt: -1}
	go p.accept()
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *proxy) handle(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		_, _ = io.Copy(s, c)
		s.(*net.TCPConn).CloseWrite()
	}()
	buf := make([]byte, 32<<10)
	var off int64
	for {
		n, err := s.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if p.cut && p.trigger > 0 && off+int64(n) >= p.trigger {
				_, _ = c.Write(chunk[:p.trigger-off])
				if p.onTrig != nil {
					p.trigOnce.Do(p.onTrig)
				}
				return
			}
			if p.flipAt >= off && p.flipAt < off+int64(n) {
				chunk[p.flipAt-off] ^= 0x10
				p.flipped.Add(1)
			}
			off += int64(n)
			if _, werr := c.Write(chunk); werr != nil {
				return
			}
			if p.trigger > 0 && off >= p.trigger && p.onTrig != nil {
				p.trigOnce.Do(p.onTrig)
			}
		}
		if err != nil {
			return
		}
	}
}

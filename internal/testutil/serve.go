package testutil

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// serveWait bounds how long a test's cleanup waits for a server or a
// scripted peer to return once told to stop.
const serveWait = 30 * time.Second

// Serve runs serve (a server's Serve(ctx, listener) method) on a fresh
// 127.0.0.1 listener until ctx is done or the test ends, and returns the
// listener's address. At cleanup it cancels serve's context and waits for
// it to return: an error, or no return within 30 s, fails the test.
// Cleanups the caller registers later run first (stop a server's clients
// there).
func Serve(t testing.TB, ctx context.Context, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve %s: %v", l.Addr(), err)
			}
		case <-time.After(serveWait):
			t.Errorf("serve %s did not return %v after its context ended", l.Addr(), serveWait)
		}
	})
	return l.Addr().String()
}

// Peer accepts one connection on a fresh 127.0.0.1 listener and runs
// script on it, then closes it: a scripted peer for the tests of a
// protocol's other side (an old version's hello, a silent server). It
// returns the listener's address. At cleanup the listener and the
// connection are closed (so a script blocked on the connection returns)
// and Peer waits for script, at most 30 s.
func Peer(t testing.TB, script func(c net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		conn   net.Conn
		closed bool
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		mu.Lock()
		conn = c
		stop := closed
		mu.Unlock()
		if !stop {
			script(c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		if conn != nil {
			conn.Close()
		}
		mu.Unlock()
		select {
		case <-done:
		case <-time.After(serveWait):
			t.Errorf("the peer's script on %s did not return %v after its connection closed", l.Addr(), serveWait)
		}
	})
	return l.Addr().String()
}

// Package kvwiretest serves a KV wire Producer on loopback TCP for the tests
// of the packages on either side of the KV wire (decode, prefill, tensor),
// as net/http/httptest does for HTTP handlers. It is test support only: no
// runtime package may import it, and it must not import anything of exo's
// but runners/kvwire (so that those packages' own tests can use it).
package kvwiretest

import (
	"context"
	"net"
	"testing"

	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// Serve serves p over the KV wire (the default server config) on a fresh
// 127.0.0.1 port until ctx is done or the test ends, and returns the
// address.
func Serve(t testing.TB, ctx context.Context, p kvwire.Producer) string {
	t.Helper()
	srv, err := kvwire.NewServer(kvwire.ServerConfig{Producer: p})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go srv.Serve(ctx, l)
	return l.Addr().String()
}

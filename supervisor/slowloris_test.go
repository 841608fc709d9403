package supervisor

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/gateway"
)

// slowloris opens n connections to addr that each send the start of a
// request's headers and never finish them.
func slowloris(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nX-Slow-%d: ", addr, i)
		conns = append(conns, c)
	}
	return conns
}

// waitAllClosed waits until the server has closed every connection (a
// read ends) or limit passes, and returns how many it closed.
func waitAllClosed(conns []net.Conn, limit time.Duration) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	closed := 0
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(limit))
			_, err := io.Copy(io.Discard, c) // the server may answer 408 first
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				mu.Lock()
				closed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return closed
}

// TestSlowlorisAgainstTheGateway: 300 connections that never finish their
// headers do not stop the gateway from serving others, and each is closed
// at the header deadline.
func TestSlowlorisAgainstTheGateway(t *testing.T) {
	h := startOpts(t, clusterFile(freePort(t), "a=src-a"), 0, true, func(o *Options) { o.ReadHeaderTimeout = time.Second })
	t0 := time.Now()
	conns := slowloris(t, h.api, 300)
	for i := range 5 {
		resp, err := http.Post("http://"+h.api+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"a","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatalf("request %d during the attack: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d during the attack: %s", i, resp.Status)
		}
	}
	if n := waitAllClosed(conns, 15*time.Second); n != len(conns) {
		t.Fatalf("%d of %d slow connections closed", n, len(conns))
	}
	t.Logf("all %d slow connections closed %v after they opened", len(conns), time.Since(t0))
}

// TestHeaderBoundAtTheGateway: a request whose headers pass
// gateway.MaxHeaderBytes is answered 431 by the gateway's server before
// any handler (the auth, the forwarding) runs; large but bounded headers
// are forwarded and answered. 1 MB of headers, which Go's 1 MiB default
// let through, is 431.
func TestHeaderBoundAtTheGateway(t *testing.T) {
	h := start(t, clusterFile(freePort(t), "a=src-a"))
	for _, tc := range []struct {
		name  string
		bytes int
		want  int
	}{
		{"32 KiB", 32 << 10, 200},
		{"just under the bound", gateway.MaxHeaderBytes - 2048, 200},
		{"past the bound and its slack", gateway.MaxHeaderBytes + 8<<10, 431},
		{"1 MB", 1 << 20, 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", "http://"+h.api+"/v1/chat/completions", strings.NewReader(`{"model":"a","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Big", strings.Repeat("a", tc.bytes))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d bytes of header: %s, want %d", tc.bytes, resp.Status, tc.want)
			}
		})
	}
}

package testutil

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	var n atomic.Int32
	cases := []struct {
		name string
		cond func() bool
		want bool
	}{
		{"at once", func() bool { return true }, true},
		{"after three polls", func() bool { return n.Add(1) >= 3 }, true},
		{"never", func() bool { return false }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Until(20*time.Millisecond, tc.cond); got != tc.want {
				t.Fatalf("Until = %v, want %v", got, tc.want)
			}
		})
	}
}

// fakeTB records a failure instead of ending the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = format
}

func TestEventually(t *testing.T) {
	f := &fakeTB{TB: t}
	Eventually(f, func() bool { return true }, time.Second, "never shown")
	if f.failed != "" {
		t.Fatalf("a condition that held failed the test: %q", f.failed)
	}
	Eventually(f, func() bool { return false }, time.Millisecond, "the %s", "thing")
	if f.failed == "" {
		t.Fatal("a condition that never held did not fail the test")
	}
}

func TestParseRecord(t *testing.T) {
	// What slog.TextHandler writes, attributes in any order.
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, nil))
	log.Info("route decision", "req", "m-3", "route", "remote", "endpoint", "127.0.0.1:9", "hits", map[string]int{"a": 1},
		"why", `a "quoted" reason = this`, "empty", "")
	log.Warn("plain")
	b.WriteString("panic: not a record\n\ngoroutine 1 [running]:\n")
	recs := Records(b.String(), "")
	if len(recs) != 2 {
		t.Fatalf("%d records in %q, want 2", len(recs), b.String())
	}
	r := recs[0]
	for k, want := range map[string]string{"level": "INFO", "msg": "route decision", "req": "m-3", "route": "remote",
		"endpoint": "127.0.0.1:9", "hits": "map[a:1]", "why": `a "quoted" reason = this`, "empty": ""} {
		if got, ok := r[k]; !ok || got != want {
			t.Errorf("%s = %q (present %v), want %q", k, got, ok, want)
		}
	}
	if got := Records(b.String(), "plain"); len(got) != 1 || got[0]["level"] != "WARN" {
		t.Errorf("Records(plain) = %v", got)
	}
	for _, bad := range []string{"", "goroutine 1 [running]:", `msg="unterminated`, "no equals here"} {
		if _, ok := ParseRecord(bad); ok {
			t.Errorf("ParseRecord(%q) ok", bad)
		}
	}
}

// TestPorts: the block is free (each port can be bound) and lies where the
// kernel hands out no port of its own.
func TestPorts(t *testing.T) {
	lo, hi := portRange()
	for range 20 {
		base := Ports(t, 10)
		if base < lo || base+10 > hi {
			t.Fatalf("Ports = %d, outside [%d, %d)", base, lo, hi)
		}
		for p := base; p < base+10; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				t.Fatalf("port %d of the block: %v", p, err)
			}
			l.Close()
		}
	}
	if a := Addr(t); !strings.HasPrefix(a, "127.0.0.1:") {
		t.Fatalf("Addr = %q", a)
	}
}

// TestPortRange: Ports never picks inside the ephemeral range.
func TestPortRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range")
	}
	var elo, ehi int
	if _, err := fmt.Sscan(string(b), &elo, &ehi); err != nil {
		t.Fatal(err)
	}
	lo, hi := portRange()
	if lo <= ehi && hi > elo {
		t.Fatalf("portRange [%d, %d) overlaps the ephemeral range [%d, %d]", lo, hi, elo, ehi)
	}
}

// skipTB records a skip or a failure instead of ending the test.
type skipTB struct {
	testing.TB
	skipped, failed string
}

func (f *skipTB) Helper()                           {}
func (f *skipTB) Skip(args ...any)                  { f.skipped = fmt.Sprint(args...) }
func (f *skipTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

// TestMissing: a missing dependency skips the test, and fails it under
// $EXO_REQUIRE_TEST_DEPS (set by scripts/run-tests); "0" is off.
func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		env        string
		skip, fail bool
	}{{"", true, false}, {"0", true, false}, {"1", false, true}, {"yes", false, true}} {
		t.Run("env="+tc.env, func(t *testing.T) {
			t.Setenv(RequireEnv, tc.env)
			f := &skipTB{TB: t}
			Missing(f, "python3 cannot import %s", "anthropic")
			if (f.skipped != "") != tc.skip || (f.failed != "") != tc.fail {
				t.Fatalf("skipped %q failed %q; want skip %v fail %v", f.skipped, f.failed, tc.skip, tc.fail)
			}
			if got := f.skipped + f.failed; !strings.Contains(got, "python3 cannot import anthropic") {
				t.Errorf("message %q does not say what is missing", got)
			}
			if tc.fail && !strings.Contains(f.failed, RequireEnv) {
				t.Errorf("failure %q does not name %s", f.failed, RequireEnv)
			}
		})
	}
}

// TestServe: the server gets a listener whose address Serve returns and
// runs until the test ends; then its context is done and an error it
// returns fails the test.
func TestServe(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{{"clean", nil}, {"error", fmt.Errorf("boom")}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &cleanTB{TB: t}
			stopped := make(chan struct{})
			addr := Serve(f, context.Background(), func(ctx context.Context, l net.Listener) error {
				go func() { <-ctx.Done(); l.Close() }()
				for {
					c, err := l.Accept()
					if err != nil {
						close(stopped)
						return tc.err
					}
					c.Write([]byte("hi"))
					c.Close()
				}
			})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(c)
			c.Close()
			if string(b) != "hi" {
				t.Fatalf("read %q from the server", b)
			}
			select {
			case <-stopped:
				t.Fatal("the server stopped before the test ended")
			default:
			}
			f.cleanup()
			<-stopped
			if (f.errored != "") != (tc.err != nil) {
				t.Errorf("serve returned %v; the test's error: %q", tc.err, f.errored)
			}
		})
	}
}

// TestPeer: the script gets the one connection a client opens; a script
// still blocked on it when the test ends returns, as the connection is
// closed.
func TestPeer(t *testing.T) {
	f := &cleanTB{TB: t}
	got := make(chan string, 1)
	returned := false
	addr := Peer(f, func(c net.Conn) {
		c.Write([]byte("EXO\x01"))
		b := make([]byte, 1)
		io.ReadFull(c, b)
		got <- string(b)
		io.Copy(io.Discard, c) // blocks until the cleanup closes c
		returned = true
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "EXO\x01" {
		t.Fatalf("read %q: %v", b, err)
	}
	c.Write([]byte("x"))
	if s := <-got; s != "x" {
		t.Errorf("script read %q", s)
	}
	f.cleanup() // returns once the script has
	if !returned || f.errored != "" {
		t.Errorf("script returned %v; the test's error: %q", returned, f.errored)
	}
}

// cleanTB runs the cleanups registered on it when the test calls cleanup,
// and records an error instead of failing the test.
type cleanTB struct {
	testing.TB
	fns     []func()
	errored string
}

func (f *cleanTB) Helper()                           {}
func (f *cleanTB) Cleanup(fn func())                 { f.fns = append(f.fns, fn) }
func (f *cleanTB) Errorf(format string, args ...any) { f.errored = fmt.Sprintf(format, args...) }
func (f *cleanTB) cleanup() {
	for i := len(f.fns) - 1; i >= 0; i-- {
		f.fns[i]()
	}
}

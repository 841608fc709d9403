package sdnotify

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listen makes a real unixgram NOTIFY_SOCKET and returns a reader of its datagrams.
func listen(t *testing.T) func() string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return func() string {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("read notify socket: %v", err)
		}
		return string(buf[:n])
	}
}

func TestMessages(t *testing.T) {
	read := listen(t)
	n := New(nil)
	n.Ready("2 runners ready\n(all)")
	if got := read(); got != "READY=1\nSTATUS=2 runners ready (all)" {
		t.Errorf("ready = %q", got)
	}
	n.Reloading()
	got := read()
	lines := strings.Split(got, "\n")
	if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
		t.Fatalf("reloading = %q", got)
	}
	if us, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64); err != nil || us <= 0 {
		t.Errorf("MONOTONIC_USEC not a positive integer: %q", lines[1])
	}
	n.Ready("reloaded")
	if got := read(); got != "READY=1\nSTATUS=reloaded" {
		t.Errorf("ready after reload = %q", got)
	}
	n.Status("config error: f.toml:3:1: bad")
	if got := read(); got != "STATUS=config error: f.toml:3:1: bad" {
		t.Errorf("status = %q", got)
	}
	n.ExtendTimeout(90 * time.Second)
	if got := read(); got != "EXTEND_TIMEOUT_USEC=90000000" {
		t.Errorf("extend = %q", got)
	}
	n.Stopping()
	if got := read(); got != "STOPPING=1" {
		t.Errorf("stopping = %q", got)
	}
}

func TestWatchdogCadence(t *testing.T) {
	read := listen(t)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	if got := WatchdogInterval(); got != 100*time.Millisecond {
		t.Fatalf("interval = %v, want half of WatchdogSec", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { New(nil).RunWatchdog(ctx, nil); close(done) }()
	for i := 0; i < 3; i++ {
		if got := read(); got != "WATCHDOG=1" {
			t.Errorf("ping %d = %q", i, got)
		}
	}
	cancel()
	<-done
}

func TestWatchdogWithheldWhenNotAlive(t *testing.T) {
	read := listen(t)
	t.Setenv("WATCHDOG_USEC", "100000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, markerSent := make(chan struct{}), make(chan struct{})
	calls := 0
	alive := func() bool { // runs on the watchdog goroutine only
		calls++
		if calls == 1 {
			close(first)
			return false // a stuck main loop: no ping
		}
		<-markerSent
		return true
	}
	n := New(nil)
	go n.RunWatchdog(ctx, alive)
	<-first
	n.Status("marker")
	close(markerSent)
	// The withheld first ping sent nothing, so the marker comes first.
	if got := read(); got != "STATUS=marker" {
		t.Errorf("first datagram = %q, want the marker", got)
	}
	if got := read(); got != "WATCHDOG=1" {
		t.Errorf("then %q", got)
	}
}

func TestSilentWithoutSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	n := New(nil)
	n.Ready("x")
	n.Stopping()
	if WatchdogInterval() != 0 {
		t.Error("watchdog without WATCHDOG_USEC")
	}
	n.RunWatchdog(context.Background(), nil) // returns at once
}

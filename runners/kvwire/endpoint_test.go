package kvwire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestClassifyInterface(t *testing.T) {
	sys := t.TempDir()
	// A sysfs-like tree: wlan-ish device with a misleading name, and a
	// thunderbolt-net device renamed by udev.
	os.MkdirAll(filepath.Join(sys, "enp0s20f3", "wireless"), 0o755)
	os.MkdirAll(filepath.Join(sys, "enx001", "device"), 0o755)
	os.MkdirAll(filepath.Join(sys, "drivers", "thunderbolt-net"), 0o755)
	os.Symlink(filepath.Join(sys, "drivers", "thunderbolt-net"), filepath.Join(sys, "enx001", "device", "driver"))
	cases := []struct {
		name string
		want LinkKind
	}{
		{"lo", LinkLoopback},
		{"lo0", LinkLoopback},
		{"bridge0", LinkThunderbolt},
		{"thunderbolt0", LinkThunderbolt},
		{"tb1", LinkThunderbolt},
		{"enx001", LinkThunderbolt},
		{"en0", LinkEthernet},
		{"eth0", LinkEthernet},
		{"enp1s0f0np0", LinkEthernet},
		{"enp0s20f3", LinkWiFi},
		{"wlan0", LinkWiFi},
		{"wlp2s0", LinkWiFi},
		{"docker0", LinkUnknown},
		{"", LinkUnknown},
	}
	for _, tc := range cases {
		if got := classify(tc.name, sys); got != tc.want {
			t.Errorf("classify(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDetectLinkLoopback(t *testing.T) {
	if k, name := DetectLink("127.0.0.1:5000"); k != LinkLoopback {
		t.Fatalf("DetectLink(127.0.0.1) = %v %q", k, name)
	}
}

func TestSelectorOrder(t *testing.T) {
	s := NewSelector([]Endpoint{
		{Addr: "wifi:1", Link: LinkWiFi},
		{Addr: "eth-a:1", Link: LinkEthernet},
		{Addr: "tb:1", Link: LinkThunderbolt},
		{Addr: "eth-b:1", Link: LinkEthernet},
	})
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	if got := fmt.Sprint(s.Order()); got != "[tb:1 eth-a:1 eth-b:1 wifi:1]" {
		t.Fatalf("order %s", got)
	}
	// Load: eth-a has a queue, so eth-b goes first among Ethernet.
	s.ReportLoad("eth-a:1", 3)
	if got := fmt.Sprint(s.Order()); got != "[tb:1 eth-b:1 eth-a:1 wifi:1]" {
		t.Fatalf("order with load %s", got)
	}
	// Busy: tb sorts behind its link peers until the busy back-off ends,
	// but stays ahead of... nothing of its own kind; it remains healthy.
	s.begin("tb:1")
	s.report("tb:1", fmt.Errorf("x: %w", ErrBusy), 0)
	if got := fmt.Sprint(s.Order()); got != "[tb:1 eth-b:1 eth-a:1 wifi:1]" {
		t.Fatalf("busy only reorders within a link kind: %s", got)
	}
	// Failure: eth-b becomes unhealthy and goes last until its back-off ends.
	s.begin("eth-b:1")
	s.report("eth-b:1", fmt.Errorf("x: %w", ErrClosed), 0)
	if got := fmt.Sprint(s.Order()); got != "[tb:1 eth-a:1 wifi:1 eth-b:1]" {
		t.Fatalf("order after failure %s", got)
	}
	now = now.Add(6 * time.Second)
	if got := fmt.Sprint(s.Order()); got != "[tb:1 eth-b:1 eth-a:1 wifi:1]" {
		t.Fatalf("order after back-off %s", got)
	}
}

func TestFailover(t *testing.T) {
	m := smallModel()
	// A: busy (one running, no queue). B: refuses connections. C: serves.
	hold := make(chan struct{})
	defer close(hold)
	running := make(chan struct{})
	busyAddr, _ := startServer(t, ServerConfig{MaxQueue: -1, Producer: ProducerFunc(func(ctx context.Context, r *Request, e *Emitter) error {
		close(running)
		<-hold
		return ctx.Err()
	})})
	go NewClient(ClientConfig{}).Fetch(context.Background(), busyAddr, &Request{Tokens: tokens(4)}, nil, &recordSink{})
	<-running
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := l.Addr().String()
	l.Close()
	goodAddr, _ := startServer(t, ServerConfig{Producer: m.producer()})
	mismatchAddr, _ := startServer(t, ServerConfig{Producer: (&testModel{fp: Fingerprint{66}, kinds: m.kinds, kvHeads: 2, headDim: 8, dtype: DTypeBF16, block: 16, tail: 1}).producer()})

	c := NewClient(ClientConfig{})
	req := &Request{Tokens: tokens(40)}

	t.Run("moves on to a healthy endpoint", func(t *testing.T) {
		sel := NewSelector([]Endpoint{{Addr: busyAddr, Link: LinkThunderbolt}, {Addr: deadAddr, Link: LinkEthernet}, {Addr: goodAddr, Link: LinkWiFi}})
		var tried []string
		sink := &recordSink{}
		err := sel.Do(context.Background(), func(ctx context.Context, addr string) error {
			tried = append(tried, addr)
			_, err := c.Fetch(ctx, addr, req, m.expect(), sink)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(tried) != fmt.Sprint([]string{busyAddr, deadAddr, goodAddr}) {
			t.Fatalf("tried %v", tried)
		}
		if sink.begins != 1 || sink.rollbacks != 2 {
			t.Fatalf("sink began %d times, rolled back %d times; want 1 and 2 (one per failed try)", sink.begins, sink.rollbacks)
		}
		sink.rollbacks = 0
		sink.verify(t, m, req)
	})
	t.Run("gives up with the last error", func(t *testing.T) {
		sel := NewSelector([]Endpoint{{Addr: deadAddr, Link: LinkThunderbolt}, {Addr: busyAddr, Link: LinkEthernet}, {Addr: mismatchAddr, Link: LinkWiFi}})
		sink := &recordSink{}
		_, err := c.FetchAny(context.Background(), sel, req, m.expect(), sink)
		if !errors.Is(err, ErrMismatch) || errors.Is(err, ErrBusy) {
			t.Fatalf("err %v, want the last (mismatch)", err)
		}
		if sink.rollbacks != 3 {
			t.Fatalf("rollbacks %d, want one per try", sink.rollbacks)
		}
		st := sel.Status()
		if st[len(st)-1].Failures != 1 {
			t.Fatalf("status %+v", st)
		}
	})
	t.Run("bad request is not retried", func(t *testing.T) {
		sel := NewSelector([]Endpoint{{Addr: goodAddr, Link: LinkThunderbolt}, {Addr: goodAddr + "0", Link: LinkEthernet}})
		n := 0
		_, err := c.FetchAny(context.Background(), sel, &Request{Tokens: tokens(2), StartPos: 5}, m.expect(), &recordSink{})
		sel.Do(context.Background(), func(ctx context.Context, addr string) error { n++; return fmt.Errorf("no: %w", ErrBadRequest) })
		if !errors.Is(err, ErrBadRequest) || n != 1 {
			t.Fatalf("err %v after %d tries", err, n)
		}
	})
	t.Run("no endpoints", func(t *testing.T) {
		if err := NewSelector(nil).Do(context.Background(), nil); !errors.Is(err, ErrNoEndpoint) {
			t.Fatal(err)
		}
	})
}

func TestDoPreferred(t *testing.T) {
	eps := []Endpoint{{Addr: "a:1", Link: LinkEthernet}, {Addr: "b:1", Link: LinkEthernet}, {Addr: "c:1", Link: LinkEthernet}}
	for _, c := range []struct {
		prefer []string
		allow  func(string) bool
		want   []string
	}{
		{nil, nil, []string{"a:1", "b:1", "c:1"}},
		{[]string{"c:1", "a:1"}, nil, []string{"c:1", "a:1", "b:1"}},
		{[]string{"x:9", "b:1", "b:1"}, nil, []string{"b:1", "a:1", "c:1"}},                         // unknown and repeated ignored
		{[]string{"c:1", "b:1"}, func(a string) bool { return a != "c:1" }, []string{"b:1", "a:1"}}, // open breaker skipped
	} {
		s := NewSelector(eps)
		var tried []string
		s.DoPreferred(context.Background(), c.prefer, c.allow, func(_ context.Context, addr string) error {
			tried = append(tried, addr)
			return ErrClosed
		})
		if !slices.Equal(tried, c.want) {
			t.Errorf("prefer %v: tried %v, want %v", c.prefer, tried, c.want)
		}
	}
}

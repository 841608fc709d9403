package kvwire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// LinkKind is the kind of network link that reaches an endpoint.
type LinkKind uint8

// Link kinds, listed from least to most preferred.
const (
	LinkUnknown LinkKind = iota
	LinkWiFi
	LinkEthernet
	LinkThunderbolt
	LinkLoopback
)

func (k LinkKind) String() string {
	switch k {
	case LinkWiFi:
		return "wifi"
	case LinkEthernet:
		return "ethernet"
	case LinkThunderbolt:
		return "thunderbolt"
	case LinkLoopback:
		return "loopback"
	}
	return "unknown"
}

// rank orders link kinds: lower is tried first. Unknown sorts between
// Ethernet and Wi-Fi.
func (k LinkKind) rank() int {
	switch k {
	case LinkLoopback:
		return 0
	case LinkThunderbolt:
		return 1
	case LinkEthernet:
		return 2
	case LinkUnknown:
		return 3
	}
	return 4 // Wi-Fi
}

// ClassifyInterface guesses the link kind of a local interface from its
// name (and, on Linux, from /sys/class/net): lo* loopback; thunderbolt*,
// tb*, bridge* (the macOS Thunderbolt bridge) or a thunderbolt-net driver:
// Thunderbolt; wl*, wlan*, or a "wireless" entry in sysfs: Wi-Fi; en*,
// eth*: Ethernet. On macOS en0 may be Wi-Fi (laptops); set Endpoint.Link
// explicitly where the name is ambiguous.
func ClassifyInterface(name string) LinkKind {
	return classify(name, "/sys/class/net")
}

func classify(name, sysfs string) LinkKind {
	n := strings.ToLower(name)
	switch {
	case strings.HasPrefix(n, "lo"):
		return LinkLoopback
	case strings.HasPrefix(n, "thunderbolt"), strings.HasPrefix(n, "tb"), strings.HasPrefix(n, "bridge"):
		return LinkThunderbolt
	}
	if sysfs != "" && name != "" && !strings.ContainsAny(name, "/.") {
		dir := filepath.Join(sysfs, name)
		if _, err := os.Stat(filepath.Join(dir, "wireless")); err == nil {
			return LinkWiFi
		}
		if drv, err := os.Readlink(filepath.Join(dir, "device", "driver")); err == nil && strings.Contains(filepath.Base(drv), "thunderbolt") {
			return LinkThunderbolt
		}
	}
	switch {
	case strings.HasPrefix(n, "wl"):
		return LinkWiFi
	case strings.HasPrefix(n, "en"), strings.HasPrefix(n, "eth"):
		return LinkEthernet
	}
	return LinkUnknown
}

// DetectLink finds the local interface the kernel would route addr
// ("host:port") through and classifies it. It sends no packets (a UDP
// "connect" only selects a route). It returns LinkUnknown and "" when the
// route or interface cannot be found.
func DetectLink(addr string) (LinkKind, string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ips, err := net.LookupHost(host)
	if err != nil || len(ips) == 0 {
		return LinkUnknown, ""
	}
	c, err := net.Dial("udp", net.JoinHostPort(ips[0], "9"))
	if err != nil {
		return LinkUnknown, ""
	}
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	c.Close()
	if local.Addr().Unmap().IsLoopback() {
		return LinkLoopback, "lo"
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return LinkUnknown, ""
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err == nil && p.Addr().Unmap() == local.Addr().Unmap() {
				return ClassifyInterface(ifc.Name), ifc.Name
			}
		}
	}
	return LinkUnknown, ""
}

// ErrNoEndpoint: a Selector has no endpoints to try.
var ErrNoEndpoint = errors.New("kvwire: no prefill endpoint")

// Endpoint is one prefill server.
type Endpoint struct {
	Addr string
	// Link is the link kind; LinkUnknown means detect it (DetectLink).
	Link LinkKind
}

// EndpointStatus is a Selector's view of one endpoint.
type EndpointStatus struct {
	Endpoint
	InFlight  int           // fetches running now through this selector
	Waiting   int           // the server's queue, as last reported (ReportLoad)
	Failures  int           // consecutive failures (not counting busy)
	LastError string        // the last failure, for logs
	Latency   time.Duration // moving average of successful fetch durations
	Healthy   bool          // no failure within the back-off window
	BusyUntil time.Time     // answered busy recently; sorted after idle peers until then
}

// Selector orders prefill endpoints and fails over between them. It is
// safe for concurrent use.
type Selector struct {
	mu  sync.Mutex
	eps []*EndpointStatus
	now func() time.Time
	// busyBackoff is how long a busy endpoint sorts behind idle peers of
	// its link kind (2 s); failBackoff is how long a failed endpoint sorts
	// last (5 s, doubling per consecutive failure up to 5 minutes).
	busyBackoff, failBackoff time.Duration
	lastFail                 []time.Time
}

// NewSelector makes a selector over eps, detecting unknown link kinds.
func NewSelector(eps []Endpoint) *Selector {
	s := &Selector{now: time.Now, busyBackoff: 2 * time.Second, failBackoff: 5 * time.Second}
	for _, e := range eps {
		if e.Link == LinkUnknown {
			e.Link, _ = DetectLink(e.Addr)
		}
		s.eps = append(s.eps, &EndpointStatus{Endpoint: e, Healthy: true})
		s.lastFail = append(s.lastFail, time.Time{})
	}
	return s
}

// Status returns the endpoints in the order Order would try them.
func (s *Selector) Status() []EndpointStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := s.orderLocked()
	out := make([]EndpointStatus, len(idx))
	for i, j := range idx {
		out[i] = *s.eps[j]
	}
	return out
}

// Order returns the endpoints' addresses, best first: healthy before
// unhealthy, then by link kind (loopback, Thunderbolt, Ethernet, unknown,
// Wi-Fi), then not-recently-busy first, then by load (in flight + waiting),
// then by observed latency, then by the order given.
func (s *Selector) Order() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := s.orderLocked()
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = s.eps[j].Addr
	}
	return out
}

func (s *Selector) orderLocked() []int {
	now := s.now()
	for i, e := range s.eps {
		e.Healthy = e.Failures == 0 || now.Sub(s.lastFail[i]) >= s.backoff(e.Failures)
	}
	idx := make([]int, len(s.eps))
	for i := range idx {
		idx[i] = i
	}
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		x, y := s.eps[a], s.eps[b]
		if c := b2i(!x.Healthy) - b2i(!y.Healthy); c != 0 {
			return c
		}
		if c := x.Link.rank() - y.Link.rank(); c != 0 {
			return c
		}
		if c := b2i(now.Before(x.BusyUntil)) - b2i(now.Before(y.BusyUntil)); c != 0 {
			return c
		}
		if c := (x.InFlight + x.Waiting) - (y.InFlight + y.Waiting); c != 0 {
			return c
		}
		return int(x.Latency - y.Latency)
	})
	return idx
}

func (s *Selector) backoff(failures int) time.Duration {
	d := s.failBackoff
	for i := 1; i < failures && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}

func (s *Selector) find(addr string) int {
	for i, e := range s.eps {
		if e.Addr == addr {
			return i
		}
	}
	return -1
}

// ReportLoad records a server's queue length from an outside health check
// (e.g. the prefill runner's /health "waiting").
func (s *Selector) ReportLoad(addr string, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.find(addr); i >= 0 {
		s.eps[i].Waiting = waiting
	}
}

func (s *Selector) begin(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.find(addr); i >= 0 {
		s.eps[i].InFlight++
	}
}

// report records the outcome of one try.
func (s *Selector) report(addr string, err error, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.find(addr)
	if i < 0 {
		return
	}
	e := s.eps[i]
	e.InFlight--
	switch {
	case err == nil:
		e.Failures = 0
		e.LastError = ""
		if e.Latency == 0 {
			e.Latency = d
		} else {
			e.Latency = (3*e.Latency + d) / 4
		}
	case errors.Is(err, ErrBusy):
		e.BusyUntil = s.now().Add(s.busyBackoff)
	case errors.Is(err, context.Canceled):
		// the caller gave up; says nothing about the endpoint
	default:
		e.Failures++
		e.LastError = err.Error()
		s.lastFail[i] = s.now()
	}
}

// Retryable reports whether a failed fetch should be tried on the next
// endpoint: every failure except a bad request (the same request is bad
// everywhere) and the caller's own cancellation. Mismatch, auth and version
// are retried: during a reconfiguration hosts can differ in model build,
// secret or version, and a try costs one handshake.
func Retryable(err error) bool {
	return err != nil && !errors.Is(err, ErrBadRequest) && !errors.Is(err, context.Canceled)
}

// Do calls try with each endpoint's address in Order until one succeeds, a
// failure is not Retryable, or ctx ends. It returns nil, that failure, or
// the last failure (wrapped with the count of endpoints tried, so errors.Is
// still tells busy from mismatch). With no endpoints it returns ErrNoEndpoint.
func (s *Selector) Do(ctx context.Context, try func(ctx context.Context, addr string) error) error {
	return s.DoAllowed(ctx, nil, try)
}

// DoAllowed is Do over the endpoints allow accepts (all when allow is
// nil), e.g. those whose circuit breaker is closed. With none allowed it
// returns ErrNoEndpoint.
func (s *Selector) DoAllowed(ctx context.Context, allow func(addr string) bool, try func(ctx context.Context, addr string) error) error {
	order := s.Order()
	if allow != nil {
		order = slices.DeleteFunc(order, func(a string) bool { return !allow(a) })
	}
	if len(order) == 0 {
		return ErrNoEndpoint
	}
	var last error
	for i, addr := range order {
		if err := ctx.Err(); err != nil {
			if last == nil {
				return err
			}
			return fmt.Errorf("kvwire: gave up after %d of %d endpoints: %w (last: %w)", i, len(order), err, last)
		}
		s.begin(addr)
		t0 := s.now()
		err := try(ctx, addr)
		s.report(addr, err, s.now().Sub(t0))
		if err == nil {
			return nil
		}
		if !Retryable(err) || ctx.Err() != nil {
			return err
		}
		last = fmt.Errorf("endpoint %s: %w", addr, err)
	}
	return fmt.Errorf("kvwire: all %d prefill endpoints failed, last %w", len(order), last)
}

// FetchAny fetches req from the first endpoint of sel that serves it,
// failing over as Do does. The sink is rolled back after each failed try
// and may be begun again by the next. Stats are the last try's.
func (c *Client) FetchAny(ctx context.Context, sel *Selector, req *Request, exp *Expect, sink Sink) (Stats, error) {
	var st Stats
	err := sel.Do(ctx, func(ctx context.Context, addr string) error {
		var err error
		st, err = c.Fetch(ctx, addr, req, exp, sink)
		return err
	})
	return st, err
}

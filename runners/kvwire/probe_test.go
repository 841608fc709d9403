package kvwire

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestProbe(t *testing.T) {
	// A producer that holds the only admission slot until the test ends:
	// probes must not queue behind it.
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	admitted := make(chan struct{}, 1)
	blocking := ProducerFunc(func(ctx context.Context, req *Request, e *Emitter) error {
		select {
		case admitted <- struct{}{}:
		default:
		}
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return ctx.Err()
	})
	busy, busySrv := startServer(t, ServerConfig{Producer: blocking, MaxActive: 1, MaxQueue: -1, Secret: []byte("s")})
	go NewClient(ClientConfig{Secret: []byte("s")}).Fetch(context.Background(), busy, &Request{Model: "m", Tokens: []int32{1}}, nil, discard{})
	select { // the fetch holds the only slot: its producer runs
	case <-admitted:
	case <-time.After(30 * time.Second):
		t.Fatal("the blocking fetch was never admitted")
	}
	if l := busySrv.Load(); l.Running != 1 || l.Waiting != 0 {
		t.Fatalf("busy server's load %+v, want its one slot taken", l)
	}

	plain, _ := startServer(t, ServerConfig{Producer: blocking})
	tests := []struct {
		name   string
		addr   string
		secret string
		tokens int
		want   error
	}{
		{"no secret, one token", plain, "", 1, nil},
		{"no secret, 300 tokens", plain, "", 300, nil},
		{"right secret, busy server", busy, "s", 129, nil},
		{"wrong secret", busy, "t", 1, ErrAuth},
		{"no secret when required", busy, "", 1, ErrAuth},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if l := busySrv.Load(); l.Running != 1 {
				t.Fatalf("busy server's load %+v: the slot was given up, so a probe passing proves nothing", l)
			}
			c := NewClient(ClientConfig{Secret: []byte(tt.secret), IdleTimeout: 5 * time.Second})
			r, err := c.Probe(context.Background(), tt.addr, tt.tokens)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.want != nil {
				return
			}
			if want := int64(tt.tokens) * ProbeBytesPerToken; r.PayloadBytes != want {
				t.Errorf("payload %d bytes, want %d", r.PayloadBytes, want)
			}
			if r.Transfer <= 0 || r.Goodput() <= 0 {
				t.Errorf("transfer %v, goodput %v", r.Transfer, r.Goodput())
			}
		})
	}
	if ProbeBytesPerToken != 128<<10 {
		t.Errorf("ProbeBytesPerToken = %d", ProbeBytesPerToken)
	}
	c := NewClient(ClientConfig{})
	if _, err := c.Probe(context.Background(), plain, ProbeMaxTokens+1); err == nil {
		t.Error("client accepted an oversize probe")
	}
	// The server refuses one too (a client that skips Probe's check).
	_, err := c.Fetch(context.Background(), plain, &Request{Model: ProbeModel, Tokens: make([]int32, ProbeMaxTokens+1)}, nil, discard{})
	if !errors.Is(err, ErrBadRequest) {
		t.Errorf("oversize probe: %v, want ErrBadRequest", err)
	}
	_, err = c.Fetch(context.Background(), plain, &Request{Model: ProbeModel, Tokens: make([]int32, 4), StartPos: 2}, nil, discard{})
	if !errors.Is(err, ErrBadRequest) {
		t.Errorf("probe with start_pos: %v, want ErrBadRequest", err)
	}
}

// BenchmarkProbe: a link probe against a kvwire stream of the same size
// through the same shaped link, interleaved, both timed from the header to
// the end of the stream; ratio = probe / kvwire goodput (what `exo doctor`
// reports against what the wire delivers). The request is 513 tokens, as
// a real one is: a 1 MiB request (DefaultMaxTokens) slows the shaped
// stream that follows it.
func BenchmarkProbe(b *testing.B) {
	for _, tc := range []struct {
		name string
		rate float64
	}{{"1GbE", 0.117e9}, {"10GbE", 1.17e9}} {
		b.Run(tc.name, func(b *testing.B) {
			const tokens = 256 // 32 MiB
			total := int64(tokens) * ProbeBytesPerToken
			kvAddr, _ := startServer(b, ServerConfig{Producer: benchProducer(total, 0)})
			kvAddr = startProxy(b, &proxy{target: kvAddr, rate: tc.rate})
			c := NewClient(ClientConfig{})
			req := &Request{Tokens: make([]int32, 513), Deadline: time.Hour}
			var probeT, kvT time.Duration
			var probeN, kvN int64
			b.SetBytes(2 * total)
			for b.Loop() {
				st, err := c.Fetch(context.Background(), kvAddr, req, nil, nullSink{})
				if err != nil {
					b.Fatal(err)
				}
				kvT += st.Duration - st.FirstHeader // as Probe measures
				kvN += st.PayloadBytes
				r, err := c.Probe(context.Background(), kvAddr, tokens)
				if err != nil {
					b.Fatal(err)
				}
				probeT += r.Transfer
				probeN += r.PayloadBytes
			}
			kv := float64(kvN) / kvT.Seconds() / 1e9
			pr := float64(probeN) / probeT.Seconds() / 1e9
			b.ReportMetric(kv, "kvwire_GB/s")
			b.ReportMetric(pr, "probe_GB/s")
			b.ReportMetric(pr/kv, "ratio")
		})
	}
}

package kvwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// prefixProducer holds a fixed token list "in its cache" and answers
// prefix probes with the common prefix; Produce must never run for a
// probe.
type prefixProducer struct {
	held     []int32
	produced chan struct{}
}

func (p *prefixProducer) Produce(ctx context.Context, req *Request, e *Emitter) error {
	p.produced <- struct{}{}
	return fmt.Errorf("%w: not for this test", ErrRemoteInternal)
}

func (p *prefixProducer) CachedPrefix(ctx context.Context, req *Request) (int, error) {
	if req.Model != "m" {
		return 0, fmt.Errorf("%w: serves m, not %q", ErrMismatch, req.Model)
	}
	n := 0
	for n < len(p.held) && n < len(req.Tokens) && p.held[n] == req.Tokens[n] {
		n++
	}
	return n, nil
}

func TestPrefixHit(t *testing.T) {
	held := tokens(200)
	prod := &prefixProducer{held: held, produced: make(chan struct{}, 1)}
	addr, _ := startServer(t, ServerConfig{Producer: prod, Secret: []byte("s")})
	plain, _ := startServer(t, ServerConfig{Producer: ProducerFunc(func(ctx context.Context, req *Request, e *Emitter) error {
		return fmt.Errorf("%w: no", ErrRemoteInternal)
	})})
	diverge := append(append([]int32(nil), held[:77]...), tokens(50)...)
	diverge[77] = held[77] + 1
	tests := []struct {
		name   string
		addr   string
		secret string
		model  string
		toks   []int32
		want   int
		err    error
	}{
		{"whole prompt held", addr, "s", "m", held[:150], 150, nil},
		{"longer than held", addr, "s", "m", append(append([]int32(nil), held...), 1, 2, 3), 200, nil},
		{"diverges at 77", addr, "s", "m", diverge, 77, nil},
		{"nothing held", addr, "s", "m", []int32{held[0] + 1, 5}, 0, nil},
		{"other model", addr, "s", "other", held[:10], 0, ErrMismatch},
		{"wrong secret", addr, "t", "m", held[:10], 0, ErrAuth},
		{"server without prober", plain, "", "m", held[:10], 0, ErrNoPrefixProbe},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewClient(ClientConfig{Secret: []byte(tt.secret), IdleTimeout: 5 * time.Second})
			got, err := c.PrefixHit(context.Background(), tt.addr, &Request{ID: "p", Model: tt.model, Tokens: tt.toks, StartPos: 3, Streams: 4})
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if got != tt.want {
				t.Fatalf("held = %d, want %d", got, tt.want)
			}
		})
	}
	select {
	case <-prod.produced:
		t.Fatal("a prefix probe ran the producer")
	default:
	}
}

func TestPrefixFrame(t *testing.T) {
	f := encodePrefix(42)
	r := readFrame(bytes.NewReader(f), nil, Limits{}.withDefaults())
	if r.err != nil || r.check() != nil || r.typ != framePrefix {
		t.Fatalf("read back: %v %v type %d", r.err, r.check(), r.typ)
	}
	if n, err := parsePrefix(r.payload, 42); err != nil || n != 42 {
		t.Fatalf("parse = %d, %v", n, err)
	}
	for _, tc := range []struct {
		p []byte
		n int
	}{
		{r.payload, 41},                            // more held than the prompt has
		{r.payload[:4], 100},                       // short
		{append(r.payload[:4:4], 0, 0, 0, 1), 100}, // reserved set
	} {
		if _, err := parsePrefix(tc.p, tc.n); !errors.Is(err, ErrCorrupt) {
			t.Errorf("parsePrefix(% x, %d) = %v, want ErrCorrupt", tc.p, tc.n, err)
		}
	}
}

// FuzzPrefix: the Prefix decoder never panics, fails only with
// ErrCorrupt, and never reports more tokens than the prompt has.
func FuzzPrefix(f *testing.F) {
	f.Add(encodePrefix(7)[frameHeaderSize:], 10)
	f.Add([]byte{1, 2, 3}, 0)
	f.Fuzz(func(t *testing.T, p []byte, n int) {
		n = max(n, 0)
		held, err := parsePrefix(p, n)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error without ErrCorrupt: %v", err)
			}
			return
		}
		if held < 0 || held > n {
			t.Fatalf("held %d of %d", held, n)
		}
		if !bytes.Equal(encodePrefix(held)[frameHeaderSize:], p) {
			t.Fatal("re-encoding differs")
		}
	})
}

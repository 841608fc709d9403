package decode

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// TestNewArchRemotePrefillEqualsLocal: the tiny SmolLM3 (NoPE layers: their
// keys cross the wire unrotated) and OLMo 2 models checked against mlx-lm,
// prefilled by a real prefill producer over the KV wire (loopback TCP, chunks
// of 16), continue with the same greedy tokens as after local prefill, for a
// fresh prompt and for a second turn (start_pos > 0).
func TestNewArchRemotePrefillEqualsLocal(t *testing.T) {
	for _, name := range []string{"smollm3", "olmo2"} {
		t.Run(name, func(t *testing.T) { testRemoteEqualsLocal(t, name) })
	}
}

func testRemoteEqualsLocal(t *testing.T, name string) {
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("..", "engine", "testdata", "reference", name), cpu.New(2), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 16, Metrics: metrics.New("prefill")})
	defer prod.Close()
	srv, err := kvwire.NewServer(kvwire.ServerConfig{Producer: prod})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go srv.Serve(sctx, l)
	r := &KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m,
		Selector: kvwire.NewSelector([]kvwire.Endpoint{{Addr: l.Addr().String(), Link: kvwire.LinkLoopback}})}

	greedy := func(c engine.KVCache, last int32) []int32 {
		t.Helper()
		var out []int32
		for range 12 {
			lg, err := m.Forward(ctx, c, []int32{last})
			if err != nil {
				t.Fatal(err)
			}
			last = int32(argmaxHybrid(lg))
			out = append(out, last)
		}
		return out
	}
	local := func(tokens []int32) []int32 {
		t.Helper()
		c := m.NewCache()
		defer c.Free()
		if _, err := m.Forward(ctx, c, tokens[:len(tokens)-1]); err != nil {
			t.Fatal(err)
		}
		return greedy(c, tokens[len(tokens)-1])
	}
	prompt := make([]int32, 70)
	for i := range prompt {
		prompt[i] = int32(3 + i*37%500)
	}
	want := local(prompt)
	c := m.NewCache()
	defer c.Free()
	st, err := r.Prefill(ctx, "a", prompt, 0, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != len(prompt)-1 || st.States != 0 {
		t.Fatalf("cache %d after remote prefill (want %d), %d State frames", c.Len(), len(prompt)-1, st.States)
	}
	if got := greedy(c, prompt[len(prompt)-1]); !slices.Equal(got, want) {
		t.Fatalf("remote prefill continues %v, local %v", got, want)
	}
	turn2 := append(append(slices.Clone(prompt), want...), 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50)
	if _, err := r.Prefill(ctx, "b", turn2, c.Len(), c, nil); err != nil {
		t.Fatal(err)
	}
	if got, want2 := greedy(c, turn2[len(turn2)-1]), local(turn2); !slices.Equal(got, want2) {
		t.Fatalf("second turn: remote %v, local %v", got, want2)
	}
}

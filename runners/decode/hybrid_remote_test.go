package decode

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend" // registers the weight loader
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	dto "github.com/prometheus/client_model/go"
)

// TestHybridRemotePrefillEqualsLocal: a Qwen3-Next model (the engine's
// mlx-lm-checked tiny one) prefilled by a real prefill producer over the
// KV wire (loopback TCP): the attention layers' KV arrives in chunks and
// the Gated DeltaNet layers' states in State frames (one per recurrent
// layer, counted), and the decode side's text equals local prefill's, for
// a fresh prompt and for a continued conversation (start_pos > 0, the
// prefill side resuming from its cached turn-1 state). A byte
// flipped inside a State frame is caught (ErrCorrupt) and leaves the
// cache as it was.
func TestHybridRemotePrefillEqualsLocal(t *testing.T) {
	ctx := context.Background()
	m := loadReference(t, "qwen3_next", engine.LoadOptions{})
	recurrent := 0
	for _, r := range m.Info().Recurrent {
		if r {
			recurrent++
		}
	}
	if recurrent == 0 {
		t.Fatal("no recurrent layers")
	}
	met := metrics.New("prefill")
	addr := servePrefill(t, m, 16, met)
	r := loopbackRemote(m, addr)
	prompt := make([]int32, 70)
	for i := range prompt {
		prompt[i] = int32(3 + i*37%500)
	}
	local := m.NewCache()
	if _, err := m.Forward(ctx, local, prompt[:len(prompt)-1]); err != nil {
		t.Fatal(err)
	}
	want := greedyAfter(t, m, local, prompt[len(prompt)-1])

	c := m.NewCache()
	st, err := r.Prefill(ctx, "a", prompt, 0, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.States != recurrent || c.Len() != len(prompt)-1 {
		t.Fatalf("%d State frames (want %d), cache %d (want %d)", st.States, recurrent, c.Len(), len(prompt)-1)
	}
	if got := greedyAfter(t, m, c, prompt[len(prompt)-1]); !slices.Equal(got, want) {
		t.Fatalf("remote prefill continues %v, local %v", got, want)
	}

	// A second turn: the decode side keeps its cache (start_pos > 0) and
	// asks only for the new tokens' attention KV and the new states.
	turn2 := append(append(slices.Clone(prompt), want...), 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50)
	start := c.Len()
	if _, err := r.Prefill(ctx, "b", turn2, start, c, nil); err != nil {
		t.Fatal(err)
	}
	local2 := m.NewCache()
	if _, err := m.Forward(ctx, local2, turn2[:len(turn2)-1]); err != nil {
		t.Fatal(err)
	}
	if got, want2 := greedyAfter(t, m, c, turn2[len(turn2)-1]), greedyAfter(t, m, local2, turn2[len(turn2)-1]); !slices.Equal(got, want2) {
		t.Fatalf("second turn: remote %v, local %v", got, want2)
	}
	// The prefill side kept turn 1's cache (its state after 69 tokens)
	// and computed only the new tokens.
	var hit dto.Metric
	if err := met.PrefixHit.WithLabelValues("prefill").Write(&hit); err != nil {
		t.Fatal(err)
	}
	if got := hit.GetCounter().GetValue(); got != float64(len(prompt)-1) {
		t.Fatalf("prefill prefix hit %v tokens, want %d", got, len(prompt)-1)
	}

	// A flipped byte inside a State frame (they come last, before Done).
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	go flipProxy(pl, addr, 300)
	c3 := m.NewCache()
	_, err = loopbackRemote(m, pl.Addr().String()).Prefill(ctx, "c", prompt, 0, c3, nil)
	if !errors.Is(err, kvwire.ErrCorrupt) {
		t.Fatalf("flipped state byte: %v, want ErrCorrupt", err)
	}
	if c3.Len() != 0 {
		t.Fatalf("cache holds %d positions after a corrupt stream", c3.Len())
	}
	// The request still completes: local prefill on the same cache.
	if _, err := m.Forward(ctx, c3, prompt[:len(prompt)-1]); err != nil {
		t.Fatal(err)
	}
	if got := greedyAfter(t, m, c3, prompt[len(prompt)-1]); !slices.Equal(got, want) {
		t.Fatalf("after fallback %v, want %v", got, want)
	}
}

// flipProxy relays one connection and flips the byte `back` bytes before
// the end of the server's answer (inside the last State frame: Done is
// shorter than that, a state array longer). Past the first 4 KiB (the
// handshake and header go through at once) it holds back the last `back`
// bytes it has read until the server closes.
func flipProxy(l net.Listener, server string, back int) {
	conn, err := l.Accept()
	if err != nil {
		return
	}
	defer conn.Close()
	up, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer up.Close()
	go io.Copy(up, conn)
	var held []byte
	total := 0
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		held = append(held, buf[:n]...)
		total += n
		if total > 4<<10 && len(held) > back {
			conn.Write(held[:len(held)-back])
			held = append([]byte(nil), held[len(held)-back:]...)
		} else if total <= 4<<10 {
			conn.Write(held)
			held = held[:0]
		}
		if err != nil {
			break
		}
	}
	if len(held) == back {
		held[0] ^= 0x40
	}
	conn.Write(held)
}

package decode

import (
	"context"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
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
	m := loadReference(t, name, engine.LoadOptions{})
	r := loopbackRemote(m, servePrefill(t, m, 16, nil))
	local := func(tokens []int32) []int32 {
		t.Helper()
		c := m.NewCache()
		defer c.Free()
		if _, err := m.Forward(ctx, c, tokens[:len(tokens)-1]); err != nil {
			t.Fatal(err)
		}
		return greedyAfter(t, m, c, tokens[len(tokens)-1])
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
	if got := greedyAfter(t, m, c, prompt[len(prompt)-1]); !slices.Equal(got, want) {
		t.Fatalf("remote prefill continues %v, local %v", got, want)
	}
	turn2 := append(append(slices.Clone(prompt), want...), 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50)
	if _, err := r.Prefill(ctx, "b", turn2, c.Len(), c, nil); err != nil {
		t.Fatal(err)
	}
	if got, want2 := greedyAfter(t, m, c, turn2[len(turn2)-1]), local(turn2); !slices.Equal(got, want2) {
		t.Fatalf("second turn: remote %v, local %v", got, want2)
	}
}

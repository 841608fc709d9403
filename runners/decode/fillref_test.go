package decode_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// The remote-fill tests' (split_test.go, headsplit_test.go) shared
// reference: a prompt, the whole model's local prefill of it, and a
// filled cache compared with that layer by layer.

// ramp is the n-token prompt first + (step·i mod mod).
func ramp(n, first, step, mod int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(first + i*step%mod)
	}
	return p
}

// localPrefill is m's local prefill of tokens in chunks of 16, in a cache
// freed when the test ends.
func localPrefill(t *testing.T, m *engine.Model, tokens []int32) engine.KVCache {
	t.Helper()
	ref := m.NewCache()
	t.Cleanup(ref.Free)
	if err := m.Prefill(context.Background(), ref, tokens, 16, nil); err != nil {
		t.Fatal(err)
	}
	return ref
}

// sameLayers fails the test unless cache got, holding the layers [a, b)
// of a model from its layer 0, holds for each of them byte for byte what
// want holds in its positions [0, n); it returns those layers' K and V
// bytes.
func sameLayers(t *testing.T, what string, want, got engine.KVCache, a, b, n int) int64 {
	t.Helper()
	var share int64
	for l := a; l < b; l++ {
		k, v, err := want.Export(l, 0, n)
		if err != nil {
			t.Fatal(err)
		}
		gk, gv, err := got.Export(l-a, 0, n)
		if err != nil || !bytes.Equal(k, gk) || !bytes.Equal(v, gv) {
			t.Fatalf("%s: layer %d differs from the reference (%v)", what, l, err)
		}
		share += int64(len(k) + len(v))
	}
	return share
}

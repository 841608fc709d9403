package testmodel

import (
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// Ramp is the n-token prompt first + (step·i mod mod): the prompts the
// remote-fill tests (decode, prefill, tensor) compare with local prefill.
func Ramp(n, first, step, mod int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(first + i*step%mod)
	}
	return p
}

// LocalPrefill is m's local prefill of tokens in chunks of chunk, the
// reference a remote fill's KV must equal, in a cache freed when the test
// ends.
func LocalPrefill(t testing.TB, m *engine.Model, tokens []int32, chunk int) engine.KVCache {
	t.Helper()
	ref := m.NewCache()
	t.Cleanup(ref.Free)
	if err := m.Prefill(t.Context(), ref, tokens, chunk, nil); err != nil {
		t.Fatal(err)
	}
	return ref
}

// Dir writes the model of spec into a fresh directory under t's TempDir
// and returns it, failing t when it cannot.
func Dir(t testing.TB, spec Spec) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "m")
	if err := Write(dir, spec); err != nil {
		t.Fatal(err)
	}
	return dir
}

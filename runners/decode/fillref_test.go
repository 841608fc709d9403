package decode_test

import (
	"bytes"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// The remote-fill tests' (split_test.go, headsplit_test.go) shared
// reference: a filled cache compared layer by layer with the whole
// model's local prefill (testmodel.LocalPrefill) of a prompt
// (testmodel.Ramp).

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

package cpu

import (
	"fmt"
	"strings"
	"testing"
)

// TestStepArena: a step's temporaries come from the arena once a sweep has
// sized it (the first step's, outgrowing the empty slab, are left to the
// GC); Keep moves an array out of it; using a swept temporary panics.
func TestStepArena(t *testing.T) {
	b := newBackend(1)
	x := arr(b.FromFloat32([]float32{1, 2, 3, 4}, 2, 2))
	if x.owner != nil {
		t.Fatal("first step: an array outgrowing the empty slab is pooled")
	}
	b.FromFloat32(make([]float32, 64), 64) // the first step's demand sizes the slab
	b.Free()
	y := arr(b.Add(b.FromFloat32([]float32{1, 2, 3, 4}, 2, 2), x))
	kept := arr(b.Mul(y, y))
	b.Keep(kept)
	if y.owner != b || kept.owner != nil {
		t.Fatalf("second step: owner %p / kept %p, want the backend / none", y.owner, kept.owner)
	}
	b.Free()
	b.FromFloat32(make([]float32, 64), 64) // reuses the slab
	if got, _ := b.Float32(kept); fmt.Sprint(got) != "[4 16 36 64]" {
		t.Fatalf("kept array after the sweep = %v", got)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "after the Free") {
			t.Fatalf("use after the sweep: recovered %v", r)
		}
	}()
	b.Add(y, y)
}

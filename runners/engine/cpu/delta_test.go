package cpu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/internal/fixture"
)

type deltaCase struct {
	Name                                            string
	L, Hk, Hv, Dk, Dv                               int
	Q, K, V, A, B, ALog, DtBias, State, Y, StateOut string
	G, Beta                                         string
}

func (c *deltaCase) UnmarshalJSON(raw []byte) error {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	i := func(k string) int { return int(m[k].(float64)) }
	s := func(k string) string { return m[k].(string) }
	*c = deltaCase{Name: s("name"), L: i("L"), Hk: i("Hk"), Hv: i("Hv"), Dk: i("Dk"), Dv: i("Dv"),
		Q: s("q"), K: s("k"), V: s("v"), A: s("a"), B: s("b"), ALog: s("A_log"), DtBias: s("dt_bias"),
		State: s("state"), Y: s("y"), StateOut: s("state_out"), G: s("g"), Beta: s("beta")}
	return nil
}

// deltaFixture reads testdata/reference/gated_delta.json, written by
// scripts/reference/gated_delta_reference.py from mlx-lm.
func deltaFixture(t *testing.T) []deltaCase {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "reference", "gated_delta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx struct{ Cases []deltaCase }
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Cases) != 3 {
		t.Fatalf("%d cases in the fixture", len(fx.Cases))
	}
	return fx.Cases
}

// TestGatedDeltaMatchesMLXLM: the gates and the recurrence equal mlx-lm's
// gated_delta_update on the fixture's random inputs (float32; 1e-5
// relative to the largest value, summation order differs).
func TestGatedDeltaMatchesMLXLM(t *testing.T) {
	b := newBackend(2)
	for _, c := range deltaFixture(t) {
		t.Run(c.Name, func(t *testing.T) {
			g, beta := b.DeltaGates(b.FromFloat32(fixture.F32FromBase64(t, c.A), c.L, c.Hv), b.FromFloat32(fixture.F32FromBase64(t, c.B), c.L, c.Hv),
				b.FromFloat32(fixture.F32FromBase64(t, c.ALog), c.Hv), b.FromFloat32(fixture.F32FromBase64(t, c.DtBias), c.Hv))
			closeTo(t, "g", get(t, b, g), fixture.F32FromBase64(t, c.G), 1e-6)
			closeTo(t, "beta", get(t, b, beta), fixture.F32FromBase64(t, c.Beta), 1e-6)
			y, s := b.GatedDelta(b.FromFloat32(fixture.F32FromBase64(t, c.Q), c.L, c.Hk, c.Dk), b.FromFloat32(fixture.F32FromBase64(t, c.K), c.L, c.Hk, c.Dk),
				b.FromFloat32(fixture.F32FromBase64(t, c.V), c.L, c.Hv, c.Dv), g, beta, b.FromFloat32(fixture.F32FromBase64(t, c.State), c.Hv, c.Dv, c.Dk))
			if !slices.Equal(y.Shape(), []int{c.L, c.Hv, c.Dv}) || !slices.Equal(s.Shape(), []int{c.Hv, c.Dv, c.Dk}) {
				t.Fatalf("shapes y %v state %v", y.Shape(), s.Shape())
			}
			maxRel(t, "y", get(t, b, y), fixture.F32FromBase64(t, c.Y), 1e-5)
			maxRel(t, "state", get(t, b, s), fixture.F32FromBase64(t, c.StateOut), 1e-5)
		})
	}
}

// maxRel fails when some |got−want| exceeds tol times the largest |want|.
func maxRel(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if !fixture.MaxRel(t, name, got, want, tol) {
		t.FailNow()
	}
}

// TestGatedDeltaSplitInvariant: the recurrence over L tokens at once
// equals, bit for bit, the same tokens in pieces with the state carried
// (chunked prefill then decode).
func TestGatedDeltaSplitInvariant(t *testing.T) {
	b := newBackend(2)
	c := deltaFixture(t)[2]
	q, k, v := fixture.F32FromBase64(t, c.Q), fixture.F32FromBase64(t, c.K), fixture.F32FromBase64(t, c.V)
	g, beta := b.DeltaGates(b.FromFloat32(fixture.F32FromBase64(t, c.A), c.L, c.Hv), b.FromFloat32(fixture.F32FromBase64(t, c.B), c.L, c.Hv),
		b.FromFloat32(fixture.F32FromBase64(t, c.ALog), c.Hv), b.FromFloat32(fixture.F32FromBase64(t, c.DtBias), c.Hv))
	gv, bv := get(t, b, g), get(t, b, beta)
	state0 := fixture.F32FromBase64(t, c.State)
	run := func(lo, hi int, st engine.Array) (engine.Array, engine.Array) {
		n := hi - lo
		qk := c.Hk * c.Dk
		return b.GatedDelta(b.FromFloat32(q[lo*qk:hi*qk], n, c.Hk, c.Dk), b.FromFloat32(k[lo*qk:hi*qk], n, c.Hk, c.Dk),
			b.FromFloat32(v[lo*c.Hv*c.Dv:hi*c.Hv*c.Dv], n, c.Hv, c.Dv),
			b.FromFloat32(gv[lo*c.Hv:hi*c.Hv], n, c.Hv), b.FromFloat32(bv[lo*c.Hv:hi*c.Hv], n, c.Hv), st)
	}
	yAll, sAll := run(0, c.L, b.FromFloat32(state0, c.Hv, c.Dv, c.Dk))
	want := get(t, b, yAll)
	for _, cuts := range [][]int{{1}, {3, 7, 20}, {16, 32}} {
		st := b.FromFloat32(state0, c.Hv, c.Dv, c.Dk)
		var ys []float32
		lo := 0
		for _, hi := range append(cuts, c.L) {
			var y engine.Array
			y, st = run(lo, hi, st)
			ys = append(ys, get(t, b, y)...)
			lo = hi
		}
		if !slices.Equal(ys, want) || !slices.Equal(get(t, b, st), get(t, b, sAll)) {
			t.Fatalf("split at %v differs from one pass", cuts)
		}
	}
}

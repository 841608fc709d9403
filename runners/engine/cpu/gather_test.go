package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

func ints(t *testing.T, a engine.Array) []int32 {
	t.Helper()
	x := arr(a)
	if x.dt != engine.I32 {
		t.Fatalf("dtype %v, want int32", x.dt)
	}
	return x.i32
}

func TestTopK(t *testing.T) {
	b := newBackend(2)
	x := b.FromFloat32([]float32{
		0, 2, 1, 2, // a tie: the lower index first
		-1, -1, 5, 0,
		3, 3, 3, 3,
	}, 3, 4)
	for _, c := range []struct {
		k    int
		want []int32
	}{
		{1, []int32{1, 2, 0}},
		{2, []int32{1, 3, 2, 3, 0, 1}},
		{4, []int32{1, 3, 2, 0, 2, 3, 0, 1, 0, 1, 2, 3}},
	} {
		got := b.TopK(x, c.k)
		if !slices.Equal(got.Shape(), []int{3, c.k}) || !slices.Equal(ints(t, got), c.want) {
			t.Errorf("k=%d: %v %v, want %v", c.k, got.Shape(), ints(t, got), c.want)
		}
	}
	// Random rows against a full stable sort.
	r := rand.New(rand.NewPCG(3, 4))
	const rows, n, k = 20, 37, 5
	v := randF32(r, rows*n)
	for i := range v {
		if i%7 == 0 {
			v[i] = v[i-i%n] // ties within rows
		}
	}
	got := ints(t, b.TopK(b.FromFloat32(v, rows, n), k))
	for row := range rows {
		idx := make([]int32, n)
		for i := range idx {
			idx[i] = int32(i)
		}
		vals := v[row*n : (row+1)*n]
		slices.SortStableFunc(idx, func(a, c int32) int {
			switch {
			case vals[a] > vals[c]:
				return -1
			case vals[a] < vals[c]:
				return 1
			}
			return 0
		})
		if !slices.Equal(got[row*k:(row+1)*k], idx[:k]) {
			t.Fatalf("row %d: %v, want %v", row, got[row*k:(row+1)*k], idx[:k])
		}
	}
}

func TestTakeAndArgsort(t *testing.T) {
	b := newBackend(2)
	x := b.FromFloat32([]float32{10, 11, 12, 20, 21, 22}, 2, 3)
	idx := b.FromInt32([]int32{2, 0, 1, 1}, 2, 2)
	if got := get(t, b, b.TakeAlongAxis(x, idx)); !slices.Equal(got, []float32{12, 10, 21, 21}) {
		t.Errorf("TakeAlongAxis %v", got)
	}
	rows := b.Take(x, b.FromInt32([]int32{1, 1, 0}, 3))
	if !slices.Equal(rows.Shape(), []int{3, 3}) || !slices.Equal(get(t, b, rows), []float32{20, 21, 22, 20, 21, 22, 10, 11, 12}) {
		t.Errorf("Take %v %v", rows.Shape(), get(t, b, rows))
	}
	// Take keeps the dtype (I32 routing indices, BF16 activations).
	if got := b.Take(b.FromInt32([]int32{5, 6, 7}, 3), b.FromInt32([]int32{2, 0}, 2)); !slices.Equal(ints(t, got), []int32{7, 5}) {
		t.Errorf("Take of int32: %v", ints(t, got))
	}
	bf := b.AsType(x, engine.BF16)
	if got := b.Take(bf, b.FromInt32([]int32{1}, 1)); got.DType() != engine.BF16 || !slices.Equal(get(t, b, got), []float32{20, 21, 22}) {
		t.Errorf("Take of bfloat16: %v %v", got.DType(), get(t, b, got))
	}
	s := b.Argsort(b.FromInt32([]int32{3, 1, 3, 0, 1}, 5))
	if got := ints(t, s); !slices.Equal(got, []int32{3, 1, 4, 0, 2}) { // stable
		t.Errorf("Argsort %v", got)
	}
	s2 := b.Argsort(b.FromFloat32([]float32{0.5, -1, 2, 9, 8, 7}, 2, 3))
	if got := ints(t, s2); !slices.Equal(got, []int32{1, 0, 2, 2, 1, 0}) {
		t.Errorf("Argsort rows %v", got)
	}
	for _, f := range []func(){
		func() { b.Take(x, b.FromInt32([]int32{2}, 1)) },
		func() { b.TakeAlongAxis(x, b.FromInt32([]int32{3, 0}, 2, 1)) },
		func() { b.TopK(x, 4) },
		func() { b.Take(x, b.FromFloat32([]float32{0}, 1)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("out-of-range or mistyped indices did not panic")
				}
			}()
			f()
		}()
	}
}

// TestGatherLinear: each row equals, bit for bit, Linear with that
// expert's matrix alone (dense f32/bf16, 4- and 8-bit), whatever the rows'
// grouping (sorted runs, alternating experts, one shared input row), with
// a per-expert bias.
func TestGatherLinear(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const E, out, in = 5, 13, 64
	for _, c := range []struct {
		dt       engine.DType
		bits, gs int
	}{{engine.F32, 0, 0}, {engine.BF16, 0, 0}, {engine.F32, 4, 32}, {engine.BF16, 8, 64}} {
		t.Run(fmt.Sprintf("%v-q%d", c.dt, c.bits), func(t *testing.T) {
			for _, simd := range []bool{false, true} {
				b := newBackend(3)
				b.simd = b.simd && simd
				w := randF32(r, E*out*in)
				bias := randF32(r, E*out)
				stackedL := &engine.Linear{Bits: c.bits, GroupSize: c.gs, Bias: b.FromFloat32(bias, E, out)}
				per := make([]*engine.Linear, E)
				if c.bits == 0 {
					raw, _ := halfBytes(w, engine.BF16)
					if c.dt == engine.F32 {
						stackedL.W = b.FromFloat32(w, E, out, in)
					} else {
						stackedL.W = b.FromBytes(raw, []int{E, out, in}, engine.BF16)
					}
					for e := range per {
						per[e] = &engine.Linear{W: b.Slice(stackedL.W, 0, e, e+1)}
						per[e].W = b.Reshape(per[e].W, out, in)
						if c.dt == engine.BF16 {
							per[e].W = b.FromBytes(raw[e*out*in*2:(e+1)*out*in*2], []int{out, in}, engine.BF16)
						}
					}
				} else {
					q, sc, bz, _ := quantize(w, E*out, in, c.bits, c.gs)
					wpr, ng := in*c.bits/32, in/c.gs
					scB, _ := halfBytes(sc, c.dt)
					bzB, _ := halfBytes(bz, c.dt)
					if c.dt == engine.F32 {
						scB, bzB = f32Bytes(sc), f32Bytes(bz)
					}
					es := c.dt.Size()
					stackedL.W = b.FromBytes(u32Bytes(q), []int{E, out, wpr}, engine.U32)
					stackedL.Scales = b.FromBytes(scB, []int{E, out, ng}, c.dt)
					stackedL.Biases = b.FromBytes(bzB, []int{E, out, ng}, c.dt)
					for e := range per {
						per[e] = &engine.Linear{Bits: c.bits, GroupSize: c.gs,
							W:      b.FromBytes(u32Bytes(q[e*out*wpr:(e+1)*out*wpr]), []int{out, wpr}, engine.U32),
							Scales: b.FromBytes(scB[e*out*ng*es:(e+1)*out*ng*es], []int{out, ng}, c.dt),
							Biases: b.FromBytes(bzB[e*out*ng*es:(e+1)*out*ng*es], []int{out, ng}, c.dt)}
					}
				}
				for _, experts := range [][]int32{
					{0, 0, 0, 1, 3, 3, 4, 4, 4, 4}, // sorted runs (prefill)
					{4, 0, 4, 0, 2, 1, 2, 3, 3, 0}, // unsorted
					{2},
				} {
					N := len(experts)
					x := randF32(r, N*in)
					xa := b.FromFloat32(x, N, in)
					got := get(t, b, b.GatherLinear(xa, stackedL, b.FromInt32(experts, N), slices.IsSorted(experts)))
					// shared: one input row for every expert
					shared := get(t, b, b.GatherLinear(b.FromFloat32(x[:in], 1, in), stackedL, b.FromInt32(experts, N), false))
					for n, e := range experts {
						want := get(t, b, b.Linear(b.FromFloat32(x[n*in:(n+1)*in], 1, in), per[e]))
						row0 := get(t, b, b.Linear(b.FromFloat32(x[:in], 1, in), per[e]))
						for j := range out {
							want[j] += bias[int(e)*out+j]
							row0[j] += bias[int(e)*out+j]
						}
						if !slices.Equal(got[n*out:(n+1)*out], want) {
							t.Fatalf("simd %v experts %v row %d: %v, want %v", simd, experts, n, got[n*out:(n+1)*out], want)
						}
						if !slices.Equal(shared[n*out:(n+1)*out], row0) {
							t.Fatalf("simd %v experts %v row %d with the shared input differs", simd, experts, n)
						}
					}
				}
			}
		})
	}
}

func f32Bytes(v []float32) []byte {
	out := make([]byte, 0, 4*len(v))
	for _, x := range v {
		out = append(out, asBytes([]float32{x})...)
	}
	return out
}

package engine

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// fixedRank is a Collective that only says which rank it is (the loader's
// slicing reads nothing else).
type fixedRank struct{ r, n int }

func (f fixedRank) Rank() int                       { return f.r }
func (f fixedRank) Size() int                       { return f.n }
func (f fixedRank) AllSum(_ Backend, x Array) Array { return x }

// TestShareReassembles: over random shapes, axes, segment lists and rank
// counts, the ranks' shares of a tensor (cut, take) are disjoint and put
// back together segment by segment give the tensor again; a segment that
// does not split evenly is refused.
func TestShareReassembles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		n := 1 + rng.IntN(4)
		nd := 1 + rng.IntN(4)
		shape := make([]int, nd)
		for i := range shape {
			shape[i] = 1 + rng.IntN(4)
		}
		axis := rng.IntN(nd)
		nseg := 1 + rng.IntN(3)
		segs := make([]int, nseg)
		length := 0
		for i := range segs {
			segs[i] = n * (1 + rng.IntN(3))
			length += segs[i]
		}
		shape[axis] = length
		esz := []int{1, 2, 4}[rng.IntN(3)]
		numel := esz
		for _, d := range shape {
			numel *= d
		}
		data := make([]byte, numel)
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		name := fmt.Sprintf("iter %d: shape %v axis %d segs %v n %d", iter, shape, axis, segs, n)
		// parts[r][s] is rank r's share of segment s.
		parts := make([][][]byte, n)
		for r := range n {
			l := &loader{tp: fixedRank{r, n}}
			ranges, err := l.cut(length, segs)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got, gs := take(data, shape, esz, axis, ranges)
			if gs[axis] != length/n {
				t.Fatalf("%s: rank %d holds %d of the axis, want %d", name, r, gs[axis], length/n)
			}
			// Split the share back into its segments, row by row.
			inner := esz
			for _, d := range shape[axis+1:] {
				inner *= d
			}
			outer := len(got) / (gs[axis] * inner)
			parts[r] = make([][]byte, nseg)
			for o := range outer {
				off := o * gs[axis] * inner
				for s, sl := range segs {
					k := sl / n * inner
					parts[r][s] = append(parts[r][s], got[off:off+k]...)
					off += k
				}
			}
		}
		// Reassemble: for each outer row, each segment, each rank's rows.
		inner := esz
		for _, d := range shape[axis+1:] {
			inner *= d
		}
		outer := len(data) / (length * inner)
		var back []byte
		for o := range outer {
			for s, sl := range segs {
				k := sl / n * inner
				for r := range n {
					back = append(back, parts[r][s][o*k:(o+1)*k]...)
				}
			}
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("%s: the ranks' shares do not reassemble the tensor", name)
		}
	}
	l := &loader{tp: fixedRank{0, 3}}
	if _, err := l.cut(10, []int{6, 4}); err == nil {
		t.Fatal("a segment of 4 split over 3 ranks was accepted")
	}
	if _, err := l.cut(10, []int{6, 3}); err == nil {
		t.Fatal("segments summing to 9 for an axis of 10 were accepted")
	}
}

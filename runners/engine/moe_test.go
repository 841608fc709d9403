package engine

import (
	"math"
	"slices"
	"testing"
)

func TestRoute(t *testing.T) {
	// Two tokens, four experts.
	logits := []float32{
		0, 2, 1, 2, // a tie between 1 and 3: the lower index first
		-1, -1, 5, 0,
	}
	experts, weights := route(logits, 2, 4, 2, false)
	if !slices.Equal(experts[0], []int{1, 3}) || !slices.Equal(experts[1], []int{2, 3}) {
		t.Fatalf("experts %v", experts)
	}
	sum0 := 1 + 2*math.Exp(2) + math.Exp(1)
	if w := weights[0][0]; math.Abs(w-math.Exp(2)/sum0) > 1e-12 {
		t.Errorf("weight %v, want the softmax probability %v", w, math.Exp(2)/sum0)
	}
	_, normed := route(logits, 2, 4, 2, true)
	for tok, w := range normed {
		if math.Abs(w[0]+w[1]-1) > 1e-12 || w[0] < w[1] {
			t.Errorf("token %d: renormalized weights %v", tok, w)
		}
	}
	if e, _ := route(logits, 2, 4, 4, false); !slices.Equal(e[1], []int{2, 3, 0, 1}) {
		t.Errorf("k = E: %v", e[1])
	}
}

package gen

import (
	"errors"
	"math"
	"testing"
)

// TestDefaultsSampling: unset fields take the neutral values, set ones
// are checked against their range and named in the error.
func TestDefaultsSampling(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	k := func(v int) *int { return &v }
	s, err := Defaults{}.Sampling()
	if err != nil || s.Temperature != 1 || s.TopP != 1 || s.RepetitionPenalty != 1 || s.TopK != 0 || s.MinP != 0 {
		t.Fatalf("empty defaults: %+v %v", s, err)
	}
	s, err = Defaults{Temperature: f(0), TopP: f(0.5), TopK: k(-1), MinP: f(0.1), RepetitionPenalty: f(1.2)}.Sampling()
	if err != nil || s.Temperature != 0 || s.TopP != 0.5 || s.TopK != 0 || s.MinP != 0.1 || s.RepetitionPenalty != 1.2 {
		t.Fatalf("set defaults: %+v %v", s, err)
	}
	for _, c := range []struct {
		d     Defaults
		field string
	}{
		{Defaults{Temperature: f(2.5)}, "temperature"},
		{Defaults{Temperature: f(math.NaN())}, "temperature"},
		{Defaults{TopP: f(0)}, "top_p"},
		{Defaults{TopK: k(-2)}, "top_k"},
		{Defaults{MinP: f(1.5)}, "min_p"},
		{Defaults{RepetitionPenalty: f(0)}, "repetition_penalty"},
	} {
		var fe *FieldError
		if err := c.d.Check(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: got %v, want a FieldError on %s", c.d, err, c.field)
		}
	}
	if got := (Defaults{TopK: k(3)}).Over(Defaults{TopK: k(5), MinP: f(0.2)}); *got.TopK != 5 || *got.MinP != 0.2 || got.Temperature != nil {
		t.Fatalf("Over: %+v", got)
	}
}

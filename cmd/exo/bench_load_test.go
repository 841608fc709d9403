package main

import (
	"net/http"
	"strings"
	"testing"
)

func TestPercentile(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(100 - i) // 100..1, unsorted
	}
	tests := []struct {
		name string
		v    []float64
		p    float64
		want float64
	}{
		{"empty", nil, 50, 0},
		{"one", []float64{7}, 99, 7},
		{"p50 of 1..100", hundred, 50, 50},
		{"p99 of 1..100", hundred, 99, 99},
		{"p100 of 1..100", hundred, 100, 100},
		{"p50 of 4", []float64{4, 1, 3, 2}, 50, 2},
		{"p99 of 4", []float64{4, 1, 3, 2}, 99, 4},
		{"p1 of 3", []float64{3, 1, 2}, 1, 1},
	}
	for _, tt := range tests {
		if got := percentile(tt.v, tt.p); got != tt.want {
			t.Errorf("%s: percentile(%v) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
	if hundred[0] != 100 {
		t.Error("percentile sorted its input in place")
	}
}

// 429 is the only failure load mode tolerates.
func TestLoadErr(t *testing.T) {
	tests := []struct {
		name string
		r    loadResult
		want string // "" = no error
	}{
		{"all ok", loadResult{OK: 10}, ""},
		{"429s only", loadResult{OK: 10, Status: map[int]int{http.StatusTooManyRequests: 3}}, ""},
		{"a 503", loadResult{Status: map[int]int{429: 1, 503: 2}, FirstError: "HTTP 503: x"}, "2 requests failed"},
		{"transport", loadResult{Failed: 1, FirstError: "EOF"}, "1 requests failed other than with 429 (first: EOF)"},
	}
	for _, tt := range tests {
		err := loadErr(tt.r)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: got %v, want %q", tt.name, err, tt.want)
		}
	}
}

// Each request's peak is the most in flight at once during its life.
func TestFlights(t *testing.T) {
	var f flights
	a := f.begin() // 1
	b := f.begin() // 2
	if got := f.end(a); got != 2 {
		t.Errorf("a peak %d, want 2", got)
	}
	c := f.begin() // b, c: 2
	d := f.begin() // 3
	if got := f.end(b); got != 3 {
		t.Errorf("b peak %d, want 3", got)
	}
	if got := f.end(d); got != 3 {
		t.Errorf("d peak %d, want 3", got)
	}
	e := f.begin() // c, e: 2
	if got := f.end(e); got != 2 {
		t.Errorf("e peak %d, want 2", got)
	}
	if got := f.end(c); got != 3 {
		t.Errorf("c peak %d, want 3", got)
	}
}

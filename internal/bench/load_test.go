package bench

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

func TestPrintLoad(t *testing.T) {
	var sb strings.Builder
	err := printLoad(&sb, loadResult{PP: 300, TG: 32, Mode: "remote", Streams: 64, Duration: 60.2, OK: 10,
		Status: map[int]int{503: 1, 429: 5}, MinInFlightAt429: 21, TTFTP50: 0.5, TTFTP99: 1.25, LatencyP50: 0.75, LatencyP99: 1.5,
		AggregateTPS: 100, FirstError: "HTTP 503: down"})
	out := sb.String()
	for _, want := range []string{
		"pp=300 tg=32 remote: 64 streams for 60.2s: 10 ok, 5 × HTTP 429, 1 × HTTP 503, 0 failed otherwise\n",
		"429s came with at least 21 requests in flight",
		"TTFT p50 0.500s p99 1.250s; latency p50 0.750s p99 1.500s; 100.0 gen tok/s together",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "1 requests failed other than with 429 (first: HTTP 503: down)") {
		t.Errorf("err %v", err)
	}
}

package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	logDecision = regexp.MustCompile(`msg="route decision".* req=(\S+) .*route=(\w+) .*predicted_local=(\S+) predicted_remote=(\S+)`)
	logRemote   = regexp.MustCompile(`msg="remote prefill".* req=(\S+) .*outcome=ok .*duration=(\S+)`)
)

// TestCostRoutePredictionError: over real runners (local prefill slowed so
// remote wins), sequential long prompts of growing length; for each the
// predicted remote fill time (route decision log) is compared with the
// measured one (remote prefill log). The median relative error is logged,
// not asserted (timings are not asserted in this project; recorded in
// docs/BENCHMARKS.md): the test asserts that every prompt went remote and
// was predicted.
func TestCostRoutePredictionError(t *testing.T) {
	dir := tinyModel(t, "main")
	pre := start(t, "prefill", "prefill", "--model", dir, "--prefix-cache-mib", "0")
	dec := start(t, "decode", "decode", "--model", dir, "--prefill", pre.listen, "--remote-prefill-route", "cost",
		"--remote-prefill-min-tokens", "64", "--test-slow-prefill-tokens-per-sec", "300")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(dec.logs(), "remote prefill calibrated") {
		if time.Now().After(deadline) {
			t.Fatalf("not calibrated:\n%s", tail(dec.logs(), 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range 8 {
		text := fmt.Sprintf("prompt %d: ", i) + strings.Repeat("the quick brown fox jumps over the lazy dog ", 20+10*i)
		if r := chatStream(t, dec.listen, []msg{{Role: "user", Content: text}}, 1, nil); r.Status != 200 {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	// The runner's log reaches us through a pipe: wait for the last line.
	logs := dec.logs()
	for end := time.Now().Add(5 * time.Second); len(logRemote.FindAllString(logs, -1)) < 8 && time.Now().Before(end); logs = dec.logs() {
		time.Sleep(20 * time.Millisecond)
	}
	pred := map[string]time.Duration{}
	for _, m := range logDecision.FindAllStringSubmatch(logs, -1) {
		if m[2] != "remote" {
			t.Fatalf("request %s routed %s with local slowed:\n%s", m[1], m[2], tail(logs, 4000))
		}
		d, err := time.ParseDuration(m[4])
		if err != nil {
			t.Fatal(err)
		}
		pred[m[1]] = d
	}
	var errs []float64
	for _, m := range logRemote.FindAllStringSubmatch(logs, -1) {
		got, err := time.ParseDuration(m[2])
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := pred[m[1]]; ok && p > 0 {
			e := (got.Seconds() - p.Seconds()) / p.Seconds()
			errs = append(errs, e)
			t.Logf("%s: predicted %v, measured %v (%+.0f %%)", m[1], p, got, 100*e)
		}
	}
	if len(errs) != 8 {
		t.Fatalf("%d predicted remote fills, want 8:\n%s", len(errs), tail(logs, 4000))
	}
	abs := make([]float64, len(errs))
	for i, e := range errs {
		abs[i] = max(e, -e)
	}
	slices.Sort(abs)
	med := (abs[3] + abs[4]) / 2
	t.Logf("median |error| %.0f %%", 100*med)
}

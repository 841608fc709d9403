package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestCostRouteOverRealRunners: a decode runner with --remote-prefill-route
// cost calibrates its local prefill and probes the prefill runner's link at
// start, then routes a long prompt by prediction (not blind: the reason is
// never "unmeasured"), counts the decision by route and reason, follows it
// (skipped_cost when local, ok when remote) and records its prediction error.
func TestCostRouteOverRealRunners(t *testing.T) {
	dir := tinyModel(t, "main")
	pre := start(t, "prefill", "prefill", "--model", dir)
	dec := start(t, "decode", "decode", "--model", dir, "--prefill", pre.listen, "--remote-prefill-route", "cost",
		"--remote-prefill-min-tokens", "64")
	dec.waitRecords(t, "remote prefill calibrated", 1, 20*time.Second)
	dec.waitRecords(t, "local prefill calibrated", 1, 20*time.Second)
	res := chatStream(t, dec.listen, []msg{{Role: "user", Content: strings.Repeat("the quick brown fox jumps over the lazy dog ", 60)}}, 4, nil)
	if res.Status != 200 || !res.Done {
		t.Fatalf("chat: %+v", res)
	}
	series := func(route, reason string) string {
		return `exo_remote_prefill_decisions_total{reason="` + reason + `",route="` + route + `"}`
	}
	local := dec.metric(t, series("local", "faster")) + dec.metric(t, series("local", "within_hysteresis"))
	remote := dec.metric(t, series("remote", "faster"))
	if local+remote != 1 {
		t.Fatalf("decisions local %v remote %v, want one measured decision:\n%s", local, remote, tail(dec.logs(), 3000))
	}
	if local == 1 && dec.metric(t, outcome("skipped_cost")) != 1 {
		t.Fatalf("routed local but outcome skipped_cost = %v", dec.metric(t, outcome("skipped_cost")))
	}
	if remote == 1 && dec.metric(t, outcome("ok")) != 1 {
		t.Fatalf("routed remote but outcome ok = %v", dec.metric(t, outcome("ok")))
	}
	if got := dec.metric(t, "exo_route_prediction_error_ratio_count"); got != 1 {
		t.Fatalf("prediction errors observed %v, want 1", got)
	}
	t.Logf("routed local=%v remote=%v", local, remote)
}

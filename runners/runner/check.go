package runner

import (
	"errors"
	"fmt"
	"math"

	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/tensor"
)

// Check says why c's settings do not go together, naming the flag
// (cmd/exo refuses them as a usage error; Run refuses them before it
// starts anything). A decode runner's own flags are checked only on a
// decode runner (cmd/exo refuses them on a prefill runner by not
// defining them).
func (c *Config) Check() error {
	switch {
	case c.Role != "decode" && c.Role != "prefill":
		return fmt.Errorf("role %q: want decode or prefill", c.Role)
	case c.Model == "":
		return errors.New("--model is required")
	case c.Name == "":
		return errors.New("--served-name is required")
	case c.Listen == "":
		return errors.New("--listen is required")
	case c.Role == "prefill" && c.MetricsAddr == "":
		return errors.New("prefill needs --metrics HOST:PORT")
	case c.ReadHeaderTimeout <= 0:
		return errors.New("--read-header-timeout must be positive")
	case c.TestPrefillRate < 0 || math.IsNaN(c.TestPrefillRate) || math.IsInf(c.TestPrefillRate, 0):
		return errors.New("--test-slow-prefill-tokens-per-sec must be a finite number ≥ 0")
	}
	if c.Role == "decode" {
		if err := c.checkDecode(); err != nil {
			return err
		}
	}
	if err := c.CheckTensor(); err != nil {
		return err
	}
	if c.Tensor != "" && c.TestPrefillRate > 0 {
		return errors.New("--test-slow-prefill-tokens-per-sec is not supported with --tensor")
	}
	if err := c.checkStage(); err != nil {
		return err
	}
	if err := c.checkRoute(); err != nil {
		return err
	}
	if err := c.Defaults.Check(); err != nil {
		return fmt.Errorf("--default-*: %w", err)
	}
	return nil
}

// checkDecode checks a decode runner's own flags.
func (c *Config) checkDecode() error {
	prefill, health := SplitList(c.Prefill), SplitList(c.PrefillHealth)
	switch {
	case c.Route != "" && c.Route != RouteCost && c.Route != RouteFloor:
		return fmt.Errorf("--remote-prefill-route %q: want %s or %s", c.Route, RouteCost, RouteFloor)
	case decode.CheckSpeculative(c.Speculative, c.SpecTokens) != nil:
		return fmt.Errorf("--speculative %q --speculative-tokens %d: %w", c.Speculative, c.SpecTokens, decode.CheckSpeculative(c.Speculative, c.SpecTokens))
	case c.SpecTokens != 0 && (c.Speculative == "" || c.Speculative == decode.SpecOff):
		return fmt.Errorf("--speculative-tokens %d with --speculative %q: it bounds the drafts of --speculative prompt-lookup or draft", c.SpecTokens, c.Speculative)
	case (c.Speculative == decode.SpecDraft) != (c.Draft != ""):
		return fmt.Errorf("--speculative %q with --draft %q: --draft is the draft model of --speculative draft, and that mode needs it", c.Speculative, c.Draft)
	case c.ConnectTimeout <= 0:
		return errors.New("--prefill-connect-timeout must be positive")
	case c.KVWireDType != "native" && c.KVWireDType != "fp8":
		return fmt.Errorf("--kv-wire-dtype %q: want native or fp8", c.KVWireDType)
	case c.PrefillHealth != "" && len(health) != len(prefill):
		return fmt.Errorf("--prefill-health lists %d addresses, --prefill %d: want one per prefill endpoint, in the same order", len(health), len(prefill))
	case c.KVStreams < 1 || c.KVStreams > kvwire.MaxStreams:
		return fmt.Errorf("--kv-streams %d: want 1 to %d", c.KVStreams, kvwire.MaxStreams)
	case c.IdleFloor <= 0:
		return errors.New("--prefill-idle-floor must be positive")
	}
	if _, _, err := decode.ParsePrefillEndpoints(prefill); c.Prefill != "" && err != nil {
		return fmt.Errorf("--prefill: %w", err)
	}
	return nil
}

// checkStage refuses a pipeline stage's flags that do not go together.
func (c *Config) checkStage() error {
	given := map[string]bool{"--layers": !c.Layers.IsZero(), "--stage": c.Stages > 0, "--stage-listen": c.StageListen != "", "--stage-next": c.StageNext != ""}
	if c.Stages == 0 {
		for _, name := range []string{"--layers", "--stage-listen", "--stage-next"} {
			if given[name] {
				return fmt.Errorf("%s is a pipeline stage's: it needs --stage I/N (and --layers, --stage-listen, --stage-next)", name)
			}
		}
		return nil
	}
	if c.Stages < 2 || c.Stage < 0 || c.Stage >= c.Stages {
		return fmt.Errorf("--stage %d/%d: want I/N with N ≥ 2 and 0 ≤ I < N", c.Stage, c.Stages)
	}
	follower := false // rank > 0 of a stage's tensor group: it talks only to its rank 0
	if c.Tensor != "" {
		if c.Role == "prefill" {
			return errors.New("--tensor with --stage on a prefill runner: a prefill stage is not tensor-parallel")
		}
		rank, _, err := tensor.ParseRank(c.Tensor)
		if err != nil {
			return err
		}
		follower = rank > 0
	}
	for _, name := range []string{"--layers", "--stage-listen", "--stage-next"} {
		switch {
		case follower && name != "--layers" && given[name]:
			return fmt.Errorf("%s with --tensor %s: a stage's rank > 0 talks only to its rank 0 over the tensor link; only rank 0 (--tensor 0/N) is on the stage ring", name, c.Tensor)
		case !given[name] && (!follower || name == "--layers"):
			return fmt.Errorf("--stage %d/%d needs %s", c.Stage, c.Stages, name)
		}
	}
	switch {
	case c.Stage == 0 && c.Layers.Start != 0:
		return fmt.Errorf("--stage 0/%d holds the embedding: its --layers start at 0, not %d", c.Stages, c.Layers.Start)
	case c.TestPrefillRate > 0:
		return errors.New("--test-slow-prefill-tokens-per-sec with --stage: a pipeline stage is not paced")
	}
	return nil
}

// The remote prefill routes (--remote-prefill-route).
const (
	// RouteCost routes a long prompt by predicted time (measured rates,
	// queues and links; --remote-prefill-min-tokens a floor).
	RouteCost = "cost"
	// RouteFloor routes by --remote-prefill-min-tokens alone.
	RouteFloor = "floor"
)

// noCostRoute says why this decode runner cannot route by cost ("": it
// can): the cost model calibrates on a whole model's local prefill and
// measures whole prefill runners, so a pipeline stage, a tensor rank and
// a runner fed by prefill stages or prefill ranks route by the floor.
func (c *Config) noCostRoute() string {
	switch {
	case c.Role != "decode":
		return "a prefill runner does not route"
	case c.Stages > 0:
		return "with --stage: a pipeline stage routes by --remote-prefill-min-tokens alone (the cost model calibrates on a whole model's local prefill)"
	case c.Tensor != "":
		return "with --tensor: a tensor rank routes by --remote-prefill-min-tokens alone (the cost model calibrates on a whole model's local prefill)"
	}
	if _, parts, err := decode.ParsePrefillEndpoints(SplitList(c.Prefill)); err == nil && len(parts) > 0 {
		return "with --prefill stages or ranks (ADDR@A:B, ADDR#H0:H1): the cost route measures whole prefill runners"
	}
	return ""
}

// checkRoute refuses --remote-prefill-route cost where it cannot be
// honoured (its default, "", is cost where it can be and the floor
// elsewhere).
func (c *Config) checkRoute() error {
	if c.Role != "decode" || c.Route != RouteCost {
		return nil
	}
	if why := c.noCostRoute(); why != "" {
		return fmt.Errorf("--remote-prefill-route cost %s: leave the flag out or give floor", why)
	}
	return nil
}

// costRoute says whether remote prefill routes by predicted time:
// --remote-prefill-route cost, or its default where the cost model applies.
func (c *Config) costRoute() bool {
	return c.Route != RouteFloor && c.noCostRoute() == ""
}

package stage

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/mlx"
	"github.com/exo-pd/exo-pd/runners/internal/groupaddr"
)

// MLXPlan is where a stage's rank of MLX's ring listens and what it joins.
type MLXPlan struct {
	// Stage, Stages: the stage's place (its MLX rank is its stage index).
	Stage, Stages int
	// Listen and Next are the stage's --stage-listen and --stage-next:
	// with two stages and no MLX_HOSTFILE, rank i's ring listens on stage
	// i's stage link port + 1 (runner_port_base + 10i + 4: the tensor
	// link's port, which a pipelined model does not use).
	Listen, Next string
	// StallAfter bounds one MLX evaluation (default 10 min, well over a
	// prefill chunk): past it the group is taken for lost (a receive
	// whose sender died never returns).
	StallAfter time.Duration
}

// MLXGroup makes the stage's Group over MLX's ring backend on b, or says
// why the stage cannot offer one (nil Group: the hidden states stay in
// the stage link's Steps; the Transport, "tcp", has the reason). The ring's hostfile is MLX_HOSTFILE with
// MLX_RANK when set (MLX_RANK must be the stage's index, the file list
// every stage: any number of them); otherwise, for two stages, one
// written from Listen and Next (port + 1).
// The caller sets the Group's OnLost.
func MLXGroup(b engine.Backend, p MLXPlan) (*Group, Transport) {
	if b == nil || b.Name() == "cpu" {
		return nil, onLink(ReasonCPUBackend, "the cpu backend has no distributed engine")
	}
	avail, err := mlx.DistributedAvailable(b, "ring")
	switch {
	case err != nil:
		return nil, onLink(ReasonNoRing, err.Error())
	case !avail:
		return nil, onLink(ReasonNoRing, "this libmlx has no ring backend (mlx_distributed_is_available(\"ring\") is false)")
	}
	addrs, whole, why := ringPlan(p, os.Getenv("MLX_HOSTFILE"), os.Getenv("MLX_RANK"))
	if why != "" {
		return nil, onLink(ReasonRingPlan, why)
	}
	stall := p.StallAfter
	if stall <= 0 {
		stall = 10 * time.Minute
	}
	g := &Group{Transport: "mlx", Whole: whole}
	g.Join = func() (engine.Carrier, error) {
		if addrs != nil {
			path, err := mlx.WriteRingHostfile(addrs)
			if err != nil {
				return nil, err
			}
			os.Setenv("MLX_HOSTFILE", path)
			os.Setenv("MLX_RANK", strconv.Itoa(p.Stage))
		}
		c, err := mlx.JoinGroup(b, mlx.GroupOptions{Backend: "ring", Strict: true, StallAfter: stall, OnStall: func(d time.Duration) {
			g.OnLost(fmt.Errorf("%w: an MLX evaluation has run %v (a stage died or hung mid-transfer)", ErrGroupLost, d.Round(time.Second)))
		}})
		if err != nil {
			return nil, fmt.Errorf("stage: join MLX's ring (MLX_HOSTFILE %s, MLX_RANK %s): %w", os.Getenv("MLX_HOSTFILE"), os.Getenv("MLX_RANK"), err)
		}
		if c.Rank() != p.Stage || c.Size() != p.Stages {
			c.Close()
			return nil, fmt.Errorf("stage: MLX's ring says rank %d of %d, this is stage %d of %d", c.Rank(), c.Size(), p.Stage, p.Stages)
		}
		return &mlxCarrier{c: c, prev: (p.Stage + p.Stages - 1) % p.Stages, next: (p.Stage + 1) % p.Stages}, nil
	}
	return g, Offered()
}

// mlxCarrier carries a stage's hidden states over MLX's ring: from the
// previous rank, to the next (the ring backend's neighbours).
type mlxCarrier struct {
	c          *mlx.Collective
	prev, next int
}

func (m *mlxCarrier) Recv(shape []int, dt engine.DType) engine.Array {
	return m.c.Recv(shape, dt, m.prev)
}
func (m *mlxCarrier) Send(x engine.Array) engine.Array { return m.c.Send(x, m.next) }

// ringPlan is where the stage's rank of MLX's ring comes from: hostfile
// (MLX_HOSTFILE, with rank its MLX_RANK), which must name this stage's
// rank and list every stage (whole: the supervisor writes one for a
// pipeline whose stages all run MLX alone, any number of them); without
// it, for two stages, the addresses of the hostfile to write (write, from
// Listen and Next). why says why the stage cannot offer the ring.
func ringPlan(p MLXPlan, hostfile, rank string) (write []string, whole bool, why string) {
	if hostfile != "" {
		if rank != strconv.Itoa(p.Stage) {
			return nil, false, fmt.Sprintf("MLX_HOSTFILE is set with MLX_RANK %q, not this stage's index %d", rank, p.Stage)
		}
		b, err := os.ReadFile(hostfile)
		if err != nil {
			return nil, false, fmt.Sprintf("MLX_HOSTFILE: %v", err)
		}
		var hosts [][]string
		if err := json.Unmarshal(b, &hosts); err != nil {
			return nil, false, fmt.Sprintf("MLX_HOSTFILE %s: not MLX's ring hostfile (a JSON list of each rank's addresses): %v", hostfile, err)
		}
		if len(hosts) != p.Stages {
			return nil, false, fmt.Sprintf("MLX_HOSTFILE %s lists %d ranks; this pipeline has %d stages", hostfile, len(hosts), p.Stages)
		}
		return nil, true, ""
	}
	if p.Stages != 2 {
		return nil, false, fmt.Sprintf("%d stages need MLX_HOSTFILE and MLX_RANK (the supervisor writes them where every stage runs MLX; a runner writes its own for two stages only)", p.Stages)
	}
	own, err1 := groupaddr.After(p.Listen)
	next, err2 := groupaddr.After(p.Next)
	if err1 != nil || err2 != nil {
		return nil, false, fmt.Sprintf("no ring address from --stage-listen %q / --stage-next %q: %v", p.Listen, p.Next, firstErr(err1, err2))
	}
	if p.Stage == 1 {
		return []string{next, own}, false, ""
	}
	return []string{own, next}, false, ""
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

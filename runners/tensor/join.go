package tensor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/mlx"
	"github.com/exo-pd/exo-pd/runners/internal/bounded"
	"github.com/exo-pd/exo-pd/runners/internal/groupaddr"
)

// ParseRank parses a runner's --tensor value "I/N" (0 ≤ I < N, N ≥ 2).
func ParseRank(s string) (rank, size int, err error) {
	a, b, ok := strings.Cut(s, "/")
	if ok {
		rank, err = strconv.Atoi(a)
		if err == nil {
			size, err = strconv.Atoi(b)
		}
	}
	if !ok || err != nil || size < 2 || size > 1<<16-1 || rank < 0 || rank >= size {
		return 0, 0, fmt.Errorf("--tensor %q: want I/N, rank I of N ranks (0 ≤ I < N, N ≥ 2)", s)
	}
	return rank, size, nil
}

// RankConfig is one runner's place in a tensor-parallel group.
type RankConfig struct {
	// Rank and Size: --tensor I/N.
	Rank, Size int
	// Peers are the ranks' tensor addresses in rank order
	// (--tensor-peers): rank 0 listens for the tensor link on Peers[0].
	// On MLX's ring backend rank i's ring listens on Peers[i]'s port + 1
	// unless MLX_HOSTFILE is already set.
	Peers []string
	// RDMA, when set (--tensor-rdma), is the JACCL device matrix
	// (ParseRDMA): on MLX the ranks join JACCL instead of the ring when
	// this libmlx has it, and fall back to the ring (logged) when not.
	RDMA [][]string
	// Secret authenticates the tensor link.
	Secret []byte
	// Model labels the metrics.
	Model   string
	Metrics *Metrics
	Logger  *slog.Logger
	// LinkTimeout bounds, on MLX, the wait for every rank's tensor link
	// before joining MLX's group (0: DefaultLinkTimeout); JoinTimeout the
	// join itself once every rank linked (0: DefaultJoinTimeout). Past
	// either the rank's Collective fails naming the peers, and the
	// runner exits for the supervisor to restart it.
	LinkTimeout, JoinTimeout time.Duration
}

// DefaultLinkTimeout leaves a rank's peers time to resolve their model
// (a download included) and open their backend before they link.
const DefaultLinkTimeout = 10 * time.Minute

// DefaultJoinTimeout bounds MLX's join once every rank linked (and so is
// at its join): a rank dead before joining would leave it waiting for
// ever (as runners/stage's Group.JoinTimeout).
const DefaultJoinTimeout = 2 * time.Minute

// Rank is this process's rank: Leader on rank 0, Follower elsewhere.
type Rank struct {
	Leader   *Leader
	Follower *Follower
	l        net.Listener
	// served is rank 0's Leader.Serve's end once it serves (on MLX from
	// before the join: the followers link first); stop ends it.
	served chan error
	stop   context.CancelFunc
	// MLX is whether the ranks sum through MLX's group (a lost rank
	// cannot rejoin it: every rank exits).
	MLX bool
	// sums is how the rank's all_sums run, once Collective chose.
	sums sumsReport
}

// Sums is how the rank's all_sums run (zero before its collective is
// made).
func (r *Rank) Sums() Sums { return r.sums.get() }

// Check validates c without side effects.
func (c RankConfig) Check() error {
	if len(c.Peers) != c.Size {
		return fmt.Errorf("--tensor-peers lists %d addresses for %d ranks: want one per rank, in rank order", len(c.Peers), c.Size)
	}
	for i, p := range c.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return fmt.Errorf("--tensor-peers: rank %d's address %q: %w", i, p, err)
		}
	}
	if c.RDMA != nil {
		return CheckMesh(c.RDMA, c.Size)
	}
	return nil
}

// Listen makes rank 0's tensor link listener (before the model loads, so
// that followers can link as soon as they are loaded) and the rank's
// Leader or Follower.
func Listen(c RankConfig) (*Rank, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	r := &Rank{}
	var err error
	if c.Rank == 0 {
		r.Leader, err = NewLeader(LeaderConfig{Size: c.Size, Secret: c.Secret, Rejoin: true, Logger: c.Logger})
		if err != nil {
			return nil, err
		}
		r.l, err = net.Listen("tcp", c.Peers[0])
		if err != nil {
			return nil, fmt.Errorf("tensor: listen %s (--tensor-peers' rank 0): %w", c.Peers[0], err)
		}
		return r, nil
	}
	r.Follower, err = NewFollower(FollowerConfig{Rank: c.Rank, Size: c.Size, Leader: c.Peers[0], Secret: c.Secret,
		Rejoin: true, Logger: c.Logger})
	return r, err
}

// Collective returns the collective the rank's model loads with (metered
// in c.Metrics): the link's all_sum on the cpu backend, MLX's group (the
// ring over the peers' hosts, or what MLX_HOSTFILE / MLX_RANK already
// say) on mlx. Joining MLX's group blocks until its neighbours joined.
func (r *Rank) Collective(c RankConfig, b engine.Backend) (engine.Collective, error) {
	if r.Leader != nil {
		r.Leader.cfg.Backend = b.Name()
	} else {
		r.Follower.cfg.Backend = b.Name()
	}
	if b.Name() == "cpu" {
		var coll engine.Collective
		if r.Leader != nil {
			coll = r.Leader.Collective()
		} else {
			coll = r.Follower.Collective()
		}
		r.sums.set(Sums{Group: "link"}, c.Metrics, c.Model, c.Rank)
		return Meter(coll, c.Metrics, c.Model), nil
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	// MLX on a Linux GPU is CUDA: its ranks sum over NCCL.
	cuda := b.Name() == "mlx-gpu" && runtime.GOOS == "linux"
	bk, why := chooseMLXBackend(c, cuda, func(name string) (bool, error) { return mlx.DistributedAvailable(b, name) })
	sums := mlxSums(bk, why, cuda)
	if why != "" && cuda {
		c.Logger.Warn("tensor: NCCL unavailable, falling back to MLX's ring", "reason", why)
	} else if why != "" {
		c.Logger.Warn("tensor: JACCL unavailable, falling back to MLX's ring", "reason", why)
	}
	switch {
	case bk == "nccl" && os.Getenv("NCCL_HOST_IP") == "":
		env, err := ncclEnv(c)
		if err != nil {
			return nil, err
		}
		for k, v := range env {
			os.Setenv(k, v)
		}
		c.Logger.Info("tensor: joining MLX's NCCL group (unverified here: no GPU)", "host", env["NCCL_HOST_IP"], "port", env["NCCL_PORT"])
	case bk == "nccl":
		c.Logger.Info("tensor: joining MLX's NCCL group with the environment's NCCL_HOST_IP, NCCL_PORT, MLX_RANK, MLX_WORLD_SIZE")
	case bk == "jaccl":
		env, err := jacclEnv(c, "")
		if err != nil {
			return nil, err
		}
		for k, v := range env {
			os.Setenv(k, v)
		}
		c.Logger.Info("tensor: joining MLX's JACCL group", "coordinator", env["MLX_JACCL_COORDINATOR"], "devices", env["MLX_IBV_DEVICES"])
	case os.Getenv("MLX_HOSTFILE") == "":
		addrs, err := ringAddrs(c.Peers)
		if err != nil {
			return nil, err
		}
		path, err := mlx.WriteRingHostfile(addrs)
		if err != nil {
			return nil, err
		}
		os.Setenv("MLX_HOSTFILE", path)
		os.Setenv("MLX_RANK", strconv.Itoa(c.Rank))
	}
	// Every rank links first (the hellos refuse a rank on another
	// backend or group by name), then joins, within the bounds.
	if c.LinkTimeout <= 0 {
		c.LinkTimeout = DefaultLinkTimeout
	}
	if c.JoinTimeout <= 0 {
		c.JoinTimeout = DefaultJoinTimeout
	}
	var lost <-chan struct{}
	if r.Leader != nil {
		r.Leader.cfg.Rejoin, r.Leader.cfg.MLX, r.Leader.cfg.Group = false, true, bk
		r.serve()
		c.Logger.Info("tensor: waiting for every rank to link before joining MLX's group", "group", bk, "timeout", c.LinkTimeout)
		if err := r.Leader.awaitWhole(c.LinkTimeout, c.Peers); err != nil {
			return nil, err
		}
		lost = r.Leader.Lost()
	} else {
		r.Follower.cfg.Rejoin, r.Follower.cfg.MLX, r.Follower.cfg.Group = false, true, bk
		c.Logger.Info("tensor: linking to rank 0 before joining MLX's group", "group", bk, "rank0", c.Peers[0], "timeout", c.LinkTimeout)
		if err := r.Follower.link(context.Background(), c.LinkTimeout); err != nil {
			return nil, err
		}
	}
	c.Logger.Info("tensor: every rank linked: joining MLX's group", "group", bk, "timeout", c.JoinTimeout)
	g, err := boundedJoin(func() (*mlx.Collective, error) { return mlx.JoinGroup(b, mlx.GroupOptions{Backend: bk, Strict: true}) },
		c.JoinTimeout, lost)
	if err != nil {
		err = fmt.Errorf("%w; ranks' tensor addresses %s", err, strings.Join(c.Peers, ","))
		if bk == "nccl" {
			return nil, fmt.Errorf("tensor: join MLX's NCCL group (NCCL_HOST_IP %s, NCCL_PORT %s, MLX_RANK %s, MLX_WORLD_SIZE %s): %w",
				os.Getenv("NCCL_HOST_IP"), os.Getenv("NCCL_PORT"), os.Getenv("MLX_RANK"), os.Getenv("MLX_WORLD_SIZE"), err)
		}
		if bk == "jaccl" {
			return nil, fmt.Errorf("tensor: join MLX's JACCL group (MLX_IBV_DEVICES %s, MLX_JACCL_COORDINATOR %s, MLX_RANK %s): %w",
				os.Getenv("MLX_IBV_DEVICES"), os.Getenv("MLX_JACCL_COORDINATOR"), os.Getenv("MLX_RANK"), err)
		}
		return nil, fmt.Errorf("tensor: join MLX's ring (MLX_HOSTFILE %s, MLX_RANK %s): %w", os.Getenv("MLX_HOSTFILE"), os.Getenv("MLX_RANK"), err)
	}
	if g.Rank() != c.Rank || g.Size() != c.Size {
		return nil, fmt.Errorf("tensor: MLX's group says rank %d of %d, --tensor %d/%d", g.Rank(), g.Size(), c.Rank, c.Size)
	}
	r.MLX = true
	r.sums.set(sums, c.Metrics, c.Model, c.Rank)
	return Meter(g, c.Metrics, c.Model), nil
}

// errJoinTimeout is wrapped by a join that did not finish in its bound.
var errJoinTimeout = errors.New("the join did not finish in its bound (a rank died or hangs before joining?): exiting so that the supervisor restarts every rank")

// errRankLost ends a join whose rank's tensor link dropped: that rank
// will not join.
var errRankLost = errors.New("a rank's tensor link dropped before MLX's group was joined: exiting so that the supervisor restarts every rank")

// boundedJoin runs join, which may never return (MLX's join waits for
// every rank), for at most timeout, or until lost closes (a rank's link
// dropped: it will not join); the join is then left behind (the process
// exits).
func boundedJoin[G any](join func() (G, error), timeout time.Duration, lost <-chan struct{}) (G, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if lost != nil {
		go func() {
			select {
			case <-lost:
				cancel(errRankLost)
			case <-ctx.Done():
			}
		}()
	}
	g, err := bounded.Call(ctx, timeout, join)
	if errors.Is(err, bounded.ErrTimeout) {
		err = fmt.Errorf("%w (%v)", errJoinTimeout, timeout)
	}
	return g, err
}

// chooseMLXBackend picks MLX's backend for c: on a CUDA GPU "nccl" when
// avail says this libmlx has it; "jaccl" when c has an RDMA matrix and
// avail says this libmlx has JACCL; else "ring". why says why NCCL or an
// RDMA matrix was not used ("" when it was, or when neither applies).
func chooseMLXBackend(c RankConfig, cuda bool, avail func(string) (bool, error)) (backend, why string) {
	// use is name where avail says this libmlx has it, else "ring" and
	// why not (missing, or avail's error).
	use := func(name, missing string) (string, string) {
		ok, err := avail(name)
		switch {
		case err != nil:
			return "ring", err.Error()
		case !ok:
			return "ring", missing
		}
		return name, ""
	}
	switch {
	case cuda:
		return use("nccl", "this libmlx has no NCCL backend (mlx_distributed_is_available(\"nccl\") is false: a CUDA build of MLX with NCCL is needed)")
	case len(c.RDMA) > 0:
		return use("jaccl", "this libmlx has no usable JACCL backend (mlx_distributed_is_available(\"jaccl\") is false: JACCL needs macOS 26.2+ with RDMA enabled, see docs/OPERATIONS.md)")
	}
	return "ring", ""
}

// ringAddrs are MLX's ring addresses of the ranks (mlx.WriteRingHostfile
// writes them): rank i listens on peer i's host at its port + 1.
func ringAddrs(peers []string) ([]string, error) {
	addrs := make([]string, len(peers))
	for i, p := range peers {
		a, err := groupaddr.After(p)
		if err != nil {
			return nil, fmt.Errorf("--tensor-peers: rank %d: %w", i, err)
		}
		addrs[i] = a
	}
	return addrs, nil
}

// Serve runs the rank until ctx ends: rank 0 accepts followers (m is
// unused there: its Model adapter serves the API), a follower serves
// rank 0's calls on m. On MLX a lost rank ends it with an error (the
// supervisor restarts the group).
func (r *Rank) Serve(ctx context.Context, m *engine.Model) error {
	if r.Follower != nil {
		return r.Follower.Run(ctx, m)
	}
	r.serve()
	defer r.stop()
	stop := context.AfterFunc(ctx, r.stop)
	defer stop()
	select {
	case err := <-r.served:
		return err
	case <-r.Leader.Lost():
		r.stop()
		<-r.served
		return fmt.Errorf("tensor: a rank of MLX's group was lost (%v): every rank must restart", r.Leader.Health())
	}
}

// serve starts rank 0's Leader.Serve on its listener, once.
func (r *Rank) serve() {
	if r.served != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.served, r.stop = make(chan error, 1), cancel
	go func() { r.served <- r.Leader.Serve(ctx, r.l) }()
}

// Health is nil while the group is whole (rank 0) or linked (follower).
func (r *Rank) Health() error {
	if r.Leader != nil {
		return r.Leader.Health()
	}
	return r.Follower.Health()
}

// Close releases rank 0's listener (Serve closes it too).
func (r *Rank) Close() {
	if r.stop != nil {
		r.stop()
	}
	if r.l != nil {
		r.l.Close()
	}
}

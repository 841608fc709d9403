// Package tensor owns the runtime of a tensor-parallel decode or prefill
// model served by N runner processes, one per rank (DESIGN.md §13, docs/PROTOCOL.md
// "Tensor link"): the tensor link (link.go: TCP from each follower rank
// to rank 0, framed, CRC32C-checked and HMAC-authenticated by
// runners/internal/link, whose hello carries each rank's backend and group), the calls
// rank 0 sends over it (call.go), rank 0's Leader and its Model adapter
// (leader.go, model.go: the decode server drives it as it drives an
// engine.Model, and a pipeline stage's Ring or Node drives its StageStep
// when the stage is a tensor group; before each engine call on its own share it sends the call
// to every follower, and after it collects their acks), the followers'
// loop (follower.go), and, for the cpu backend, which has no distributed
// engine, an all_sum over the same links (collective.go: a star through
// rank 0, summed in rank order, so every rank gets the same bytes). On MLX
// the ranks sum through MLX's own group (runners/engine/mlx JoinGroup) and
// the link carries only the calls (MLX's ring, JACCL with an RDMA device
// matrix, or NCCL on a CUDA GPU: join.go, jaccl.go, nccl.go); there every
// rank links first, so that the hellos refuse a rank on another backend
// or group by name before anyone joins, and the link and the join are
// each bounded (RankConfig.LinkTimeout, JoinTimeout).
//
// A prefill group (prefill.go) runs a prefill.Producer on every rank over
// its share: rank 0 drives every computation with begin/chunk/end calls,
// each follower's Producer computes the same chunks, and every rank's KV
// port serves the KV heads it computed.
//
// A runner process's rank is assembled here too (runner.go: RunnerConfig
// from the --tensor flags, StartRunner before the model loads, Join as
// the load's collective, Lead on rank 0, ServeFollower elsewhere), so that
// cmd/exo only parses flags.
//
// The engine's sharding (runners/engine/tensor.go) is not here: this
// package only runs the ranks' shares in lockstep. A rank lost breaks the
// group: rank 0's calls fail with ErrGroup (its in-flight requests end
// with that error), its Health fails, and the group is whole again once
// every rank has rejoined, with every cache emptied. This package must not
// import supervisor/ nor runners/decode's internals.
package tensor

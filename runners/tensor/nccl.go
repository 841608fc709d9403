package tensor

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/exo-pd/exo-pd/runners/internal/groupaddr"
)

// NCCL (CUDA hosts: a tensor-parallel prefill across Sparks). MLX's NCCL
// backend (mlx/distributed/nccl, MLX 0.31) reads four variables at
// mlx_distributed_init(strict, "nccl"): MLX_RANK, MLX_WORLD_SIZE,
// NCCL_HOST_IP and NCCL_PORT. Rank 0 binds NCCL_PORT on every interface
// and hands each other rank NCCL's unique id over it (the others retry
// their connect for about 15 s); every rank then uses GPU MLX_RANK mod its
// GPU count. The backend has all_sum (all a tensor split needs) but no
// group split. This is written from MLX's source and documentation and has
// not been run: there is no GPU here (docs/OPERATIONS.md).

// ncclEnv returns the variables MLX's NCCL backend reads for rank c.Rank:
// rank 0's --tensor-peers host and its port + 1 (as JACCL's coordinator).
// MLX resolves NCCL_HOST_IP with gethostbyname (IPv4 only): an IPv6
// rank 0 is refused.
func ncclEnv(c RankConfig) (map[string]string, error) {
	h, port, err := net.SplitHostPort(c.Peers[0])
	if err != nil {
		return nil, fmt.Errorf("--tensor-peers: rank 0's address %q: %w", c.Peers[0], err)
	}
	if a, err := netip.ParseAddr(h); err == nil && !a.Unmap().Is4() {
		return nil, fmt.Errorf("--tensor-peers: rank 0's address %q is IPv6: MLX's NCCL rendezvous (NCCL_HOST_IP) takes IPv4 addresses or host names", c.Peers[0])
	}
	rv, err := groupaddr.After(c.Peers[0])
	if err != nil {
		return nil, fmt.Errorf("--tensor-peers: rank 0's address %q (NCCL's rendezvous): %w", c.Peers[0], err)
	}
	_, port, _ = net.SplitHostPort(rv)
	return map[string]string{
		"MLX_RANK":       strconv.Itoa(c.Rank),
		"MLX_WORLD_SIZE": strconv.Itoa(c.Size),
		"NCCL_HOST_IP":   h,
		"NCCL_PORT":      port,
	}, nil
}

package tensor

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"github.com/exo-pd/exo-pd/runners/internal/groupaddr"
)

// JACCL is MLX's RDMA backend over Thunderbolt 5 (macOS 26.2+ with RDMA
// enabled). It needs a full mesh: a cable, and so an RDMA device, between
// every pair of hosts. MLX reads three variables (MLX's "Distributed
// without mlx.launch"):
//   - MLX_RANK: this process's rank;
//   - MLX_IBV_DEVICES: the path of a JSON file holding an N×N matrix whose
//     row i, column j names the ibverbs device (e.g. "rdma_en3") on rank
//     i's host that is cabled to rank j's host, null on the diagonal;
//   - MLX_JACCL_COORDINATOR: IP:port that rank 0 listens on and every rank
//     reaches (over TCP) to set up the RDMA queues.
//
// The runner gets the matrix as --tensor-rdma (JSON, as MLX wants it) and
// takes rank 0's MLX port (its --tensor-peers port + 1, the ring's port,
// unused under JACCL) as the coordinator.
//
// Unverified here: no Mac with Thunderbolt 5 took part in this project's
// tests; only the matrix, the environment and the fallback are tested.

// ParseRDMA parses and checks a --tensor-rdma value for a group of size
// ranks: a JSON N×N matrix of device names, null (or "") on the diagonal
// and a name everywhere else (a full mesh). The error names the first
// rank pair without a device.
func ParseRDMA(s string, size int) ([][]string, error) {
	var m [][]*string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("--tensor-rdma: want a JSON matrix of RDMA device names (null on the diagonal): %w", err)
	}
	out := make([][]string, len(m))
	for i, row := range m {
		out[i] = make([]string, len(row))
		for j, v := range row {
			if v != nil {
				out[i][j] = *v
			}
		}
	}
	return out, CheckMesh(out, size)
}

// CheckMesh says whether m is a full mesh of size ranks: m[i][j] names
// rank i's device toward rank j for every i ≠ j, and the diagonal is
// empty. Its error names the rank pair that breaks it.
func CheckMesh(m [][]string, size int) error {
	if len(m) != size {
		return fmt.Errorf("--tensor-rdma has %d rows for %d ranks: want one row per rank", len(m), size)
	}
	for i, row := range m {
		if len(row) != size {
			return fmt.Errorf("--tensor-rdma row %d has %d entries for %d ranks", i, len(row), size)
		}
		for j, d := range row {
			switch {
			case i == j && d != "":
				return fmt.Errorf("--tensor-rdma: rank %d names device %q toward itself: the diagonal is null", i, d)
			case i != j && d == "":
				return fmt.Errorf("--tensor-rdma: rank %d has no RDMA device toward rank %d: JACCL needs a full mesh (a Thunderbolt cable between every pair of hosts)", i, j)
			}
		}
	}
	return nil
}

// jacclEnv writes the device matrix into dir and returns the variables
// MLX's JACCL backend reads for rank c.Rank.
func jacclEnv(c RankConfig, dir string) (map[string]string, error) {
	if err := CheckMesh(c.RDMA, c.Size); err != nil {
		return nil, err
	}
	coord, err := groupaddr.After(c.Peers[0])
	if err != nil {
		return nil, fmt.Errorf("--tensor-peers: rank 0's address %q (JACCL's coordinator): %w", c.Peers[0], err)
	}
	m := make([][]*string, len(c.RDMA))
	for i, row := range c.RDMA {
		m[i] = make([]*string, len(row))
		for j := range row {
			if i != j {
				m[i][j] = &row[j]
			}
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, "exo-mlx-ibv-devices-*.json")
	if err != nil {
		return nil, fmt.Errorf("tensor: MLX_IBV_DEVICES file: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return nil, fmt.Errorf("tensor: MLX_IBV_DEVICES file: %w", err)
	}
	return map[string]string{
		"MLX_RANK":              strconv.Itoa(c.Rank),
		"MLX_IBV_DEVICES":       f.Name(),
		"MLX_JACCL_COORDINATOR": coord,
	}, nil
}

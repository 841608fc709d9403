package mlx

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
)

// WriteRingHostfile writes MLX's ring hostfile for addrs (rank i listens
// on addrs[i], "host:port"; a JSON list with one list of addresses per
// rank) to a new temporary file and returns its path: what MLX_HOSTFILE
// names, beside MLX_RANK, before JoinGroup on the ring backend.
func WriteRingHostfile(addrs []string) (string, error) {
	hosts := make([][]string, len(addrs))
	for i, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return "", fmt.Errorf("mlx: ring hostfile: rank %d's address %q: %w", i, a, err)
		}
		hosts[i] = []string{a}
	}
	b, err := json.Marshal(hosts)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "exo-mlx-hostfile-*.json")
	if err != nil {
		return "", fmt.Errorf("mlx: ring hostfile: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return "", fmt.Errorf("mlx: ring hostfile: %w", err)
	}
	return f.Name(), nil
}

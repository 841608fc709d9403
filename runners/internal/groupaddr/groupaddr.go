// Package groupaddr owns one convention of the runners: MLX's group of a
// runner (its ring, JACCL's coordinator, NCCL's rendezvous) listens on the
// port after the runner's own link port (a pipeline stage's --stage-listen
// or --stage-next, a tensor rank's --tensor-peers entry). runners/stage and
// runners/tensor take the address from here; supervisor/config claims the
// same ports (config.HostPorts) by the same rule without importing it.
//
// It must not open sockets or read the environment.
package groupaddr

import (
	"fmt"
	"net"
	"strconv"
)

// After is where MLX's group of the runner linking on addr listens: addr's
// host at the next port. A port that has no next one (0, 65535, not a
// number) is refused.
func After(addr string) (string, error) {
	h, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n >= 65535 {
		return "", fmt.Errorf("port %q: MLX's group takes the next one", port)
	}
	return net.JoinHostPort(h, strconv.Itoa(n+1)), nil
}

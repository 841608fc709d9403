package hostmem

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func total() (int64, error) {
	n, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return 0, fmt.Errorf("hostmem: sysctl hw.memsize: %w", err)
	}
	return int64(n), nil
}

package hostmem

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

func total() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("hostmem: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != "MemTotal" {
			continue
		}
		var kb int64
		if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil || kb <= 0 {
			return 0, fmt.Errorf("hostmem: /proc/meminfo MemTotal %q", v)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("hostmem: /proc/meminfo has no MemTotal")
}

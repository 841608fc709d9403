package doctor

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// availableMemory is what the kernel says new allocations can get
// (MemAvailable), in bytes.
func availableMemory() (uint64, string, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			var kb uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, "", fmt.Errorf("/proc/meminfo: %q: %w", v, err)
			}
			return kb << 10, "available system memory", nil
		}
	}
	return 0, "", fmt.Errorf("/proc/meminfo has no MemAvailable")
}

package dashboard

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// readMemory reads MemTotal and MemAvailable from /proc/meminfo.
func readMemory() (Memory, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	m := Memory{Kind: "system memory"}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "MemTotal" && k != "MemAvailable") {
			continue
		}
		var kb uint64
		if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
			return Memory{}, fmt.Errorf("/proc/meminfo: %s %q: %w", k, v, err)
		}
		if k == "MemTotal" {
			m.Total = kb << 10
		} else {
			m.Available = kb << 10
		}
	}
	if m.Total == 0 {
		return Memory{}, fmt.Errorf("/proc/meminfo has no MemTotal")
	}
	m.Used = m.Total - min(m.Available, m.Total)
	return m, nil
}

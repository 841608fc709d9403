// Package hostmem reports this machine's physical memory, which pipeline
// placement weighs (each supervisor reports it to its peers) when the
// cluster file gives a host no memory_gib. It owns only that one reading;
// it must not import runners/.
package hostmem

import (
	"fmt"
	"os"
	"strconv"
)

// TestEnv, when set to a number of GiB, is what Reported answers instead
// of the machine's reading: a test hook, so that supervisors sharing one
// machine in an end-to-end test report different memories. Nothing else
// reads it; it is not a setting (memory_gib in the cluster file is).
const TestEnv = "EXO_TEST_MEMORY_GIB"

// Total returns the machine's physical memory in bytes (Linux:
// /proc/meminfo MemTotal; macOS: hw.memsize, the unified memory).
func Total() (int64, error) { return total() }

// Reported is the physical memory this host reports for placement: Total,
// or $EXO_TEST_MEMORY_GIB GiB when set (TestEnv).
func Reported() (int64, error) {
	v := os.Getenv(TestEnv)
	if v == "" {
		return total()
	}
	g, err := strconv.ParseFloat(v, 64)
	if err != nil || !(g > 0 && g < 1<<24) {
		return 0, fmt.Errorf("hostmem: %s=%q: want a positive number of GiB", TestEnv, v)
	}
	return int64(g * (1 << 30)), nil
}

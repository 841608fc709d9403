// Package hostmem reports this machine's physical memory, which pipeline
// placement uses for the local host when the cluster file gives no
// memory_gib. It owns only that one reading; it must not import runners/.
package hostmem

// Total returns the machine's physical memory in bytes (Linux:
// /proc/meminfo MemTotal; macOS: hw.memsize, the unified memory).
func Total() (int64, error) { return total() }

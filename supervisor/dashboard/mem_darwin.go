package dashboard

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// readMemory on macOS: the unified memory's size, and as available the
// free and purgeable pages (what the kernel can hand out without paging).
func readMemory() (Memory, error) {
	total, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return Memory{}, fmt.Errorf("sysctl hw.memsize: %w", err)
	}
	m := Memory{Kind: "unified memory", Total: total}
	page, err := unix.SysctlUint32("vm.pagesize")
	if err != nil {
		return m, nil
	}
	free, err1 := unix.SysctlUint32("vm.page_free_count")
	purg, err2 := unix.SysctlUint32("vm.page_purgeable_count")
	if err1 == nil && err2 == nil {
		m.Available = min(uint64(free+purg)*uint64(page), total)
		m.Used = total - m.Available
	}
	return m, nil
}

package doctor

import (
	"encoding/binary"
	"fmt"
	"syscall"
)

// availableMemory on macOS is the unified memory's size (hw.memsize): Metal
// may wire most of it for a model (what is free right now varies too much
// to be useful).
func availableMemory() (uint64, string, error) {
	s, err := syscall.Sysctl("hw.memsize")
	if err != nil {
		return 0, "", fmt.Errorf("sysctl hw.memsize: %w", err)
	}
	b := []byte(s)
	for len(b) < 8 {
		b = append(b, 0) // Sysctl drops trailing zero bytes
	}
	return binary.LittleEndian.Uint64(b[:8]), "unified memory", nil
}

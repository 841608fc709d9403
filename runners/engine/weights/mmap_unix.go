//go:build unix

package weights

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mapping is a read-only view of a whole file.
type mapping struct {
	data  []byte
	close func() error
}

// mapFile memory-maps path read-only. An empty file maps to an empty slice.
func mapFile(path string) (*mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size == 0 {
		return &mapping{close: func() error { return nil }}, nil
	}
	if size < 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("%s: file too large to map (%d bytes)", path, size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return &mapping{data: data, close: func() error { return unix.Munmap(data) }}, nil
}

//go:build !unix

package weights

import "os"

// mapping is a read-only view of a whole file.
type mapping struct {
	data  []byte
	close func() error
}

// mapFile reads the file into memory on platforms without mmap.
func mapFile(path string) (*mapping, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return &mapping{data: data, close: func() error { return nil }}, nil
}

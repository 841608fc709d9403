//go:build !linux && !darwin

package hostmem

import "errors"

func total() (int64, error) { return 0, errors.New("hostmem: memory size unknown on this system") }

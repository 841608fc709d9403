//go:build !linux && !darwin

package doctor

import "errors"

func availableMemory() (uint64, string, error) {
	return 0, "", errors.New("memory size unknown on this system")
}

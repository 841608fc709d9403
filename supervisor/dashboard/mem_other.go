//go:build !linux && !darwin

package dashboard

import "errors"

func readMemory() (Memory, error) {
	return Memory{}, errors.New("memory size unknown on this system")
}

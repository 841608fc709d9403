//go:build unix && !linux

package process

import (
	"errors"
	"syscall"
)

// gone reports whether pid no longer exists.
func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

//go:build unix

package process

import (
	"errors"
	"syscall"
)

func signalGroup(pgid int, sig syscall.Signal) error {
	if pgid <= 0 {
		return errors.New("no process group")
	}
	return syscall.Kill(-pgid, sig)
}

// killGroupAlive reports whether any process of the group exists (zombies
// included).
func killGroupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

//go:build unix && !linux

package process

import "syscall"

// The child leads its own process group.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

package process

import "syscall"

// The child leads its own process group, and the kernel kills it if the
// supervisor dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

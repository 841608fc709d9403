package process

import (
	"bytes"
	"os"
	"strconv"
)

// groupAlive reports whether a live (non-zombie) process of the group
// exists. Zombies do not count: an orphaned grandchild that was killed waits
// for PID 1 to reap it, which in some containers never happens.
func groupAlive(pgid int) bool {
	if !killGroupAlive(pgid) {
		return false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		state, pg, ok := procStat(pid)
		if ok && pg == pgid && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

// procStat reads a process's state letter and process group from /proc.
func procStat(pid int) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid pgrp …; comm may contain spaces and parens.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 3 {
		return 0, 0, false
	}
	pg, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pg, true
}

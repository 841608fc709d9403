package process

// gone reports whether pid no longer runs (absent or a zombie).
func gone(pid int) bool {
	state, _, ok := procStat(pid)
	return !ok || state == 'Z' || state == 'X'
}

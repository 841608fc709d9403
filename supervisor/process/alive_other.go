//go:build unix && !linux

package process

func groupAlive(pgid int) bool { return killGroupAlive(pgid) }

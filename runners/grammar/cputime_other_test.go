//go:build !linux

package grammar

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }

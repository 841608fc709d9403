//go:build !linux

package cpu

// threadCPU is not measured here (see threadcpu_linux_test.go).
func threadCPU() int64 { return 0 }

// ThreadCPU is threadCPU for the package's external tests.
var ThreadCPU = threadCPU

package hostmem

import (
	"runtime"
	"testing"
)

func TestTotal(t *testing.T) {
	n, err := Total()
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		if err == nil {
			t.Fatal("Total succeeded on an unsupported system")
		}
		return
	}
	if err != nil || n < 64<<20 {
		t.Fatalf("Total = %d, %v", n, err)
	}
}

func TestReportedTestHook(t *testing.T) {
	t.Setenv(TestEnv, "96")
	if n, err := Reported(); err != nil || n != 96<<30 {
		t.Fatalf("Reported = %d, %v", n, err)
	}
	t.Setenv(TestEnv, "lots")
	if _, err := Reported(); err == nil {
		t.Fatal("Reported accepted a bad value")
	}
}

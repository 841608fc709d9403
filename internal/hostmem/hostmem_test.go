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

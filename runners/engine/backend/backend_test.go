package backend

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/mlx"
)

// TestCPUDevice: the cpu backend takes no --device or "cpu" (where it
// runs) and refuses any other by name, rather than ignoring it.
func TestCPUDevice(t *testing.T) {
	for _, tc := range []struct {
		device string
		ok     bool
	}{
		{"", true},
		{"cpu", true},
		{"gpu", false},
		{"cuda", false},
	} {
		b, err := Open("cpu", Options{Threads: 1, Device: tc.device})
		if tc.ok {
			if err != nil || b.Name() != "cpu" {
				t.Errorf("--device %q: %v %v", tc.device, b, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "--device") || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.device)) {
			t.Errorf("--device %q: want a refusal naming it, got %v", tc.device, err)
		}
	}
}

func TestOpen(t *testing.T) {
	b, err := Open("cpu", Options{Threads: 1})
	if err != nil || b.Name() != "cpu" {
		t.Fatalf("cpu: %v %v", b, err)
	}
	if _, err := Open("tpu", Options{}); err == nil || !strings.Contains(err.Error(), "tpu") {
		t.Fatalf("unknown name: %v", err)
	}
	// This test runs where libmlxc is absent (CI); where it is present the
	// mlx cases below are not meaningful.
	if _, err := mlx.New(mlx.Options{LibPath: "/nonexistent/libmlxc.so"}); err == nil {
		t.Skip("libmlxc loads from a nonexistent path?")
	}
	_, err = Open("mlx", Options{LibPath: "/nonexistent/libmlxc.so"})
	if err == nil || !errors.Is(err, mlx.ErrUnavailable) {
		t.Fatalf("mlx without the library: %v", err)
	}
	var logs bytes.Buffer
	b, err = Open("auto", Options{LibPath: "/nonexistent/libmlxc.so", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil || b.Name() != "cpu" {
		t.Fatalf("auto: %v %v", b, err)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "cpu backend") {
		t.Fatalf("auto fallback logged %d lines: %q", n, logs.String())
	}
}

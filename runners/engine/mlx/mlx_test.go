package mlx

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Without libmlxc at the given path, New fails with ErrUnavailable and a
// message that says why. This runs in CI (cgo on, no MLX) and with
// CGO_ENABLED=0 (the stub).
func TestNewWithoutLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libmlxc.so")
	b, err := New(Options{LibPath: missing})
	if err == nil {
		t.Fatalf("New with %s: got backend %v, want an error", missing, b.Name())
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New: %v does not wrap ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "MLX is unavailable") {
		t.Errorf("error %q does not say that MLX is unavailable", err)
	}
}

// A file that is not a shared library is reported, not loaded.
func TestNewWithBadLibrary(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "libmlxc.so")
	if err := os.WriteFile(bad, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(Options{LibPath: bad})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New(%s): %v, want ErrUnavailable", bad, err)
	}
}

func TestCandidates(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "bin", "exo")
	for _, tc := range []struct {
		name, lib, env string
		want           []string
	}{
		{"explicit file only", "/opt/mlx/libmlxc.so", "/env/libmlxc.so", []string{"/opt/mlx/libmlxc.so"}},
		{"explicit directory", dir, "", []string{filepath.Join(dir, "libmlxc.so")}},
		{"env, beside exe, system", "", "/env/libmlxc.so", []string{"/env/libmlxc.so", filepath.Join(dir, "bin", "libmlxc.so"), "libmlxc.so"}},
		{"env directory", "", dir, []string{filepath.Join(dir, "libmlxc.so"), filepath.Join(dir, "bin", "libmlxc.so"), "libmlxc.so"}},
		{"nothing set", "", "", []string{filepath.Join(dir, "bin", "libmlxc.so"), "libmlxc.so"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := candidates(tc.lib, tc.env, exe, "libmlxc.so")
			if !slices.Equal(got, tc.want) {
				t.Errorf("candidates(%q, %q) = %q, want %q", tc.lib, tc.env, got, tc.want)
			}
		})
	}
}

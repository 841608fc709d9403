//go:build linux || darwin

package mlx

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJITDir(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "/tmp/mlx"},
		{map[string]string{"TMPDIR": "/run/user/1000"}, "/run/user/1000/mlx"},
		{map[string]string{"TEMP": "/t", "TMPDIR": "/x"}, "/x/mlx"},
		{map[string]string{"TEMPDIR": "/y"}, "/y/mlx"},
	} {
		if got := jitDir(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("jitDir(%v) = %s, want %s", tc.env, got, tc.want)
		}
	}
}

func TestJITDirProblem(t *testing.T) {
	uid := os.Getuid()
	root := t.TempDir()
	mk := func(name string, perm os.FileMode) string {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, perm); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := jitDirProblem(filepath.Join(root, "absent", "mlx"), uid); err != nil {
		t.Errorf("missing directory: %v, want nil (MLX creates it as ours)", err)
	}
	ok := mk("ok/mlx/0.31.2/cpu", 0o755)
	if err := jitDirProblem(filepath.Dir(filepath.Dir(ok)), uid); err != nil {
		t.Errorf("private tree: %v", err)
	}
	mk("open/mlx", 0o700)
	open := mk("open/mlx/0.31.2", 0o777)
	if err := jitDirProblem(filepath.Dir(open), uid); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("world-writable subdirectory: %v, want it reported", err)
	}
	if err := jitDirProblem(ok, uid+1); err == nil || !strings.Contains(err.Error(), "belongs to uid") {
		t.Errorf("another owner: %v, want it reported", err)
	}
}

func TestJITDirSymlink(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "elsewhere")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "mlx")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := jitDirProblem(link, os.Getuid()); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symlinked directory: %v, want it reported", err)
	}
}

//go:build linux || darwin

package mlx

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// jitDir is where MLX keeps what it compiles at run time: C++ sources and
// shared objects of fused CPU kernels ("…/cpu"), and PTX on CUDA ("…/ptx"),
// under std::filesystem::temp_directory_path(), which reads TMPDIR, TMP,
// TEMP and TEMPDIR in that order before falling back to /tmp.
func jitDir(getenv func(string) string) string {
	for _, k := range []string{"TMPDIR", "TMP", "TEMP", "TEMPDIR"} {
		if v := getenv(k); v != "" {
			return filepath.Join(v, "mlx")
		}
	}
	return "/tmp/mlx"
}

// jitDirProblem says why dir (see jitDir) is unsafe to use, or returns nil.
// MLX loads a kernel library it finds there without building it, so on a
// shared /tmp another user who created the directory first could have this
// process run their code. Safe: the directory does not exist yet (MLX will
// make it, owned by us, with our umask), or it and every directory below it
// are owned by uid and writable by nobody else.
func jitDirProblem(dir string, uid int) error {
	st, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link; MLX would load compiled kernels from wherever it points (set TMPDIR to a private directory)", dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: cannot read its owner", p)
		}
		if int(st.Uid) != uid {
			return fmt.Errorf("%s belongs to uid %d, not to this process (uid %d); MLX would load compiled kernels from it (set TMPDIR to a private directory)", p, st.Uid, uid)
		}
		if info.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("%s is writable by group or others (%v); MLX would load compiled kernels from it (set TMPDIR to a private directory)", p, info.Mode().Perm())
		}
		return nil
	})
}

// Package mlx implements the engine's array API (engine.Backend and
// engine.KVCache) on MLX through its C API, mlx-c, loaded at run time with
// dlopen: the binary builds and runs without MLX, and New reports
// ErrUnavailable when libmlxc cannot be loaded.
//
// One goroutine locked to one OS thread owns every MLX call of a backend;
// every Backend and KVCache method hands its work to that goroutine. Ops
// only build MLX's lazy graph, so they are queued without waiting and
// return their array at once (its Shape and DType wait for it); Eval, Bytes,
// Float32, KVCache.Len/Export/Import/Commit and the other calls that return
// something wait for the queue. A forward pass therefore costs a few
// round trips between goroutines, not one per op. Arrays made by ops are
// temporaries tracked by the backend and released by Free(); Keep pins
// weights and cache storage. Nothing relies on finalizers.
//
// MLX errors are caught by an mlx-c error handler installed before the
// first call, never exit(): a failing op (or a programming error caught on
// the MLX thread, such as a shape mismatch) skips the rest of the queued
// work and is re-raised by the next synchronous call: Eval, Bytes, Float32
// and the KVCache methods return it as an error wrapping engine.ErrBackend;
// the others panic with it, as the engine's error model allows.
//
// MLX's distributed collectives (JoinGroup, Collective: all_sum,
// all_gather, send, recv) run on the same thread, lazily like the other
// ops, on the backend's arrays.
//
// The package owns only runners/engine/mlx. It must not import the model
// code, the weights loaders, or anything above the engine; mlx-c's headers
// are not used: capi.h declares the few functions we call.
package mlx

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
)

// ErrUnavailable means libmlxc could not be loaded on this machine.
var ErrUnavailable = errors.New("mlx: MLX is unavailable (libmlxc not found)")

// ErrDevice means the requested MLX device does not exist here.
var ErrDevice = errors.New("mlx: device unavailable")

// EnvLibPath names the environment variable holding libmlxc's path (a file,
// or a directory containing libmlxc.so / libmlxc.dylib).
const EnvLibPath = "EXO_MLXC_PATH"

// Options selects the library and device.
type Options struct {
	// LibPath is the path of libmlxc (.so/.dylib) or of its directory;
	// empty means search $EXO_MLXC_PATH, next to the executable, then the
	// system loader.
	LibPath string
	// Device is "gpu", "cpu" or "" (gpu when MLX reports one).
	Device string
	// Logger receives the backend's few log lines; nil means slog.Default().
	Logger *slog.Logger
}

// Info describes a loaded MLX backend (Describe).
type Info struct {
	Lib, Version, Device string
	// QuantizedMatmul and Fusion say why that feature is unavailable on
	// the device (nil: it is available).
	QuantizedMatmul, Fusion error
}

// candidates lists where to look for libmlxc, in order: the explicit path,
// the environment variable, beside the executable, then the bare name for
// the system loader. A directory means the library file inside it.
func candidates(libPath, env, exe, name string) []string {
	var out []string
	add := func(p string) {
		if p == "" {
			return
		}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			p = filepath.Join(p, name)
		}
		out = append(out, p)
	}
	if libPath != "" {
		add(libPath)
		return out // an explicit path is the only one tried
	}
	add(env)
	if exe != "" {
		add(filepath.Join(filepath.Dir(exe), name))
	}
	return append(out, name)
}

// Package mlx implements the engine's array API over MLX through mlx-c,
// loaded at run time. (Placeholder until the MLX backend lands.)
package mlx

import (
	"errors"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// ErrUnavailable means libmlxc could not be loaded on this machine.
var ErrUnavailable = errors.New("mlx: MLX is unavailable (libmlxc not found)")

// Options selects the library and device.
type Options struct {
	// LibPath is the path of libmlxc (.so/.dylib); empty means search
	// $EXO_MLXC_PATH, next to the executable, then the system loader.
	LibPath string
	// Device is "gpu", "cpu" or "" (gpu when MLX reports one).
	Device string
}

// New loads mlx-c and returns a Backend, or an error wrapping ErrUnavailable.
func New(opts Options) (engine.Backend, error) { return nil, ErrUnavailable }

// Package backend chooses an engine.Backend by name ("cpu", "mlx", "auto")
// and wires the weight formats into engine.Load (it registers weights.Open
// as the engine's SourceOpener, so a program that opens a backend here can
// load model directories and GGUF files).
//
// It owns only that selection: it must not contain ops or model code.
package backend

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/mlx"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

func init() { engine.RegisterSourceOpener(weights.Open) }

// Options configures Open.
type Options struct {
	// LibPath is libmlxc's path for the mlx backend ("" searches, see mlx.Options).
	LibPath string
	// Device is "gpu", "cpu" or "" for the mlx backend (MLX's device).
	// The cpu backend runs on the CPU only: it takes "" or "cpu" and
	// refuses "gpu" (or anything else) by name.
	Device string
	// Threads is the cpu backend's goroutine count (0: all cores).
	Threads int
	// Logger receives the line that "auto" logs when it falls back to cpu
	// (nil: slog.Default()).
	Logger *slog.Logger
}

// Names lists the accepted backend names.
var Names = []string{"auto", "cpu", "mlx"}

// Open returns the named backend. "mlx" fails (wrapping mlx.ErrUnavailable)
// when libmlxc cannot be loaded; "auto" then falls back to "cpu" with one
// log line.
func Open(name string, o Options) (engine.Backend, error) {
	switch name {
	case "cpu":
		if o.Device != "" && o.Device != "cpu" {
			return nil, fmt.Errorf("backend cpu: --device %q is MLX's device: the cpu backend runs on the CPU only (drop --device, or use --backend mlx)", o.Device)
		}
		return cpu.New(o.Threads), nil
	case "mlx":
		b, err := mlx.New(mlx.Options{LibPath: o.LibPath, Device: o.Device})
		if err != nil {
			return nil, fmt.Errorf("backend mlx: %w", err)
		}
		return b, nil
	case "auto", "":
		b, err := mlx.New(mlx.Options{LibPath: o.LibPath, Device: o.Device})
		if err == nil {
			return b, nil
		}
		log := o.Logger
		if log == nil {
			log = slog.Default()
		}
		if errors.Is(err, mlx.ErrUnavailable) {
			log.Info("backend auto: MLX unavailable, using the cpu backend", "reason", err.Error())
		} else {
			log.Warn("backend auto: MLX failed to start, using the cpu backend", "err", err)
		}
		return cpu.New(o.Threads), nil
	}
	return nil, fmt.Errorf("backend: unknown backend %q (want auto, cpu or mlx)", name)
}

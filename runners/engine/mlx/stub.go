//go:build !cgo || !(linux || darwin)

package mlx

import (
	"fmt"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// New always fails here: this build has no cgo, so mlx-c cannot be loaded.
func New(opts Options) (engine.Backend, error) {
	return nil, fmt.Errorf("%w: this exo was built without cgo (CGO_ENABLED=0), so it cannot load libmlxc", ErrUnavailable)
}

// Describe reports nothing here: no backend of this package can exist.
func Describe(engine.Backend) (Info, bool) { return Info{}, false }

//go:build !cgo || !(linux || darwin)

package mlx

import (
	"errors"
	"fmt"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// ErrDistributed means an MLX distributed group could not be joined or a
// collective is missing from the loaded libmlxc.
var ErrDistributed = errors.New("mlx: distributed")

// GroupOptions says which MLX distributed backend to join (see the cgo
// build).
type GroupOptions struct {
	Backend    string
	Strict     bool
	StallAfter time.Duration
	OnStall    func(running time.Duration)
}

var _ engine.Collective = (*Collective)(nil)

// Collective cannot exist in this build (no cgo); its methods are here so
// that callers build.
type Collective struct{}

// JoinGroup always fails here: this build cannot load libmlxc.
func JoinGroup(engine.Backend, GroupOptions) (*Collective, error) {
	return nil, fmt.Errorf("%w: this exo was built without cgo (CGO_ENABLED=0), so it cannot load libmlxc", ErrUnavailable)
}

// DistributedAvailable always fails here, as JoinGroup does.
func DistributedAvailable(engine.Backend, string) (bool, error) {
	_, err := JoinGroup(nil, GroupOptions{})
	return false, err
}

func (*Collective) Rank() int                                        { return 0 }
func (*Collective) Size() int                                        { return 1 }
func (*Collective) Close()                                           {}
func (*Collective) Backend() string                                  { return "" }
func (*Collective) AllSum(engine.Backend, engine.Array) engine.Array { panic(ErrUnavailable) }
func (*Collective) AllGather(engine.Array) engine.Array              { panic(ErrUnavailable) }
func (*Collective) Send(engine.Array, int) engine.Array              { panic(ErrUnavailable) }
func (*Collective) Recv([]int, engine.DType, int) engine.Array       { panic(ErrUnavailable) }
func (*Collective) RecvLike(engine.Array, int) engine.Array          { panic(ErrUnavailable) }

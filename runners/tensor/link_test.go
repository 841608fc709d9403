package tensor

import (
	"errors"
	"strings"
	"testing"

	wire "github.com/exo-pd/exo-pd/runners/internal/link"
)

// TestCheckPeer: what each rank refuses of the other's hello, by name.
func TestCheckPeer(t *testing.T) {
	ring, _ := wire.GroupFlags("ring")
	rank := func(i, n int, flags uint16, backend string) *wire.Hello {
		return &wire.Hello{Index: i, Count: n, Flags: flags, Backend: backend}
	}
	for _, tc := range []struct {
		what     string
		me, peer *wire.Hello
		is       error
		says     string
	}{
		{"same group", rank(0, 2, ring, "mlx-cpu"), rank(1, 2, ring, "mlx-cpu"), nil, ""},
		{"both on the link", rank(1, 3, 0, "cpu"), rank(0, 3, 0, "cpu"), nil, ""},
		{"another size", rank(0, 2, 0, "cpu"), rank(1, 3, 0, "cpu"), wire.ErrMismatch, "peer rank 1 is in a group of 3, this one of 2"},
		{"a follower reaching a follower", rank(1, 3, 0, "cpu"), rank(2, 3, 0, "cpu"), wire.ErrMismatch, "rank 1 dialled rank 2, not rank 0"},
		{"another group", rank(0, 2, ring, "mlx-cpu"), rank(1, 2, 0, ""), ErrMismatch,
			"rank 1 runs backend unknown (sums over the tensor link), rank 0 mlx-cpu (over MLX's ring)"},
	} {
		err := checkPeer(tc.me, tc.peer)
		if tc.is == nil && err != nil || tc.is != nil && (!errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says)) {
			t.Errorf("%s: %v, want %v saying %q", tc.what, err, tc.is, tc.says)
		}
	}
}

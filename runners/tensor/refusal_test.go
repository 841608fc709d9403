package tensor

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// TestRefusalOnHealth: a group that refused a rank of another backend
// says so on its Health (so on /health), not only in its log: rank 0,
// which stays up waiting for a rank of its own backend, and a follower,
// which dials again, alike — the follower even once rank 0 is gone (the
// rank of the other backend exits), next to the dial's own error.
func TestRefusalOnHealth(t *testing.T) {
	// Rank 0 on the cpu backend refuses a rank on MLX's ring (its hello
	// only: no MLX is needed).
	rs := startRanks(t, "", LeaderConfig{Size: 2, Backend: "cpu", Rejoin: true})
	mlxRank, err := NewFollower(FollowerConfig{Rank: 1, Size: 2, Leader: rs.addr, MLX: true, Group: "ring", Backend: "mlx-cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if err := mlxRank.link(rs.ctx, time.Minute); !errors.Is(err, ErrMismatch) {
		t.Fatalf("the MLX rank's link: %v, want ErrMismatch", err)
	}
	testutil.Eventually(t, func() bool { return errors.Is(rs.g.Health(), ErrMismatch) }, time.Minute,
		"rank 0's Health names the refusal (it is %v)", rs.g.Health())
	if h := rs.g.Health(); !strings.Contains(h.Error(), "rank 1 runs backend mlx-cpu") {
		t.Errorf("rank 0's Health %v does not name the refused rank's backend", h)
	}

	// A follower on the cpu backend, refused by an MLX rank 0 that then
	// exits (its listener closes).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { // rank 0 on MLX's ring: its handshake refuses each dial
		for c, err := l.Accept(); err == nil; c, err = l.Accept() {
			handshake(c, 0, 2, "ring", "mlx-cpu", nil)
			c.Close()
		}
	}()
	f, err := NewFollower(FollowerConfig{Rank: 1, Size: 2, Leader: l.Addr().String(), Backend: "cpu", Rejoin: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, nil) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, func() bool { return errors.Is(f.Health(), ErrMismatch) }, time.Minute,
		"the follower's Health names the refusal (it is %v)", f.Health())
	l.Close()
	testutil.Eventually(t, func() bool {
		h := f.Health()
		return h != nil && strings.Contains(h.Error(), "dial rank 0") && errors.Is(h, ErrMismatch) &&
			strings.Contains(h.Error(), "rank 0 runs backend mlx-cpu")
	}, time.Minute, "with rank 0 gone the follower's Health names the dial and the refusal (it is %v)", f.Health())
}

package tensor

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine/mlx"
)

// TestMLXJoinBound: rank 0's Collective on MLX, whose one follower linked
// (so the hellos agreed) but never joins MLX's ring, does not wait in
// MLX's join for ever: with the follower's link dropped it fails at once,
// with the link kept at its JoinTimeout, naming the ranks' addresses
// (the runner then exits). By hand: it needs libmlxc (EXO_MLXC_PATH);
// each case leaves a join behind in this process, so run it alone.
func TestMLXJoinBound(t *testing.T) {
	if os.Getenv(mlx.EnvLibPath) == "" {
		t.Skip("by hand: set EXO_MLXC_PATH to libmlxc.so")
	}
	b, err := mlx.New(mlx.Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	for _, drop := range []bool{true, false} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			t.Setenv("MLX_HOSTFILE", "")
			t.Setenv("MLX_RANK", "")
			base := testutil.Ports(t, 4)
			peers := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+2)}
			c := RankConfig{Rank: 0, Size: 2, Peers: peers, Metrics: NewMetrics(nil), JoinTimeout: 3 * time.Second}
			r, err := Listen(c)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			f, err := NewFollower(FollowerConfig{Rank: 1, Size: 2, Leader: peers[0], MLX: true, Group: "ring", Backend: b.Name()})
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { _, err := r.Collective(c, b); errc <- err }()
			if err := f.link(t.Context(), time.Minute); err != nil {
				t.Fatal(err)
			}
			if drop {
				testutil.Eventually(t, func() bool { return r.Leader.Health() == nil }, time.Minute, "rank 0 sees rank 1 linked")
				f.pending.close()
			}
			var got error
			select {
			case got = <-errc:
			case <-time.After(time.Minute): // a test's bound: the fix is what ends it
				t.Fatal("rank 0's Collective still waits a minute on")
			}
			want := "did not finish in its bound"
			if drop {
				want = "link dropped"
			}
			if got == nil || !strings.Contains(got.Error(), want) || !strings.Contains(got.Error(), strings.Join(peers, ",")) {
				t.Fatalf("Collective: %v, want %q naming %v", got, want, peers)
			}
			if !drop && !errors.Is(got, errJoinTimeout) {
				t.Fatalf("Collective: %v, want errJoinTimeout", got)
			}
			t.Log(got)
		})
	}
}

package tensor

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/mlx"
)

// TestRingHostfile: a tensor group's MLX ring hostfile (written by the
// one writer, mlx.WriteRingHostfile) lists rank i on peer i's port + 1;
// a peer without a usable port is refused naming --tensor-peers.
func TestRingHostfile(t *testing.T) {
	addrs, err := ringAddrs([]string{"10.0.0.1:52504", "[fd00::2]:52504", "h3:9"})
	if err != nil {
		t.Fatal(err)
	}
	path, err := mlx.WriteRingHostfile(addrs)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got [][]string
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("hostfile %s: %v", b, err)
	}
	want := [][]string{{"10.0.0.1:52505"}, {"[fd00::2]:52505"}, {"h3:10"}}
	if !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Errorf("hostfile %v, want %v", got, want)
	}
	for _, bad := range []string{"10.0.0.1", "10.0.0.1:65535", "10.0.0.1:x"} {
		if _, err := ringAddrs([]string{"10.0.0.2:1", bad}); err == nil || !strings.Contains(err.Error(), "--tensor-peers: rank 1") {
			t.Errorf("peer %q: %v", bad, err)
		}
	}
}

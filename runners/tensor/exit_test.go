package tensor

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"

	"github.com/exo-pd/exo-pd/runners/stage"
)

// TestExitMLXGroupStatus: a rank whose MLX group lost a rank exits with
// stage.ExitGroupLost (3), the status a pipeline stage whose group was
// lost exits with (it exited 1, as any failure does). The test runs
// itself as a child process that calls ExitMLXGroup.
func TestExitMLXGroupStatus(t *testing.T) {
	if os.Getenv("EXO_TEST_EXIT_MLX_GROUP") == "1" {
		ExitMLXGroup(errors.New("rank 1 lost"), func() int { return 0 }, slog.New(slog.NewTextHandler(io.Discard, nil)))
		t.Fatal("ExitMLXGroup returned")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitMLXGroupStatus$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EXO_TEST_EXIT_MLX_GROUP=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != stage.ExitGroupLost {
		t.Fatalf("the rank exited with %v, want status %d (its MLX group lost):\n%s", err, stage.ExitGroupLost, out)
	}
}

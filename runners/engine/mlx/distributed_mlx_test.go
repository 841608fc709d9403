//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine"
)

// envRankOut marks a test binary started by runRanks as one rank: the file
// its rank test writes its results to (JSON).
const envRankOut = "EXO_MLX_RANK_OUT"

// runRanks starts the test binary n times on MLX's ring backend over
// 127.0.0.1, one process per rank (MLX_RANK and an MLX_HOSTFILE written
// here: a JSON list per rank of "ip:port" lists), each running only the
// test named test, and returns each rank's results file. A rank that fails
// fails t with its output.
func runRanks(t *testing.T, n int, test string, env ...string) [][]byte {
	t.Helper()
	dir := t.TempDir()
	base := testutil.Ports(t, n)
	hosts := make([][]string, n)
	for i := range hosts {
		hosts[i] = []string{"127.0.0.1:" + strconv.Itoa(base+i)}
	}
	raw, err := json.Marshal(hosts)
	if err != nil {
		t.Fatal(err)
	}
	hostfile := filepath.Join(dir, "hosts.json")
	if err := os.WriteFile(hostfile, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	// A bound for a ring that never forms (a rank that died before
	// connecting leaves its neighbour waiting): not a timing assertion.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type result struct {
		out []byte
		err error
	}
	done := make([]chan result, n)
	for i := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^"+test+"$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env,
			"MLX_RANK="+strconv.Itoa(i),
			"MLX_HOSTFILE="+hostfile,
			envRankOut+"="+filepath.Join(dir, fmt.Sprintf("rank%d.json", i)))
		done[i] = make(chan result, 1)
		go func() {
			out, err := cmd.CombinedOutput()
			done[i] <- result{out, err}
		}()
	}
	outs := make([][]byte, n)
	for i := range n {
		r := <-done[i]
		if r.err != nil {
			cancel() // the other ranks cannot finish without this one
			t.Errorf("rank %d: %v\n%s", i, r.err, r.out)
			continue
		}
		got, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d.json", i)))
		if err != nil {
			t.Errorf("rank %d wrote no results (%v):\n%s", i, err, r.out)
			continue
		}
		outs[i] = got
	}
	if t.Failed() {
		t.FailNow()
	}
	return outs
}

// rankOut is where this process, started by runRanks, writes its results;
// "" when it was not started so.
func rankOut() string { return os.Getenv(envRankOut) }

// writeRankOut writes v as this rank's results.
func writeRankOut(t *testing.T, v any) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rankOut(), raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ringResults is what each rank of TestDistributedRing reports.
type ringResults struct {
	Rank, Size          int
	Sum, Gather         []float32
	GatherShape         []int
	SumI32              []int32
	Received, RecvLiked []float32
	ReceivedShape       []int
	Available           bool
}

// ringInput is rank r's contribution: [2, 3] values that differ by rank.
func ringInput(r int) []float32 {
	out := make([]float32, 6)
	for i := range out {
		out[i] = float32((r+1)*10 + i)
	}
	return out
}

// ringMessage is what rank 0 sends to rank 1: [3, 4].
func ringMessage(salt float32) []float32 {
	out := make([]float32, 12)
	for i := range out {
		out[i] = salt + float32(i)*0.5
	}
	return out
}

// Two real processes on MLX's ring backend over loopback: all_sum and
// all_gather give every rank the right values, and send/recv (and
// recv_like) carry an array from rank 0 to rank 1.
func TestDistributedRing(t *testing.T) {
	newTestBackend(t) // skips without libmlxc
	outs := runRanks(t, 2, "TestDistributedRingRank")
	want0, want1 := ringInput(0), ringInput(1)
	for r, raw := range outs {
		var got ringResults
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("rank %d results: %v", r, err)
		}
		if got.Rank != r || got.Size != 2 {
			t.Errorf("rank %d: reports rank %d of %d", r, got.Rank, got.Size)
		}
		if !got.Available {
			t.Errorf("rank %d: is_available(ring) is false", r)
		}
		wantSum := make([]float32, 6)
		for i := range wantSum {
			wantSum[i] = want0[i] + want1[i]
		}
		if !slices.Equal(got.Sum, wantSum) {
			t.Errorf("rank %d: all_sum %v, want %v", r, got.Sum, wantSum)
		}
		if wantI := []int32{3, 3, 3}; !slices.Equal(got.SumI32, wantI) {
			t.Errorf("rank %d: int32 all_sum %v, want %v", r, got.SumI32, wantI)
		}
		if wantG := slices.Concat(want0, want1); !slices.Equal(got.Gather, wantG) || !slices.Equal(got.GatherShape, []int{4, 3}) {
			t.Errorf("rank %d: all_gather %v %v, want [4 3] %v", r, got.GatherShape, got.Gather, wantG)
		}
		if r == 1 {
			if !slices.Equal(got.Received, ringMessage(7)) || !slices.Equal(got.ReceivedShape, []int{3, 4}) {
				t.Errorf("rank 1: recv %v %v, want [3 4] %v", got.ReceivedShape, got.Received, ringMessage(7))
			}
			if !slices.Equal(got.RecvLiked, ringMessage(-3)) {
				t.Errorf("rank 1: recv_like %v, want %v", got.RecvLiked, ringMessage(-3))
			}
		}
	}
}

// TestDistributedRingRank is one rank of TestDistributedRing (it skips
// unless runRanks started it).
func TestDistributedRingRank(t *testing.T) {
	if rankOut() == "" {
		t.Skip("a rank of TestDistributedRing; runs only in the processes it starts")
	}
	b := newTestBackend(t)
	avail, err := DistributedAvailable(b, "ring")
	if err != nil {
		t.Fatal(err)
	}
	c, err := JoinGroup(b, GroupOptions{Backend: "ring", Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	res := ringResults{Rank: c.Rank(), Size: c.Size(), Available: avail}
	if want := os.Getenv("MLX_RANK"); strconv.Itoa(c.Rank()) != want {
		t.Fatalf("rank %d, MLX_RANK %s", c.Rank(), want)
	}
	x := b.FromFloat32(ringInput(c.Rank()), 2, 3)
	sum, gather := c.AllSum(b, x), c.AllGather(x)
	r1 := int32(c.Rank() + 1)
	ones := c.AllSum(b, b.FromInt32([]int32{r1, r1, r1}, 3))
	if err := b.Eval(sum, gather, ones); err != nil {
		t.Fatal(err)
	}
	if res.Sum, err = b.Float32(sum); err != nil {
		t.Fatal(err)
	}
	if res.Gather, err = b.Float32(gather); err != nil {
		t.Fatal(err)
	}
	res.GatherShape = gather.Shape()
	raw, err := b.Bytes(ones)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+4 <= len(raw); i += 4 {
		res.SumI32 = append(res.SumI32, int32(uint32(raw[i])|uint32(raw[i+1])<<8|uint32(raw[i+2])<<16|uint32(raw[i+3])<<24))
	}
	switch c.Rank() {
	case 0:
		if err := b.Eval(c.Send(b.FromFloat32(ringMessage(7), 3, 4), 1)); err != nil {
			t.Fatal(err)
		}
		if err := b.Eval(c.Send(b.FromFloat32(ringMessage(-3), 3, 4), 1)); err != nil {
			t.Fatal(err)
		}
	case 1:
		got := c.Recv([]int{3, 4}, engine.F32, 0)
		if res.Received, err = b.Float32(got); err != nil {
			t.Fatal(err)
		}
		res.ReceivedShape = got.Shape()
		like := c.RecvLike(b.FromFloat32(make([]float32, 12), 3, 4), 0)
		if res.RecvLiked, err = b.Float32(like); err != nil {
			t.Fatal(err)
		}
	}
	writeRankOut(t, res)
}

// In one process without MLX_RANK/MLX_HOSTFILE: a strict ring init fails
// with an error (never exit), and a group of one sums to its input.
func TestDistributedAlone(t *testing.T) {
	if rankOut() != "" {
		t.Skip("not a rank test")
	}
	for _, k := range []string{"MLX_RANK", "MLX_HOSTFILE"} {
		t.Setenv(k, "") // restored after the test
		os.Unsetenv(k)
	}
	b := newTestBackend(t)
	if avail, err := DistributedAvailable(b, "ring"); err != nil || !avail {
		t.Errorf("DistributedAvailable(ring) = %v, %v; want true (every CPU build has ring)", avail, err)
	}
	if _, err := JoinGroup(b, GroupOptions{Backend: "ring", Strict: true}); !errors.Is(err, ErrDistributed) {
		t.Errorf("strict ring init without MLX_RANK: %v, want an ErrDistributed", err)
	} else {
		t.Logf("strict ring init without MLX_RANK: %v", err)
	}
	if _, err := JoinGroup(b, GroupOptions{Backend: "no-such-backend", Strict: true}); !errors.Is(err, ErrDistributed) {
		t.Errorf("unknown backend: %v, want an ErrDistributed", err)
	}
	if _, err := JoinGroup(b, GroupOptions{Backend: "ring", StallAfter: time.Second}); !errors.Is(err, ErrDistributed) {
		t.Errorf("StallAfter without OnStall: %v, want an ErrDistributed", err)
	}
	c, err := JoinGroup(b, GroupOptions{Backend: "ring"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Rank() != 0 || c.Size() != 1 {
		t.Fatalf("non-strict ring init alone: rank %d of %d, want 0 of 1", c.Rank(), c.Size())
	}
	in := ringInput(4)
	got, err := b.Float32(c.AllSum(b, b.FromFloat32(in, 2, 3)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, in) {
		t.Errorf("all_sum over one rank: %v, want %v", got, in)
	}
	g := c.AllGather(b.FromFloat32(in, 2, 3))
	if sh := g.Shape(); !slices.Equal(sh, []int{2, 3}) {
		t.Errorf("all_gather over one rank: shape %v, want [2 3]", sh)
	}
}

// lostResults is what each rank of TestDistributedPeerLost reports.
type lostResults struct {
	Rank int
	// Rank 0: the all_sum's evaluation stalled for Stalled seconds (the
	// watchdog fired), or returned with Err.
	Stalled  float64
	Returned bool
	Err      string
}

// A rank whose peer process has died is not left hanging unnoticed: MLX's
// ring all_sum with a dead neighbour never returns (no error), and the
// group's stall watchdog reports it, so a runner can end its process and
// be restarted with its group. The test accepts an error from the
// evaluation too (should MLX start reporting a lost peer).
func TestDistributedPeerLost(t *testing.T) {
	if rankOut() != "" {
		t.Skip("not a rank test")
	}
	newTestBackend(t) // skips without libmlxc
	outs := runRanks(t, 2, "TestDistributedPeerLostRank")
	var r0 lostResults
	if err := json.Unmarshal(outs[0], &r0); err != nil {
		t.Fatalf("rank 0 results: %v", err)
	}
	switch {
	case r0.Returned && r0.Err != "":
		t.Logf("MLX failed the all_sum after the peer died: %s", r0.Err)
	case r0.Returned:
		t.Fatalf("rank 0's all_sum returned without error with its peer gone")
	case r0.Stalled < peerLostStall.Seconds():
		t.Fatalf("rank 0's watchdog fired after %.1f s, before StallAfter %v", r0.Stalled, peerLostStall)
	default:
		t.Logf("rank 0's all_sum stalled with its peer gone; the watchdog fired after %.1f s", r0.Stalled)
	}
}

// peerLostStall is TestDistributedPeerLost's StallAfter: the all_sum it
// watches can never complete, so any bound shows the same thing.
const peerLostStall = 2 * time.Second

// TestDistributedPeerLostRank is one rank of TestDistributedPeerLost: rank
// 1 joins and exits; rank 0 waits for it to be gone, then all_sums.
func TestDistributedPeerLostRank(t *testing.T) {
	if rankOut() == "" {
		t.Skip("a rank of TestDistributedPeerLost; runs only in the processes it starts")
	}
	b := newTestBackend(t)
	write := func(v lostResults) {
		raw, _ := json.Marshal(v)
		if err := os.WriteFile(rankOut(), raw, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	pidFile := filepath.Join(filepath.Dir(rankOut()), "rank1.pid")
	c, err := JoinGroup(b, GroupOptions{Backend: "ring", Strict: true, StallAfter: peerLostStall, OnStall: func(d time.Duration) {
		// The test goroutine is inside the evaluation that will never
		// return: report and end the process, as a runner would.
		// syscall.Exit, not os.Exit: under the race detector os.Exit
		// runs C's exit handlers, and MLX's destructors wait for the
		// stuck evaluation.
		write(lostResults{Rank: 0, Stalled: d.Seconds()})
		syscall.Exit(0)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Rank() == 1 {
		write(lostResults{Rank: 1})
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			t.Fatal(err)
		}
		syscall.Exit(0) // gone without a word to rank 0, as a crashed runner
	}
	gone := testutil.Until(time.Minute, func() bool {
		raw, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err := strconv.Atoi(string(raw))
		return err == nil && syscall.Kill(pid, 0) == syscall.ESRCH
	})
	if !gone {
		t.Fatal("rank 1 did not exit")
	}
	x := b.FromFloat32(ringInput(0), 2, 3)
	err = b.Eval(c.AllSum(b, x))
	res := lostResults{Rank: 0, Returned: true}
	if err != nil {
		res.Err = err.Error()
	}
	write(res)
}

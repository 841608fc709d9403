package e2e

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// TestPipelineGroups: decode.groups = two pipeline groups of two stages
// over four real supervisors (127.0.0.2–.5). Each group's stage 0 serves
// the API like a replica, with the whole model's greedy text. kill -9 of
// group 0's second stage mid-stream (its supervisor paused, so that the
// group stays down) ends that stream with an error event, not a hang and
// not a new status; requests through group 0's own gateway then go to
// group 1, every one answered (no 5xx: their answers had not started);
// once the supervisor runs again it restarts the stage, group 0 comes
// back and serves its gateway's requests again.
func TestPipelineGroups(t *testing.T) {
	s := setupHosts(t, []string{"g0s0", "g0s1", "g1s0", "g1s1"}, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
	prompt := "Tell me about the groups."
	want := s.oneRunner(t, prompt)[0]
	runners := []string{"tiny-decode-group0-stage0", "tiny-decode-group0-stage1", "tiny-decode-group1-stage0", "tiny-decode-group1-stage1"}
	hs, pids, base := s.start(t, `{ groups = [["g0s0", "g0s1"], ["g1s0", "g1s1"]], shard = "pipeline" }`, oneEach(runners))
	g0, g0mid, g1 := hs[0], hs[1], hs[2]
	group0, group1 := "g0s0/"+runners[0], "g1s0/"+runners[2]

	// Each group's stage 0 serves its own gateway (local first), the
	// others' gateways reach one of them; every answer is the whole model's.
	addr0, addr1 := s.addrs[0]+":"+fmt.Sprint(base), s.addrs[2]+":"+fmt.Sprint(base)
	waitGateways(t, hs, 60*time.Second, "both groups", addr0, addr1)
	for _, h := range hs {
		runner, text := chatText(t, h.api, prompt)
		if text != want {
			t.Errorf("via %s (served by %s): %q, one runner %q", h.name, runner, text, want)
		}
		switch {
		case h == g0 && runner != group0, h == g1 && runner != group1, runner != group0 && runner != group1:
			t.Errorf("via %s: served by %q", h.name, runner)
		}
	}

	// Pause g0s1's supervisor, so that the stage killed below stays dead
	// until the test lets it heal.
	if err := g0mid.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			g0mid.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	r := breakStream(t, g0.api, "kill -9 of group 0's stage 1", func() { syscall.Kill(pids[1][runners[1]], syscall.SIGKILL) }, 90*time.Second)
	if r.Status != http.StatusOK || r.Runner != group0 || r.Done || (r.ErrorMsg == "" && r.Err == nil) {
		t.Errorf("the stream whose stage was killed: %+v, want a 200 stream from group 0 ending in an error", r)
	}

	// Group 0 out of rotation: requests through g0s0's gateway, sent at
	// once, are all served by group 1 (one that reaches group 0's stage 0
	// first, before its /health says the ring is down, is refused there
	// before its answer began and goes on to group 1).
	for i := range 3 {
		code, text, body := tryChatVia(g0.api, prompt)
		if code != 200 || text.text != want || text.runner != group1 {
			t.Errorf("request %d with group 0 down: %d served by %q: %q (%s), want group 1's %q", i, code, text.runner, text.text, body, want)
		}
	}
	if h := g0.gatewayView(t)[addr0]; h.OK {
		t.Errorf("g0s0's gateway has group 0 in rotation with its stage 1 dead: %+v", h)
	}

	// The supervisor runs again: it restarts the stage, group 0 re-forms
	// and its gateway routes to it (local first) again.
	if err := g0mid.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	paused = false
	waitRestarted(t, g0mid, runners[1], pids[1][runners[1]])
	var last string
	if !testutil.Until(90*time.Second, func() bool {
		code, got, body := tryChatVia(g0.api, prompt)
		last = fmt.Sprintf("%d %s %q %s", code, got.runner, got.text, body)
		return code == 200 && got.runner == group0
	}) {
		t.Fatalf("group 0 never served again; last: %s", last)
	}
	if _, text := chatText(t, g0.api, prompt); text != want {
		t.Errorf("group 0 after the restart: %q, want %q", text, want)
	}
	for _, h := range hs {
		stopHost(t, h)
	}
}

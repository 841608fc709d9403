package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// needAddrs skips the test where one of the loopback addresses cannot be
// listened on.
func needAddrs(t *testing.T, ips ...string) {
	t.Helper()
	for _, ip := range ips {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Skipf("loopback address %s unusable here: %v", ip, err)
		}
		l.Close()
	}
}

// hostsCluster is a cluster of hosts (name → address, all cpu or
// $EXO_E2E_HOST_BACKEND) serving model "tiny" with the given decode.
func hostsCluster(base, apiPort int, model, secret string, names, addrs []string, decode string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[cluster]\nname = \"e2e\"\nrunner_port_base = %d\nsecret_file = %q\n\n[api]\nport = %d\n", base, secret, apiPort)
	for i, n := range names {
		fmt.Fprintf(&b, "\n[hosts.%s]\naddress = %q\nbackend = %q\n", n, addrs[i], hostBackend())
	}
	fmt.Fprintf(&b, "\n[[models]]\nname = \"tiny\"\nsource = %q\ndecode = %s\n", model, decode)
	return b.String()
}

// streamResult is how a streamed chat ended.
type streamResult struct {
	Status   int
	Runner   string // X-Exo-Runner
	Text     string
	Done     bool   // the stream ended with [DONE]
	ErrorMsg string // an error event's message
	Err      error  // the connection's error
	Took     time.Duration
}

// streamChat streams a greedy chat of up to max tokens (ignore_eos: it runs
// until max or until it breaks) through api; first is called at the first
// content.
func streamChat(ctx context.Context, api, prompt string, max int, first func()) streamResult {
	t0 := time.Now()
	var r streamResult
	body, _ := json.Marshal(map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": max, "temperature": 0, "stream": true, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		r.Err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.Err, r.Took = err, time.Since(t0)
		return r
	}
	defer resp.Body.Close()
	r.Status, r.Runner = resp.StatusCode, resp.Header.Get("X-Exo-Runner")
	var once sync.Once
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			r.Done = true
			continue
		}
		var ev struct {
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if ev.Error != nil {
			r.ErrorMsg = ev.Error.Message
		}
		if len(ev.Choices) > 0 && ev.Choices[0].Delta.Content != "" {
			r.Text += ev.Choices[0].Delta.Content
			once.Do(first)
		}
	}
	r.Err, r.Took = sc.Err(), time.Since(t0)
	return r
}

// startHosts starts one supervisor per name on its address and waits until
// each runs its runners (wants[i]); it returns the hosts and their PIDs.
func startHosts(t *testing.T, exe, dir, cfgPath string, apiPort int, names, addrs []string, wants [][]string) ([]*host, []map[string]int) {
	t.Helper()
	hs := make([]*host, len(names))
	for i := range names {
		hs[i] = startHost(t, exe, dir, cfgPath, names[i], addrs[i], apiPort)
	}
	pids := make([]map[string]int, len(names))
	for i, h := range hs {
		pids[i] = h.waitRunners(t, wants[i]...)
	}
	return hs, pids
}

// waitRestarted waits until h runs runner ready under a PID other than old
// and returns the new one.
func waitRestarted(t *testing.T, h *host, runner string, old int) int {
	t.Helper()
	var pid int
	var st status
	if !testutil.Until(120*time.Second, func() bool {
		var err error
		if st, err = h.status(t); err != nil {
			return false
		}
		for _, r := range st.Runners {
			if r.Spec.Name == runner && r.Status.PID != old && r.Status.State == "ready" {
				pid = r.Status.PID
				return true
			}
		}
		return false
	}) {
		b, _ := os.ReadFile(h.log)
		t.Fatalf("%s: %s not restarted: %+v\n%s", h.name, runner, st, tail(string(b), 3000))
	}
	return pid
}

// tinyLong generates the tiny llama model with 4 layers and a long context
// (streams that run until they are broken).
func tinyLong(t *testing.T, root, dir string) string {
	t.Helper()
	model := filepath.Join(dir, "tiny4long")
	run(t, root, "go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "llama", "-layers", "4", "-max-positions", "32768", model)
	return model
}

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
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	names := []string{"g0s0", "g0s1", "g1s0", "g1s1"}
	addrs := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}
	needAddrs(t, addrs...)
	root, dir, exe, _ := buildExoAndModel(t)
	model := tinyLong(t, root, dir)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompt := "Tell me about the groups."
	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, []string{prompt})[0]

	base, apiPort := freePort(t), freePort(t)
	src := hostsCluster(base, apiPort, model, secret, names, addrs, `{ groups = [["g0s0", "g0s1"], ["g1s0", "g1s1"]], shard = "pipeline" }`)
	if err := os.WriteFile(cfgPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	runners := []string{"tiny-decode-group0-stage0", "tiny-decode-group0-stage1", "tiny-decode-group1-stage0", "tiny-decode-group1-stage1"}
	hs, pids := startHosts(t, exe, dir, cfgPath, apiPort, names, addrs, [][]string{{runners[0]}, {runners[1]}, {runners[2]}, {runners[3]}})
	g0, g0mid, g1 := hs[0], hs[1], hs[2]
	group0, group1 := "g0s0/"+runners[0], "g1s0/"+runners[2]

	// Each group's stage 0 serves its own gateway (local first), the
	// others' gateways reach one of them; every answer is the whole model's.
	addr0, addr1 := addrs[0]+":"+fmt.Sprint(base), addrs[2]+":"+fmt.Sprint(base)
	for _, h := range hs {
		if !testutil.Until(60*time.Second, func() bool { v := h.gatewayView(t); return v[addr0].OK && v[addr1].OK }) {
			t.Fatalf("%s's gateway never saw both groups healthy: %+v", h.name, h.gatewayView(t))
		}
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	streaming := make(chan struct{})
	done := make(chan streamResult, 1)
	go func() { done <- streamChat(ctx, g0.api, "go on and on", 30000, func() { close(streaming) }) }()
	select {
	case <-streaming:
	case r := <-done:
		t.Fatalf("the stream ended before the kill: %+v", r)
	}
	syscall.Kill(pids[1][runners[1]], syscall.SIGKILL)
	var r streamResult
	select {
	case r = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the stream did not end within 90 s of its group's stage 1 being killed")
	}
	t.Logf("the broken stream: status %d via %s after %v, %d chars, error %q, done %v, err %v", r.Status, r.Runner, r.Took, len(r.Text), r.ErrorMsg, r.Done, r.Err)
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

type served struct{ runner, text string }

// tryChatVia is tryChat that also says which runner served.
func tryChatVia(api, prompt string) (int, served, string) {
	b, _ := json.Marshal(map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": 12, "temperature": 0})
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Post("http://"+api+"/v1/chat/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		return 0, served{}, err.Error()
	}
	defer resp.Body.Close()
	var raw strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&raw)
	var v struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	s := served{runner: resp.Header.Get("X-Exo-Runner")}
	if resp.StatusCode == 200 && json.Unmarshal([]byte(raw.String()), &v) == nil && len(v.Choices) == 1 {
		s.text = v.Choices[0].Message.Content
	}
	return resp.StatusCode, s, raw.String()
}

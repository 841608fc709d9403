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
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// The helpers of the tests over several real supervisors on loopback
// addresses (127.0.0.2…): decode groups, stages of tensor groups, a
// pipeline's middle-stage chaos.

// hostsSetup is what those tests set up alike: the built exo, the tiny
// llama model with 4 layers and a long context, the cluster secret, the
// cluster file's path and the hosts' names and addresses.
type hostsSetup struct {
	root, dir, exe, model, cfgPath, secret string
	names, addrs                           []string
}

// setupHosts skips the test in -short mode or where one of addrs cannot be
// listened on, then builds exo, generates the model (tinyLong) and writes
// the cluster secret.
func setupHosts(t *testing.T, names, addrs []string) *hostsSetup {
	t.Helper()
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needAddrs(t, addrs...)
	root, dir, exe, _ := buildExoAndModel(t)
	s := &hostsSetup{root: root, dir: dir, exe: exe, model: tinyLong(t, root, dir),
		cfgPath: filepath.Join(dir, "cluster.toml"), secret: filepath.Join(dir, "secret"), names: names, addrs: addrs}
	if err := os.WriteFile(s.secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// oneRunner is oneRunnerAnswers on s: the greedy answers of one decode
// runner with the whole model.
func (s *hostsSetup) oneRunner(t *testing.T, prompts ...string) []string {
	t.Helper()
	return oneRunnerAnswers(t, s.exe, s.dir, s.cfgPath, s.model, s.secret, prompts)
}

// start writes the cluster file (hostsCluster on fresh ports, models.decode
// = decode) and starts one supervisor per host, waiting until host i runs
// wants[i]; it returns the hosts, their runners' PIDs and the runner port
// base.
func (s *hostsSetup) start(t *testing.T, decode string, wants [][]string) ([]*host, []map[string]int, int) {
	t.Helper()
	base, apiPort := freePort(t), freePort(t)
	if err := os.WriteFile(s.cfgPath, []byte(hostsCluster(base, apiPort, s.model, s.secret, s.names, s.addrs, decode)), 0o644); err != nil {
		t.Fatal(err)
	}
	hs, pids := startHosts(t, s.exe, s.dir, s.cfgPath, apiPort, s.names, s.addrs, wants)
	return hs, pids, base
}

// oneEach is wants for start where host i runs runners[i] alone.
func oneEach(runners []string) [][]string {
	wants := make([][]string, len(runners))
	for i, r := range runners {
		wants[i] = []string{r}
	}
	return wants
}

// waitGateways waits until every host's gateway sees each of the decode
// runners at addrs healthy, failing the test after within.
func waitGateways(t *testing.T, hs []*host, within time.Duration, what string, addrs ...string) {
	t.Helper()
	for _, h := range hs {
		if !testutil.Until(within, func() bool {
			v := h.gatewayView(t)
			for _, a := range addrs {
				if !v[a].OK {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("%s's gateway never saw %s healthy: %+v", h.name, what, h.gatewayView(t))
		}
	}
}

// breakStream streams a long greedy answer through api, calls hit at its
// first content and returns how the stream ended. It fails the test where
// the stream ended before hit or did not end within limit of it; what the
// stream's end must look like is the caller's to check.
func breakStream(t *testing.T, api, what string, hit func(), limit time.Duration) streamResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit+90*time.Second)
	defer cancel()
	streaming := make(chan struct{})
	done := make(chan streamResult, 1)
	go func() { done <- streamChat(ctx, api, "go on and on", 30000, func() { close(streaming) }) }()
	select {
	case <-streaming:
	case r := <-done:
		t.Fatalf("%s: the stream ended before the fault: %+v", what, r)
	}
	hit()
	select {
	case r := <-done:
		t.Logf("%s: the broken stream: status %d via %s after %v, %d chars, error %q, done %v, err %v", what, r.Status, r.Runner, r.Took, len(r.Text), r.ErrorMsg, r.Done, r.Err)
		return r
	case <-time.After(limit):
		t.Fatalf("%s: the stream did not end within %v of the fault", what, limit)
	}
	return streamResult{}
}

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

type served struct{ runner, text string }

// tryChatVia is tryChat that also says which runner served, its request
// bound to 2 minutes.
func tryChatVia(api, prompt string) (int, served, string) {
	return postChat(&http.Client{Timeout: 2 * time.Minute}, api, prompt)
}

// postChat sends a greedy chat of 12 tokens through api with c and returns
// the status, the runner that served and the answer's text (when 200), and
// the body (or the request's error).
func postChat(c *http.Client, api, prompt string) (int, served, string) {
	b, _ := json.Marshal(map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": 12, "temperature": 0})
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

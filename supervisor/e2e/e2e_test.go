// Package e2e tests the supervisor end to end with real `exo` processes: two
// supervisors acting as two hosts of one cluster file on loopback addresses,
// real prefill and decode runners on a tiny generated model (cpu backend).
// It builds the exo binary and generates the model with `go` commands; it
// does not import runners/.
package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func run(t *testing.T, dir string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// freePort returns the first of a block of ports free a moment ago, outside
// the kernel's ephemeral range (testutil.Ports: no outgoing connection on a
// busy machine takes one before the server binds it), wide enough for a
// runner_port_base of a few models (config.PortsPerModel apart).
func freePort(t *testing.T) int {
	t.Helper()
	return testutil.Ports(t, 40)
}

type host struct {
	name, api string
	cmd       *exec.Cmd
	log       string
	done      chan struct{} // closed once the supervisor has exited (startHost's cmd.Wait returned)
	exitErr   error         // cmd.Wait's error, once done is closed
}

// wait waits up to limit for the supervisor to exit; exited is false if it
// still runs, else err is its exit status (nil: a clean exit).
func (h *host) wait(limit time.Duration) (err error, exited bool) {
	select {
	case <-h.done:
		return h.exitErr, true
	case <-time.After(limit):
		return nil, false
	}
}

// stop sends the supervisor SIGTERM and waits up to limit, as wait.
func (h *host) stop(limit time.Duration) (err error, exited bool) {
	h.cmd.Process.Signal(syscall.SIGTERM)
	return h.wait(limit)
}

type status struct {
	LastReload struct {
		OK      bool
		At      time.Time
		Changes string
	} `json:"last_reload"`
	Runners []struct {
		Spec struct {
			Name string `json:"name"`
		} `json:"spec"`
		Status struct {
			State    string `json:"state"`
			PID      int    `json:"pid"`
			Restarts int    `json:"restarts"`
		} `json:"status"`
	} `json:"runners"`
}

func (h *host) status(t *testing.T) (status, error) {
	var st status
	resp, err := http.Get("http://" + h.api + "/exo/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// waitRunners waits until h runs exactly names, all ready, and returns PIDs.
func (h *host) waitRunners(t *testing.T, names ...string) map[string]int {
	t.Helper()
	var last status
	var pids map[string]int
	if testutil.Until(90*time.Second, func() bool {
		st, err := h.status(t)
		if err != nil {
			return false
		}
		last = st
		pids = map[string]int{}
		ready := 0
		for _, r := range st.Runners {
			pids[r.Spec.Name] = r.Status.PID
			if r.Status.State == "ready" {
				ready++
			}
		}
		ok := len(st.Runners) == len(names) && ready == len(names)
		for _, n := range names {
			_, has := pids[n]
			ok = ok && has
		}
		return ok
	}) {
		return pids
	}
	b, _ := os.ReadFile(h.log)
	t.Fatalf("%s: runners %v never ready; last status %+v\nlog:\n%s", h.name, names, last, tail(string(b), 4000))
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

var prompts = 0

// chat sends a new prompt each time (a repeated one could be served from
// the decode runner's own prefix cache, without remote prefill).
func chat(t *testing.T, api string) (string, string) {
	t.Helper()
	prompts++
	body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"Prompt %d: hello there, how are you today? Tell me a story."}],"max_tokens":8,"temperature":0}`, prompts)
	resp, err := http.Post("http://"+api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("chat via %s: %d %s", api, resp.StatusCode, b)
	}
	var v struct {
		Choices []struct {
			Message struct{ Content string }
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(b, &v); err != nil || len(v.Choices) != 1 || v.Usage.CompletionTokens == 0 {
		t.Fatalf("chat via %s: %s (%v)", api, b, err)
	}
	return resp.Header.Get("X-Exo-Runner"), v.Choices[0].Message.Content
}

// remotePrefillOK sums exo_remote_prefill_total{outcome="ok"} in h's /metrics.
func remotePrefillOK(t *testing.T, api string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "exo_remote_prefill_total{") && strings.Contains(line, `outcome="ok"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// remotePrefillOutcomes sums exo_remote_prefill_total in h's /metrics by
// outcome.
func remotePrefillOutcomes(t *testing.T, api string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "exo_remote_prefill_total{") {
			continue
		}
		_, rest, ok := strings.Cut(line, `outcome="`)
		if !ok {
			continue
		}
		outcome, _, _ := strings.Cut(rest, `"`)
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		out[outcome] += v
	}
	return out
}

// cluster is the cluster file of the two hosts spark (127.0.0.2) and mac
// (127.0.0.3), both on the cpu backend, serving model "tiny" from
// modelDir: decode runners on decodeHosts, the prefill runner on spark,
// every prompt prefilled remotely. With secretFile "" the KV wire runs
// insecure (loopback only).
func cluster(base int, modelDir, secretFile string, decodeHosts ...string) string {
	name, kv := "e2e", fmt.Sprintf("secret_file = %q", secretFile)
	if secretFile == "" {
		name, kv = "chaos", "insecure = true # loopback only; the KV secret is exercised by TestTwoHosts"
	}
	var hosts []string
	for _, h := range decodeHosts {
		hosts = append(hosts, strconv.Quote(h))
	}
	return fmt.Sprintf(`[cluster]
name = %q
runner_port_base = %d
%s

[hosts.spark]
address = "127.0.0.2"
backend = "cpu"

[hosts.mac]
address = "127.0.0.3"
backend = "cpu"

[[models]]
name = "tiny"
source = %q
decode = { hosts = [%s] }
prefill = { hosts = ["spark"] }
remote_prefill_min_tokens = 1
remote_prefill_route = "floor" # every prompt remote: the test is about the remote path, not the route
`, name, base, kv, modelDir, strings.Join(hosts, ", "))
}

func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// needLoopbackHosts skips the test where 127.0.0.2 and 127.0.0.3, the two
// hosts' addresses, cannot be listened on.
func needLoopbackHosts(t *testing.T) {
	t.Helper()
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Skipf("loopback address %s unusable here: %v", ip, err)
		}
		l.Close()
	}
}

// buildExoAndModel builds the exo binary and generates the tiny llama model
// in a fresh temporary directory, returned with their paths and the
// repository root.
func buildExoAndModel(t *testing.T) (root, dir, exe, model string) {
	t.Helper()
	root = repoRoot(t)
	dir = t.TempDir()
	exe = filepath.Join(dir, "exo")
	run(t, root, "go", "build", "-o", exe, "./cmd/exo")
	model = filepath.Join(dir, "tiny")
	run(t, root, "go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "llama", model)
	return root, dir, exe, model
}

// startTwoHosts starts `exo supervise` for spark (127.0.0.2) and mac
// (127.0.0.3) on cfgPath, each logging to dir/<name>.log and stopped at
// cleanup.
func startTwoHosts(t *testing.T, exe, dir, cfgPath string, apiPort int, extra ...string) (spark, mac *host) {
	t.Helper()
	return startHost(t, exe, dir, cfgPath, "spark", "127.0.0.2", apiPort, extra...), startHost(t, exe, dir, cfgPath, "mac", "127.0.0.3", apiPort, extra...)
}

// startHost starts `exo supervise --host name --grace 3s extra…` on
// cfgPath with its gateway on ip:apiPort, logging to dir/<name>.log (a
// later flag in extra wins). At cleanup it is stopped with SIGTERM (its
// runners with it), killed if still there 20 s later, and, when the test
// failed, the end of its log is logged.
func startHost(t *testing.T, exe, dir, cfgPath, name, ip string, apiPort int, extra ...string) *host {
	t.Helper()
	return launchHost(t, exe, dir, cfgPath, name, ip, apiPort, nil, extra)
}

// startHostEnv is startHost with env added to the supervisor's environment.
func startHostEnv(t *testing.T, exe, dir, cfgPath, name, ip string, apiPort int, env ...string) *host {
	t.Helper()
	return launchHost(t, exe, dir, cfgPath, name, ip, apiPort, env, nil)
}

// launchHost is startHost with env added to the environment and extra to
// the flags.
func launchHost(t *testing.T, exe, dir, cfgPath, name, ip string, apiPort int, env, extra []string) *host {
	t.Helper()
	h := &host{name: name, api: fmt.Sprintf("%s:%d", ip, apiPort), log: filepath.Join(dir, name+".log")}
	logf, err := os.Create(h.log)
	if err != nil {
		t.Fatal(err)
	}
	h.cmd = exec.Command(exe, append([]string{"supervise", "--config", cfgPath, "--host", name, "--listen", h.api, "--grace", "3s"}, extra...)...)
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	h.cmd.Env = append(append(os.Environ(), "NOTIFY_SOCKET="), env...)
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.done = make(chan struct{})
	go func() { h.exitErr = h.cmd.Wait(); close(h.done) }()
	t.Cleanup(func() {
		if _, exited := h.stop(20 * time.Second); !exited {
			h.cmd.Process.Kill()
			<-h.done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(h.log)
			t.Logf("--- %s log:\n%s", h.name, tail(string(b), 6000))
		}
	})
	return h
}

func TestTwoHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needLoopbackHosts(t)
	_, dir, exe, model := buildExoAndModel(t)

	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, apiPort := freePort(t), freePort(t)
	if err := os.WriteFile(cfgPath, []byte(cluster(base, model, secret, "mac")), 0o644); err != nil {
		t.Fatal(err)
	}
	spark, mac := startTwoHosts(t, exe, dir, cfgPath, apiPort)
	hosts := []*host{spark, mac}
	sparkPIDs := spark.waitRunners(t, "tiny-prefill")
	macPIDs := mac.waitRunners(t, "tiny-decode")

	// 1. A chat completion through either gateway is served by mac's decode
	// runner with spark's remote prefill.
	for _, h := range hosts {
		runner, text := chat(t, h.api)
		if runner != "mac/tiny-decode" {
			t.Errorf("via %s: served by %q", h.name, runner)
		}
		t.Logf("via %s: %q", h.name, text)
	}
	if n := remotePrefillOK(t, mac.api); n < 2 {
		t.Errorf("remote prefill ok = %v on mac, want ≥ 2", n)
	}

	// 2. Move decode to spark: both hosts reconcile; prefill keeps its PID.
	tmp := cfgPath + ".new"
	os.WriteFile(tmp, []byte(cluster(base, model, secret, "spark")), 0o644)
	if err := os.Rename(tmp, cfgPath); err != nil {
		t.Fatal(err)
	}
	sparkPIDs2 := spark.waitRunners(t, "tiny-decode", "tiny-prefill")
	mac.waitRunners(t)
	if sparkPIDs2["tiny-prefill"] != sparkPIDs["tiny-prefill"] {
		t.Errorf("prefill runner restarted by an unrelated change: %v → %v", sparkPIDs, sparkPIDs2)
	}
	if !gone(macPIDs["tiny-decode"]) {
		t.Errorf("mac's decode runner (pid %d) still running", macPIDs["tiny-decode"])
	}
	before := remotePrefillOK(t, spark.api)
	if runner, _ := chat(t, mac.api); runner != "spark/tiny-decode" {
		t.Errorf("after the move, via mac: served by %q", runner)
	}
	if after := remotePrefillOK(t, spark.api); after <= before {
		t.Errorf("remote prefill ok on spark %v → %v, want an increase", before, after)
	}

	// 3. Kill the prefill runner: spark's supervisor heals it.
	old := sparkPIDs2["tiny-prefill"]
	syscall.Kill(old, syscall.SIGKILL)
	var st status
	if !testutil.Until(60*time.Second, func() bool {
		var err error
		if st, err = spark.status(t); err != nil {
			return false
		}
		for _, r := range st.Runners {
			if r.Spec.Name == "tiny-prefill" && r.Status.PID != old && r.Status.State == "ready" && r.Status.Restarts == 1 {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("prefill runner not healed: %+v", st)
	}
	before = remotePrefillOK(t, spark.api)
	chat(t, spark.api)
	if after := remotePrefillOK(t, spark.api); after <= before {
		t.Errorf("remote prefill after healing: %v → %v", before, after)
	}

	// 4. SIGTERM: both supervisors exit cleanly and take their runners along.
	final := spark.waitRunners(t, "tiny-decode", "tiny-prefill")
	for _, h := range hosts {
		h.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, h := range hosts {
		if err, exited := h.wait(30 * time.Second); !exited {
			t.Errorf("%s did not exit after SIGTERM", h.name)
		} else if err != nil {
			t.Errorf("%s exited: %v", h.name, err)
		}
	}
	for name, pid := range final {
		if !gone(pid) {
			t.Errorf("%s (pid %d) survived its supervisor", name, pid)
		}
	}
}

// TestAPIKey: a gateway with [api] api_key_file refuses requests without
// the key (or with a wrong one) and serves them with it, through the
// official openai Python client; /health stays open.
func TestAPIKey(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	if err := exec.Command("python3", "-c", "import openai").Run(); err != nil {
		testutil.Missing(t, "python3 cannot import openai (pip install openai)")
	}
	root, dir, exe, model := buildExoAndModel(t)
	keyFile := filepath.Join(dir, "api-key")
	if err := os.WriteFile(keyFile, []byte("sk-exo-test-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "cluster.toml")
	cfg := fmt.Sprintf(`[cluster]
runner_port_base = %d

[api]
api_key_file = %q

[hosts.local]
address = "127.0.0.1"
backend = "cpu"

[[models]]
name = "tiny"
source = %q
decode = { hosts = ["local"] }
`, freePort(t), keyFile, model)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, exe, dir, cfgPath, "local", "127.0.0.1", freePort(t))

	// /health is open by default; wait for the decode runner through it.
	var err error
	if !testutil.Until(90*time.Second, func() bool {
		var resp *http.Response
		if resp, err = http.Get("http://" + h.api + "/health"); err != nil {
			return false
		}
		var v struct{ Status string }
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		return resp.StatusCode == 200 && v.Status == "ok"
	}) {
		b, _ := os.ReadFile(h.log)
		t.Fatalf("gateway never healthy: %v\n%s", err, tail(string(b), 4000))
	}
	// The supervisor's status is not open.
	if resp, err := http.Get("http://" + h.api + "/exo/status"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/exo/status without key: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	out, err := exec.Command("python3", filepath.Join(root, "supervisor", "e2e", "testdata", "openai_auth.py"),
		"http://"+h.api+"/v1", "tiny", "sk-exo-test-key").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("openai client: %v\n%s", err, stderr)
	}
	type result struct {
		OK               bool
		Status           int
		Message          string
		Content          string
		CompletionTokens int `json:"completion_tokens"`
	}
	var got map[string]result
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	t.Logf("openai client: %s", out)
	if r := got["none"]; r.OK || r.Status != 401 || !strings.Contains(r.Message, "missing API key") {
		t.Errorf("without a key: %+v", r)
	}
	if r := got["wrong"]; r.OK || r.Status != 401 || !strings.Contains(r.Message, "invalid API key") {
		t.Errorf("with a wrong key: %+v", r)
	}
	if r := got["right"]; !r.OK || r.CompletionTokens == 0 {
		t.Errorf("with the key: %+v", r)
	}
}

package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/internal/fakerunner"
	"github.com/exo-pd/exo-pd/supervisor/process"
	"github.com/exo-pd/exo-pd/supervisor/restart"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

func TestMain(m *testing.M) {
	fakerunner.MaybeRun()
	os.Exit(m.Run())
}

// freePort returns the first of a block of ports free a moment ago, outside
// the kernel's ephemeral range (testutil.Ports: no outgoing connection on a
// busy machine takes one before the server binds it), wide enough for a
// runner_port_base of a few models (config.PortsPerModel apart).
func freePort(t testing.TB) int {
	t.Helper()
	return testutil.Ports(t, 40)
}

func clusterFile(base int, models ...string) string {
	s := fmt.Sprintf("[cluster]\nname = \"t\"\nrunner_port_base = %d\n\n[hosts.h]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\n", base)
	for _, m := range models {
		name, src, _ := strings.Cut(m, "=")
		s += fmt.Sprintf("\n[[models]]\nname = %q\nsource = %q\ndecode = { hosts = [\"h\"] }\nprefill = { hosts = [\"h\"] }\n", name, src)
	}
	return s
}

type harness struct {
	t      testing.TB
	dir    string
	path   string
	api    string
	cancel context.CancelFunc
	done   chan error
	notify chan string
}

// start runs a supervisor on a real temp dir with fake runners.
func start(t testing.TB, contents string) *harness {
	return startDebounce(t, contents, 50*time.Millisecond)
}

func startDebounce(t testing.TB, contents string, debounce time.Duration) *harness {
	return startWith(t, contents, debounce, true)
}

// startWith starts a supervisor; wait: until every runner is ready; env:
// more environment for the fake runners.
func startWith(t testing.TB, contents string, debounce time.Duration, wait bool, env ...string) *harness {
	t.Helper()
	return startOpts(t, contents, debounce, wait, nil, env...)
}

// startOpts is startWith with mutate (when set) applied to the Options.
func startOpts(t testing.TB, contents string, debounce time.Duration, wait bool, mutate func(*Options), env ...string) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, path: filepath.Join(dir, "cluster.toml"), done: make(chan error, 1), notify: make(chan string, 100)}
	h.write(contents)
	// A real NOTIFY_SOCKET, as systemd would give.
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			h.notify <- string(buf[:n])
		}
	}()
	t.Setenv("NOTIFY_SOCKET", sock)
	h.api = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ready := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	o := Options{
		ConfigPath: h.path, Host: "h", Executable: os.Args[0],
		ExtraEnv:  append([]string{fakerunner.EnvEnable + "=1"}, env...),
		APIListen: h.api, Debounce: debounce, NoGPU: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Process: process.Options{Grace: 2 * time.Second, PollReady: 100 * time.Millisecond,
			Policy: restart.Policy{Attempts: 5, Interval: time.Minute, Initial: 10 * time.Millisecond, Max: time.Second, StableAfter: time.Minute, CrashLoopDelay: time.Minute}},
		Ready: func(api string) { ready <- api },
	}
	if mutate != nil {
		mutate(&o)
	}
	go func() { h.done <- Run(ctx, o) }()
	t.Cleanup(func() { h.stop() })
	if !wait {
		for i := 0; ; i++ { // until the API answers
			if resp, err := http.Get("http://" + h.api + "/health"); err == nil {
				resp.Body.Close()
				return h
			}
			if i > 3000 {
				t.Fatal("API never up")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	select {
	case <-ready:
	case err := <-h.done:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(30 * time.Second):
		// What each runner did (a crash loop names its last exit).
		var st []byte
		if resp, err := http.Get("http://" + h.api + "/exo/status"); err == nil {
			st, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		t.Fatalf("runners never ready; status: %s", st)
	}
	return h
}

func (h *harness) stop() error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		return err
	case <-time.After(60 * time.Second):
		h.t.Fatal("Run did not return after cancel")
		return nil
	}
}

func (h *harness) write(s string) {
	if err := os.WriteFile(h.path, []byte(s), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// renameOver writes s the way editors do: a new file renamed over the old.
func (h *harness) renameOver(s string) {
	tmp := filepath.Join(h.dir, ".cluster.toml.new")
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		h.t.Fatal(err)
	}
}

// symlinkSwap points cluster.toml at a new file via an atomic symlink swap.
func (h *harness) symlinkSwap(gen, s string) {
	target := filepath.Join(h.dir, gen+".toml")
	if err := os.WriteFile(target, []byte(s), 0o644); err != nil {
		h.t.Fatal(err)
	}
	link := filepath.Join(h.dir, ".link")
	os.Remove(link)
	if err := os.Symlink(target, link); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(link, h.path); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) status() Status {
	h.t.Helper()
	resp, err := http.Get("http://" + h.api + StatusPath)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		h.t.Fatal(err)
	}
	return st
}

func (h *harness) get(path string) string {
	h.t.Helper()
	resp, err := http.Get("http://" + h.api + path)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func pids(st Status) map[string]int {
	out := map[string]int{}
	for _, r := range st.Runners {
		out[r.Spec.Name] = r.Status.PID
	}
	return out
}

// waitReload waits for a reload after prev and for every runner to be ready.
func (h *harness) waitReload(prev time.Time) Status {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		st := h.status()
		allReady := true
		for _, r := range st.Runners {
			allReady = allReady && r.Status.State == process.Ready
		}
		if st.LastReload.At.After(prev) && (allReady || !st.LastReload.OK) {
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatalf("no reload after %v: %+v", prev, h.status())
	return Status{}
}

// expectNotify reads datagrams until one starts with prefix.
func (h *harness) expectNotify(prefix string) string {
	h.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case m := <-h.notify:
			if strings.HasPrefix(m, prefix) {
				return m
			}
		case <-timeout:
			h.t.Fatalf("no sd_notify %q", prefix)
			return ""
		}
	}
}

func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

func TestReloadAppliesMinimalDiff(t *testing.T) {
	base := freePort(t)
	h := start(t, clusterFile(base, "a=src-a", "b=src-b"))
	if m := h.expectNotify("READY=1"); !strings.Contains(m, "STATUS=host h: 4/4 runners ready") {
		t.Errorf("ready notification %q", m)
	}
	st := h.status()
	p0 := pids(st)
	if len(p0) != 4 || st.Host != "h" || st.Cluster != "t" || !st.LastReload.OK {
		t.Fatalf("status %+v", st)
	}

	// 1. Editor-style rename-over: only b's runners change.
	h.renameOver(clusterFile(base, "a=src-a", "b=src-b2"))
	h.expectNotify("RELOADING=1\nMONOTONIC_USEC=")
	st = h.waitReload(st.LastReload.At)
	p1 := pids(st)
	if p1["a-decode"] != p0["a-decode"] || p1["a-prefill"] != p0["a-prefill"] {
		t.Errorf("untouched runners restarted: %v → %v", p0, p1)
	}
	if p1["b-decode"] == p0["b-decode"] || p1["b-prefill"] == p0["b-prefill"] || !gone(p0["b-decode"]) {
		t.Errorf("changed runners not restarted: %v → %v", p0, p1)
	}
	if st.LastReload.Changes != "start [], stop [], restart [b-decode b-prefill], keep [a-decode a-prefill]" {
		t.Errorf("changes %q", st.LastReload.Changes)
	}
	h.expectNotify("READY=1")

	// 2. An invalid in-place write: old runners keep running, the failure is reported.
	h.write(clusterFile(base, "a=src-a") + "bogus = 1\n")
	st = h.waitReload(st.LastReload.At)
	if st.LastReload.OK || !strings.Contains(st.LastReload.Error, `cluster.toml:14:1: unknown key "bogus"`) {
		t.Errorf("last reload %+v", st.LastReload)
	}
	if p := pids(st); fmt.Sprint(p) != fmt.Sprint(p1) {
		t.Errorf("invalid file changed runners: %v → %v", p1, p)
	}
	if m := h.expectNotify("READY=1\nSTATUS=config reload FAILED"); !strings.Contains(m, `unknown key \"bogus\"`) && !strings.Contains(m, `unknown key "bogus"`) {
		t.Errorf("status %q", m)
	}
	if m := h.get("/metrics"); !strings.Contains(m, "\nexo_config_last_reload_successful 0\n") {
		t.Errorf("metrics after failed reload:\n%s", m)
	}

	// 3. NixOS-style symlink swap to a file without model b: b stops, a stays.
	h.symlinkSwap("gen2", clusterFile(base, "a=src-a"))
	st = h.waitReload(st.LastReload.At)
	p2 := pids(st)
	if len(p2) != 2 || p2["a-decode"] != p0["a-decode"] || p2["a-prefill"] != p0["a-prefill"] {
		t.Errorf("after symlink swap: %v", p2)
	}
	if !gone(p1["b-decode"]) || !gone(p1["b-prefill"]) {
		t.Errorf("removed runners still running: %v", p1)
	}
	if m := h.get("/metrics"); !strings.Contains(m, "\nexo_config_last_reload_successful 1\n") {
		t.Errorf("metrics after good reload:\n%s", m)
	}

	// 4. SIGHUP with an unchanged file: a reload that changes nothing.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	st = h.waitReload(st.LastReload.At)
	if st.LastReload.Changes != "start [], stop [], restart [], keep [a-decode a-prefill]" || fmt.Sprint(pids(st)) != fmt.Sprint(p2) {
		t.Errorf("SIGHUP reload: %+v %v", st.LastReload, pids(st))
	}

	// 5. Shutdown: STOPPING=1 and every runner gone.
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	h.expectNotify("STOPPING=1")
	for name, pid := range p2 {
		if !gone(pid) {
			t.Errorf("%s (pid %d) survived shutdown", name, pid)
		}
	}
}

func TestCrashedRunnerIsRestartedAndCounted(t *testing.T) {
	h := start(t, clusterFile(freePort(t), "a=src-a"))
	st := h.status()
	old := pids(st)["a-decode"]
	syscall.Kill(old, syscall.SIGKILL)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = h.status()
		r := st.Runners[0]
		if r.Status.Restarts == 1 && r.Status.State == process.Ready && r.Status.PID != old {
			if r.Status.LastExit != "signal killed" {
				t.Errorf("last exit %q", r.Status.LastExit)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not restarted: %+v", r.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := h.get("/metrics")
	for _, want := range []string{
		`exo_runner_restarts_total{runner="a-decode"} 1`,
		`exo_runner_restarts_total{runner="a-prefill"} 0`,
		`exo_runner_up{model="a",role="decode",runner="a-decode"} 1`,
		`exo_requests_waiting{role="prefill",runner="a-prefill"} 0`,
		`exo_scrape_collector_success{collector="runner:a-decode"} 1`,
		"\nexo_supervisor_process_resident_memory_bytes ",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
}

func TestGatewayServesThroughRunner(t *testing.T) {
	h := start(t, clusterFile(freePort(t), "a=src-a"))
	resp, err := http.Post("http://"+h.api+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"a","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"model":"a"`) || resp.Header.Get("X-Exo-Runner") != "h/a-decode" {
		t.Errorf("%d %s %v", resp.StatusCode, b, resp.Header)
	}
	if m := h.get("/v1/models"); !strings.Contains(m, `"id":"a"`) {
		t.Errorf("/v1/models = %s", m)
	}
}

// BenchmarkConfigEditToApplied measures an editor-style save of the cluster
// file (rename-over) that changes one of two models, until the changed
// model's new runners answer /health — with the default 200 ms debounce.
func BenchmarkConfigEditToApplied(b *testing.B) {
	b.ReportAllocs()
	base := freePort(b)
	h := startDebounce(b, clusterFile(base, "a=src-a", "b=src-b0"), 200*time.Millisecond)
	st := h.status()
	i := 0
	for b.Loop() {
		i++
		h.renameOver(clusterFile(base, "a=src-a", fmt.Sprintf("b=src-b%d", i)))
		st = h.waitReload(st.LastReload.At)
	}
}

func TestCrashLoopIsReported(t *testing.T) {
	h := startWith(t, clusterFile(freePort(t), "a=src-a"), 50*time.Millisecond, false, fakerunner.EnvModeFor+"a_decode=exit:1")
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := h.status()
		var dec process.Status
		for _, r := range st.Runners {
			if r.Spec.Name == "a-decode" {
				dec = r.Status
			}
		}
		if dec.State == process.CrashLoop {
			if dec.Restarts != 5 || dec.LastExit != "exit status 1" {
				t.Errorf("crash loop status %+v, want 5 restarts (policy: 5 attempts per minute)", dec)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no crash loop: %+v", dec)
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := h.get("/metrics")
	for _, want := range []string{
		`exo_runner_crash_looping{runner="a-decode"} 1`,
		`exo_runner_crash_looping{runner="a-prefill"} 0`,
		`exo_runner_restarts_total{runner="a-decode"} 5`,
		`exo_runner_up{model="a",role="decode",runner="a-decode"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// The gateway explains why the model cannot be served.
	resp, err := http.Post("http://"+h.api+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), `no healthy decode runner for model \"a\": a-decode on h (127.0.0.1:`) {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
}

// TestSecondSupervisorIsNotReadyOnTheFirstsRunners: with one cluster
// running, a second supervisor of the same cluster file (another API
// port) does not count the first one's runners as its own: they answer its
// probes on the shared ports with another instance token, so its runners
// are not ready, it sends no READY=1, and its gateway answers 503 saying
// the port is taken instead of serving from the first cluster's runners.
func TestSecondSupervisorIsNotReadyOnTheFirstsRunners(t *testing.T) {
	file := clusterFile(freePort(t), "a=src-a")
	first := start(t, file)
	second := startWith(t, file, 50*time.Millisecond, false, fakerunner.EnvListenDelay+"=1s")
	var msg string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Post("http://"+second.api+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"a","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatalf("the second supervisor served from the first's runner: %s", b)
		}
		msg = string(b)
		if resp.StatusCode == 503 && strings.Contains(msg, "answered by another process") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 503 naming the taken port; last answer %d %s", resp.StatusCode, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range second.status().Runners {
		if r.Status.State == process.Ready {
			t.Fatalf("second supervisor's %s is ready: %+v", r.Spec.Name, r.Status)
		}
	}
	for {
		select {
		case m := <-second.notify:
			if strings.HasPrefix(m, "READY=1") {
				t.Fatalf("second supervisor sent %q", m)
			}
			continue
		default:
		}
		break
	}
	// the first cluster still serves
	if st := first.status(); len(st.Runners) != 2 || st.Runners[0].Status.State != process.Ready {
		t.Fatalf("first: %+v", st.Runners)
	}
	t.Logf("second's 503: %s", msg)
}

func TestTakenAPIPortNamesTheFix(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.toml")
	os.WriteFile(path, []byte(clusterFile(freePort(t), "a=src-a")), 0o644)
	err = Run(context.Background(), Options{ConfigPath: path, Host: "h", Executable: os.Args[0], APIListen: l.Addr().String(), NoGPU: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "--listen") || !strings.Contains(err.Error(), "[api] port") {
		t.Fatalf("got %v", err)
	}
}

// TestCORSWrapsTheKeyCheck: with an API key and allowed origins, a
// browser's preflight (which carries no key) is answered, and a keyless
// request gets a 401 the page can read (CORS headers on it).
func TestCORSWrapsTheKeyCheck(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte("k3y\n"), 0o600)
	file := clusterFile(freePort(t), "a=src-a") + fmt.Sprintf("\n[api]\napi_key_file = %q\ncors_origins = [\"https://app.example\"]\n", keyFile)
	h := start(t, file)
	do := func(method string, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest(method, "http://"+h.api+"/v1/chat/completions", strings.NewReader(`{"model":"a","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Origin", "https://app.example")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := do("OPTIONS", map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}); r.StatusCode != 204 ||
		r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Fatalf("preflight: %d %v", r.StatusCode, r.Header)
	}
	if r := do("POST", nil); r.StatusCode != 401 || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Fatalf("keyless POST: %d %v", r.StatusCode, r.Header)
	}
	if r := do("POST", map[string]string{"Authorization": "Bearer k3y"}); r.StatusCode != 200 {
		t.Fatalf("keyed POST: %d", r.StatusCode)
	}
}

// TestPendingRestart: [api] (but cors_origins) and [supervisor] apply only
// when the supervisor starts; a reload that changes them says so in the
// status until the file matches again, and --listen makes [api] listen and
// port moot.
func TestPendingRestart(t *testing.T) {
	load := func(extra string) *config.Config {
		p := filepath.Join(t.TempDir(), "c.toml")
		os.WriteFile(p, []byte(clusterFile(52600, "a=src-a")+extra), 0o644)
		c, err := config.Load(p)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	initial := load("")
	for _, tt := range []struct {
		extra    string
		override bool
		want     string
	}{
		{"", false, ""},
		{"\n[api]\ncors_origins = [\"*\"]\n", false, ""},
		{"\n[api]\nport = 52416\n", false, "[api] port 52415 → 52416"},
		{"\n[api]\nport = 52416\n", true, ""},
		{"\n[api]\nopen_paths = []\n", true, `[api] open_paths ["/health" "/metrics"] → []`},
		{"\n[supervisor]\nliveness_timeout = \"30s\"\n", false, "[supervisor] liveness_timeout (default) → 30s"},
	} {
		if got := pendingRestart(initial, load(tt.extra), tt.override); got != tt.want {
			t.Errorf("%q (override %v): %q, want %q", tt.extra, tt.override, got, tt.want)
		}
	}

	// Live: the status says it after the reload, and not once the file is back.
	base := freePort(t)
	h := start(t, clusterFile(base, "a=src-a"))
	st := h.status()
	h.write(clusterFile(base, "a=src-a") + "\n[api]\nopen_paths = []\n")
	st = h.waitReload(st.LastReload.At)
	if !st.LastReload.OK || !strings.Contains(st.LastReload.Pending, "open_paths") {
		t.Errorf("after an [api] edit: %+v", st.LastReload)
	}
	h.write(clusterFile(base, "a=src-a"))
	st = h.waitReload(st.LastReload.At)
	if !st.LastReload.OK || st.LastReload.Pending != "" {
		t.Errorf("after the edit is undone: %+v", st.LastReload)
	}
}

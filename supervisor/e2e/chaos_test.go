package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// post sends one small chat and returns the status code and the runner
// that served it.
func post(api string, i int) (int, string, error) {
	body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"chaos %d: hello"}],"max_tokens":4,"temperature":0}`, i)
	c := &http.Client{Timeout: 60 * time.Second}
	resp, err := c.Post("http://"+api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Exo-Runner"), nil
}

type decodeHealth struct {
	OK     bool   `json:"ok"`
	Status string `json:"status"`
}

func (h *host) gatewayView(t *testing.T) map[string]decodeHealth {
	t.Helper()
	resp, err := http.Get("http://" + h.api + "/exo/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Decode map[string]decodeHealth `json:"decode_health"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Decode
}

// TestChaosDecodeHostStopped: the decode runner on mac is SIGSTOPped. The
// gateways take it out of rotation within seconds and serve every request
// through spark's decode runner (no 5xx after the detection window, while
// requests keep coming); mac's supervisor stops it for not answering
// /health, restarts it, and `exo status` says why. Assertions are on status
// codes, states and counts; the durations are logged.
func TestChaosDecodeHostStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needLoopbackHosts(t)
	_, dir, exe, model := buildExoAndModel(t)
	cfgPath := filepath.Join(dir, "cluster.toml")
	base, apiPort := freePort(t), freePort(t)
	if err := os.WriteFile(cfgPath, []byte(cluster(base, model, "", "spark", "mac")), 0o644); err != nil {
		t.Fatal(err)
	}
	spark, mac := startTwoHosts(t, exe, dir, cfgPath, apiPort, "--grace", "1s", "--liveness", "3s")
	spark.waitRunners(t, "tiny-decode", "tiny-prefill")
	macPIDs := mac.waitRunners(t, "tiny-decode")
	macDecode := fmt.Sprintf("127.0.0.3:%d", base)
	// Both gateways see both decode runners before the fault.
	for _, h := range []*host{spark, mac} {
		var v map[string]decodeHealth
		if !testutil.Until(30*time.Second, func() bool {
			v = h.gatewayView(t)
			return len(v) == 2 && v[macDecode].OK && v[fmt.Sprintf("127.0.0.2:%d", base)].OK
		}) {
			t.Fatalf("%s's gateway never saw both decode runners: %+v", h.name, v)
		}
		if code, _, err := post(h.api, 0); err != nil || code != 200 {
			t.Fatalf("before the fault, via %s: %d %v", h.name, code, err)
		}
	}

	victim := macPIDs["tiny-decode"]
	if err := syscall.Kill(victim, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(victim, syscall.SIGCONT) // let it die if the test fails early
	stopped := time.Now()

	// Detection: both gateways take mac's decode runner out of rotation.
	for _, h := range []*host{spark, mac} {
		testutil.Eventually(t, func() bool { return !h.gatewayView(t)[macDecode].OK }, 20*time.Second,
			"%s's gateway still routes to the stopped runner", h.name)
		t.Logf("%s's gateway dropped the stopped runner %v after SIGSTOP", h.name, time.Since(stopped))
	}

	// After the detection window: a steady stream of requests through both
	// gateways while mac's runner is stopped, killed and restarted.
	var mu sync.Mutex
	codes := map[int]int{}
	servedBy := map[string]int{}
	var errs []string
	i := 1
	restarted := false
	deadline := time.Now().Add(60 * time.Second)
	for !restarted || i < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("mac's decode runner was not restarted within 60 s of SIGSTOP; codes %v", codes)
		}
		for _, h := range []*host{spark, mac} {
			code, by, err := post(h.api, i)
			mu.Lock()
			if err != nil {
				errs = append(errs, err.Error())
			}
			codes[code]++
			servedBy[by]++
			mu.Unlock()
			i++
		}
		if st, err := mac.status(t); err == nil {
			for _, r := range st.Runners {
				if r.Spec.Name == "tiny-decode" && r.Status.PID != victim && r.Status.State == "ready" && r.Status.Restarts == 1 {
					restarted = true
				}
			}
		}
	}
	t.Logf("mac's decode runner restarted %v after SIGSTOP; %d requests: codes %v, served by %v", time.Since(stopped), i-1, codes, servedBy)
	if len(errs) > 0 || len(codes) != 1 || codes[200] == 0 {
		t.Fatalf("after the detection window: codes %v, errors %v; want only 200", codes, errs)
	}
	if !gone(victim) {
		t.Errorf("the stopped runner (pid %d) is still there", victim)
	}

	// exo status on mac says why it restarted.
	out, err := exec.Command(exe, "status", "--api", "http://"+mac.api).CombinedOutput()
	if err != nil {
		t.Fatalf("exo status: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "last restart: liveness: /health unanswered") {
		t.Fatalf("exo status does not say why the runner restarted:\n%s", out)
	}
	t.Logf("exo status:\n%s", out)
	// And the supervisor's metrics count it.
	resp, err := http.Get("http://" + mac.api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `exo_runner_liveness_restarts_total{runner="tiny-decode"} 1`) {
		t.Fatalf("no liveness restart counted in /metrics")
	}
}

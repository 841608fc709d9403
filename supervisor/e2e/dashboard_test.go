package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// findChromium is the path of a chromium on $PATH, or "".
func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// chromium finds Debian's chromium (scripts/run-tests installs it). Without
// it the test skips, except under CI or EXO_REQUIRE_CHROMIUM (which
// scripts/run-tests sets), where it must run.
func chromium(t *testing.T) string {
	t.Helper()
	if p := findChromium(); p != "" {
		return p
	}
	if os.Getenv("CI") != "" || os.Getenv("EXO_REQUIRE_CHROMIUM") != "" {
		t.Fatal("chromium not found, and CI or EXO_REQUIRE_CHROMIUM is set: scripts/run-tests installs Debian's chromium (apt-get install chromium)")
	}
	t.Skip("chromium not found (apt-get install chromium; scripts/run-tests installs it)")
	return ""
}

// page drives one headless Chromium tab.
type page struct {
	t   *testing.T
	ctx context.Context
}

func newPage(t *testing.T, exe string) *page {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &page{t: t, ctx: ctx}
}

func (p *page) run(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%v\npage text:\n%s", err, p.text())
	}
}

// text is the page's visible text, for failure messages.
func (p *page) text() string {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	return s
}

// wait polls the JavaScript boolean expression expr until it is true.
func (p *page) wait(what, expr string) {
	p.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("page never showed %s (%s; last error %v)\npage text:\n%s", what, expr, err, p.text())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// eval evaluates expr in the page.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// screenshot writes a full-page PNG of the page at width×height into the
// directory EXO_DASHBOARD_SCREENSHOTS names (docs/ for the README's).
func (p *page) screenshot(name string, width, height int64) {
	p.t.Helper()
	dir := os.Getenv("EXO_DASHBOARD_SCREENSHOTS")
	if dir == "" {
		return
	}
	p.run(chromedp.EmulateViewport(width, height), chromedp.Sleep(1500*time.Millisecond)) // a state event to lay out at this width
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.run(chromedp.EmulateViewport(1280, 900))
}

// keyedStatus reads h's /exo/status with the API key.
func keyedStatus(t *testing.T, h *host, key string) (status, error) {
	var st status
	req, _ := http.NewRequest("GET", "http://"+h.api+"/exo/status", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return st, fmt.Errorf("/exo/status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// TestDashboard drives the dashboard in headless Chromium against two real
// supervisors (spark: prefill, mac: decode) behind an API key: the page asks
// for the key; lists both hosts and the model with its roles and ready
// runners; a chat message streams an answer (in several pieces) with its
// route under it; the request shows in the live stream as remote with its
// timings; a killed decode runner shows its restart and is ready again; and
// a model output made of <script> and <img onerror> is shown as text, with
// no element made and no script run.
func TestDashboard(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo, runs real runners and a browser")
	}
	needLoopbackHosts(t)
	browser := chromium(t)
	_, dir, exe, model := buildExoAndModel(t)
	secret, keyFile := filepath.Join(dir, "secret"), filepath.Join(dir, "api-key")
	os.WriteFile(secret, []byte("e2e secret\n"), 0o600)
	const key = "dashboard-key"
	os.WriteFile(keyFile, []byte(key+"\n"), 0o600)
	cfgPath := filepath.Join(dir, "cluster.toml")
	base, apiPort := freePort(t), freePort(t)
	cfg := cluster(base, model, secret, "mac") + fmt.Sprintf("\n[api]\napi_key_file = %q\n", keyFile)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	spark, mac := startTwoHosts(t, exe, dir, cfgPath, apiPort)
	p := newPage(t, browser)

	// The key.
	p.run(chromedp.Navigate("http://" + spark.api + "/"))
	p.wait("the key prompt", `!document.getElementById("login").hidden`)
	p.run(chromedp.SendKeys(chromedp.ID("login-key"), key), chromedp.Click(chromedp.ID("login-open")))

	// Both hosts, the model, its roles, ready.
	p.wait("both hosts up", `["spark","mac"].every(h => { const e = document.querySelector('[data-host="'+h+'"]'); return e && e.textContent.includes("supervisor up") })`)
	p.wait("the model with both roles ready", `(() => {
		const m = document.querySelector('[data-model="tiny"]');
		const d = document.querySelector('[data-runner="mac/tiny-decode"]'), f = document.querySelector('[data-runner="spark/tiny-prefill"]');
		return m && d && f && d.dataset.state === "ready" && f.dataset.state === "ready" &&
			d.textContent.includes("decode") && f.textContent.includes("prefill") && m.textContent.includes("1/1 decode ready");
	})()`)
	p.wait("the link mac ← spark", `(document.getElementById("links").textContent||"").includes("spark")`)
	p.screenshot("dashboard-desktop.png", 1280, 900)
	p.screenshot("dashboard-phone.png", 390, 844)

	// Chat: the answer streams in pieces; its route shows under it.
	p.run(chromedp.Navigate("http://" + spark.api + "/#chat"))
	p.wait("the chat's model list", `document.getElementById("chat-model").value === "tiny" && !!window.fetch`)
	p.run(chromedp.SetValue(chromedp.ID("chat-temp"), "0"), chromedp.SetValue(chromedp.ID("chat-max"), "24"))
	p.run(chromedp.SendKeys(chromedp.ID("chat-input"), "Tell me a long story about the sea, the wind and the harbour at night."),
		chromedp.Click(chromedp.ID("chat-send")))
	p.wait("a finished answer with its remote route", `(() => {
		const m = document.querySelector(".msg.assistant:last-child");
		return m && !m.classList.contains("streaming") && m.querySelector(".content").textContent.length > 0 &&
			m.querySelector(".meta").textContent.includes("route remote") && m.querySelector(".meta").textContent.includes("served by mac/tiny-decode");
	})()`)
	chunks := eval[string](p, `document.querySelector(".msg.assistant:last-child").dataset.chunks || "0"`)
	if n, _ := strconv.Atoi(chunks); n < 2 {
		t.Errorf("the answer was shown from %s streamed pieces; want several", chunks)
	}

	// Live P/D: that request, remote, with its timings (and a few more,
	// some prefilled locally, for the charts).
	for i := range 6 {
		body := fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"Request %d: %s"}],"max_tokens":%d,"x_exo_disable_remote_prefill":%v}`,
			i, strings.Repeat("more words ", 4*i), 8+4*i, i%2 == 1)
		req, _ := http.NewRequest("POST", "http://"+mac.api+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
	}
	p.run(chromedp.Navigate("http://" + spark.api + "/#live"))
	p.wait("a remote request with TTFT and KV", `[...document.querySelectorAll('#requests tbody tr[data-route="remote"]')].some(tr => {
		const c = (k) => tr.querySelector(".c-" + k).textContent;
		return c("route").includes("remote") && c("route").includes("spark") && /ms|s$/.test(c("ttft")) &&
			c("kv").includes(" in ") && c("out").includes("tok") && c("decode") === "mac/tiny-decode";
	})`)
	p.wait("the local ones too", `document.querySelectorAll('#requests tbody tr[data-route="local"]').length >= 3`)
	p.screenshot("dashboard-live.png", 1280, 900)

	// Kill the decode runner: it restarts and is ready again.
	st, err := keyedStatus(t, mac, key)
	if err != nil || len(st.Runners) != 1 || st.Runners[0].Status.PID == 0 {
		t.Fatalf("mac's status: %+v %v", st, err)
	}
	p.run(chromedp.Navigate("http://" + spark.api + "/#overview"))
	p.wait("the first state rendered", `performance.getEntriesByName("exo-first-state").length > 0`)
	// Not asserted (no timing assertions): the numbers docs/BENCHMARKS.md quotes.
	t.Logf("page load: %s", eval[string](p, `(() => {
		const fcp = performance.getEntriesByName("first-contentful-paint")[0], st = performance.getEntriesByName("exo-first-state")[0];
		const bytes = performance.getEntriesByType("navigation").concat(performance.getEntriesByType("resource"))
			.filter(e => !e.name.includes("/exo/")).reduce((n, e) => n + e.decodedBodySize, 0);
		return "first contentful paint " + (fcp ? fcp.startTime.toFixed(0) : "?") + " ms, cluster rendered " + st.startTime.toFixed(0) + " ms, page files " + bytes + " bytes";
	})()`))
	if err := syscall.Kill(st.Runners[0].Status.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait("the decode runner restarted and ready", `(() => {
		const d = document.querySelector('[data-runner="mac/tiny-decode"]');
		if (!d) return false;
		const steps = [...d.querySelectorAll(".history .step")].map(s => s.textContent.replace("→", "").trim());
		const i = steps.lastIndexOf("backoff");
		return d.dataset.state === "ready" && d.dataset.restarts === "1" && i >= 0 && steps.slice(i).includes("ready") &&
			d.textContent.includes("signal killed");
	})()`)

	// Markup in the model's output stays text: a JSON-schema const forces
	// the output, sent through the chat's request.
	const evil = `<script>window.__xss=1</script><img src=x onerror=window.__xss=2>`
	p.run(chromedp.Navigate("http://" + spark.api + "/#chat"))
	p.wait("the chat's model list", `document.getElementById("chat-model").value === "tiny"`)
	schema, _ := json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": map[string]any{"const": evil}}})
	p.run(chromedp.SetValue(chromedp.ID("chat-max"), "200"), chromedp.SetValue(chromedp.ID("chat-temp"), "0"),
		chromedp.SetValue(chromedp.ID("chat-extra"), `{"response_format": `+string(schema)+`}`),
		chromedp.SendKeys(chromedp.ID("chat-input"), "Say it."), chromedp.Click(chromedp.ID("chat-send")))
	p.wait("the markup shown as text", `(() => {
		const m = document.querySelector(".msg.assistant:last-child");
		return m && !m.classList.contains("streaming") && m.querySelector(".content").textContent.includes(`+"`"+evil+"`"+`);
	})()`)
	elements := eval[int](p, `document.querySelectorAll("#chat-log script, #chat-log img").length`)
	xss := eval[string](p, `String(window.__xss)`)
	if elements != 0 || xss != "undefined" {
		t.Errorf("model output became markup: %d script/img elements, window.__xss = %v", elements, xss)
	}
	if !strings.Contains(p.text(), "<script>window.__xss=1</script>") {
		t.Error("the output's markup is not visible as text")
	}

	p.screenshot("dashboard-chat.png", 1280, 900)

	// exo status prints the same cluster, the key read from the file.
	out, err := exec.Command(exe, "status", "--api", "http://"+spark.api, "--config", cfgPath).CombinedOutput()
	if err != nil {
		t.Fatalf("exo status: %v\n%s", err, out)
	}
	for _, want := range []string{"cluster e2e, host spark", "RUNNERS ON THIS HOST", "tiny-prefill", "MODELS", "tiny-decode",
		"remote (floor, from spark)", "local (skipped_disabled)", "LINKS", "mac/tiny-decode  spark"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("exo status lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[0] == "mac" || f[0] == "spark") && f[3] != "up" {
			t.Errorf("exo status: host line %q", line)
		}
	}

	// A supervisor that stops shows as down, its runners unknown.
	if _, exited := mac.stop(30 * time.Second); !exited {
		t.Fatal("mac did not stop")
	}
	p.run(chromedp.Navigate("http://" + spark.api + "/#overview"))
	p.wait("mac down", `(() => {
		const h = document.querySelector('[data-host="mac"]'), d = document.querySelector('[data-runner="mac/tiny-decode"]');
		return !!h && h.textContent.includes("supervisor down") && h.textContent.includes("no supervisor answering") &&
			!!d && d.dataset.state === "unknown" && document.querySelector('[data-model="tiny"]').textContent.includes("0/1 decode ready");
	})()`)
}

package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/exo-pd/exo-pd/supervisor/config"
)

// findChromium is supervisor/e2e's rule: Debian's chromium, required under
// CI or EXO_REQUIRE_CHROMIUM (scripts/run-tests sets it), else a skip.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" || os.Getenv("EXO_REQUIRE_CHROMIUM") != "" {
		t.Fatal("chromium not found, and CI or EXO_REQUIRE_CHROMIUM is set (apt-get install chromium)")
	}
	t.Skip("chromium not found (apt-get install chromium; scripts/run-tests installs it)")
	return ""
}

// TestChatRendering drives the page's chat in headless Chromium against a
// gateway whose chat completions stream what a real model cannot be made
// to write on demand: reasoning (with markup in it), then content, then a
// tool call whose arguments arrive in pieces. The reasoning is collapsed
// and shown as text, the call as a call, the finish reason and token counts
// under the answer; the request carries the page's model, sampling
// settings, system prompt and extra fields.
func TestChatRendering(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a browser")
	}
	browser := findChromium(t)
	path := filepath.Join(t.TempDir(), "cluster.toml")
	os.WriteFile(path, []byte("[cluster]\nname = \"one\"\n\n[hosts.h]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\n\n"+
		"[[models]]\nname = \"m\"\nsource = \"/m\"\ndecode = { hosts = [\"h\"] }\n"), 0o644)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d := New(Options{Local: func() Local { return Local{Config: cfg, Host: "h", Started: time.Now()} }})
	mux := http.NewServeMux()
	d.Register(mux)
	var mu sync.Mutex
	var sent map[string]any
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		json.Unmarshal(b, &sent)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Exo-Runner", "h/m-decode")
		rc := http.NewResponseController(w)
		for _, delta := range []string{
			`{"role":"assistant","reasoning_content":"Let me <b>think</b> "}`,
			`{"reasoning_content":"about the time."}`,
			`{"content":"Checking the clock."}`,
			`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"now","arguments":""}}]}`,
			`{"tool_calls":[{"index":0,"function":{"arguments":"{\"tz\":"}}]}`,
			`{"tool_calls":[{"index":0,"function":{"arguments":"\"UTC\"}"}}]}`,
		} {
			fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":null}]}\n\n", delta)
			rc.Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":9,\"total_tokens\":21}}\n\ndata: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	do := func(actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(c, actions...); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(what, expr string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			ok, err := chromedp.Run(c, chromedp.Evaluate[bool](expr))
			cancel()
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				c, cancel := context.WithTimeout(ctx, 5*time.Second)
				text, _ := chromedp.Run(c, chromedp.Evaluate[string](`document.body.innerText`))
				cancel()
				t.Fatalf("page never showed %s (last error %v)\n%s", what, err, text)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	do(chromedp.Navigate(srv.URL + "/#chat"))
	wait("the model list", `document.getElementById("chat-model").value === "m"`)
	do(chromedp.SetValue(chromedp.ID("chat-temp"), "0.3"), chromedp.SetValue(chromedp.ID("chat-topp"), "0.9"),
		chromedp.SetValue(chromedp.ID("chat-max"), "64"), chromedp.SetValue(chromedp.ID("chat-system"), "Be brief."),
		chromedp.SetValue(chromedp.ID("chat-extra"), `{"seed": 7}`),
		chromedp.SendKeys(chromedp.ID("chat-input"), "What time is it?"), chromedp.Click(chromedp.ID("chat-send")))
	wait("the finished answer", `(() => {
		const m = document.querySelector(".msg.assistant:last-child");
		return !!m && !m.classList.contains("streaming") && m.querySelector(".meta").textContent.includes("finish tool_calls");
	})()`)
	c, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	got, err := chromedp.Run(c, chromedp.Evaluate[map[string]any](`(() => {
		const m = document.querySelector(".msg.assistant:last-child"), r = m.querySelector("details.reasoning");
		return {reasoningHidden: r.hidden, reasoningOpen: r.open, reasoning: r.querySelector(".reasoning-text").textContent,
			markup: m.querySelectorAll("b").length, content: m.querySelector(".content").textContent,
			call: m.querySelector(".calls").textContent, meta: m.querySelector(".meta").textContent};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if got["reasoningHidden"] != false || got["reasoningOpen"] != false || got["reasoning"] != "Let me <b>think</b> about the time." || got["markup"] != 0.0 {
		t.Errorf("reasoning not shown collapsed as text: %v", got)
	}
	if got["content"] != "Checking the clock." || got["call"] != `callnow({"tz":"UTC"})` {
		t.Errorf("content %q, call %q", got["content"], got["call"])
	}
	for _, want := range []string{"served by h/m-decode", "12 prompt tokens", "9 generated", "finish tool_calls"} {
		if meta, _ := got["meta"].(string); !strings.Contains(meta, want) {
			t.Errorf("meta %q lacks %q", got["meta"], want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	msgs, _ := sent["messages"].([]any)
	if sent["model"] != "m" || sent["stream"] != true || sent["temperature"] != 0.3 || sent["top_p"] != 0.9 || sent["max_tokens"] != 64.0 ||
		sent["seed"] != 7.0 || len(msgs) != 2 || fmt.Sprint(msgs[0]) != "map[content:Be brief. role:system]" ||
		fmt.Sprint(msgs[1]) != "map[content:What time is it? role:user]" {
		t.Errorf("request sent: %v", sent)
	}
}

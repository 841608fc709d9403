package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/exo-pd/exo-pd/internal/hostmem"
	"github.com/exo-pd/exo-pd/internal/modelinfo"
	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// placementStatus is what these tests read of /exo/status.
type placementStatus struct {
	Runners []struct {
		Spec struct {
			Name   string `json:"name"`
			Layers string `json:"layers"`
		} `json:"spec"`
	} `json:"runners"`
	Placements []config.Placement `json:"placements"`
}

func (h *host) placement(t *testing.T) (placementStatus, error) {
	t.Helper()
	var st placementStatus
	resp, err := http.Get("http://" + h.api + "/exo/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// TestPipelineSplitByReportedMemory: two supervisors whose hosts have no
// memory_gib split an 8-layer model in proportion to the physical memory
// each reports (hostmem's test hook: spark 6 GiB, mac 60 GiB), not evenly.
// Spark alone waits for mac's report: it runs no stage, its status says
// whom it waits for, and its gateway answers 503 naming the wait (not 404,
// not an error loop). Once mac's supervisor answers, both place the same
// split, counted from the reported memory, and both gateways answer as
// one runner holding the whole model does. With Chromium, the dashboard
// shows the same: both stages waiting with the reason, then each stage's
// layer range and the placement with the memory each host reported.
func TestPipelineSplitByReportedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needLoopbackHosts(t)
	root, dir, exe, _ := buildExoAndModel(t)
	model := filepath.Join(dir, "tiny8")
	run(t, root, "go", "run", "./runners/engine/testmodel/cmd/gen", "-arch", "llama", "-layers", "8", model)
	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("e2e secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompts := []string{"hello there, how are you today?", "Tell me a story about memory."}
	want := oneRunnerAnswers(t, exe, dir, cfgPath, model, secret, prompts)

	base, apiPort := freePort(t), freePort(t)
	src := pipelineCluster(base, apiPort, model, secret, `{ hosts = ["spark", "mac"], shard = "pipeline" }`)
	if err := os.WriteFile(cfgPath, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// The split every supervisor must compute, and the even one it is not.
	c, err := config.Parse(cfgPath, []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	facts := func(string) (*modelinfo.Facts, error) { return modelinfo.Read(model) }
	ps, err := c.PlaceWith(facts, config.PlaceOptions{LocalHost: "spark",
		Reported: map[string]config.HostMemory{"spark": {Total: 6 << 30}, "mac": {Total: 60 << 30}}})
	if err != nil || len(ps) != 1 || len(ps[0].Stages) != 2 {
		t.Fatalf("expected placement: %+v %v", ps, err)
	}
	wantLayers := []string{fmt.Sprintf("%d:%d", ps[0].Stages[0].Start, ps[0].Stages[0].End), fmt.Sprintf("%d:%d", ps[0].Stages[1].Start, ps[0].Stages[1].End)}
	if wantLayers[0] == "0:4" {
		t.Fatalf("the memories 6 and 60 GiB split evenly (%v): the test would not tell reported from even", wantLayers)
	}
	t.Logf("split by reported memory: spark %s, mac %s", wantLayers[0], wantLayers[1])

	spark := startHostEnv(t, exe, dir, cfgPath, "spark", "127.0.0.2", apiPort, hostmem.TestEnv+"=6")
	var p *page
	if browser := maybeChromium(t); browser != "" {
		p = newPage(t, browser)
		p.run(chromedp.Navigate("http://" + spark.api + "/"))
		p.wait("both stages waiting for mac's memory", `(() => {
			const m = document.querySelector('[data-model="tiny"]');
			const pl = m && m.querySelector('[data-placement="decode"]');
			const s0 = document.querySelector('[data-runner="spark/tiny-decode-stage0"]'), s1 = document.querySelector('[data-runner="mac/tiny-decode-stage1"]');
			return !!pl && pl.dataset.waiting === "mac" && pl.textContent.includes("waiting for mac to report its memory") &&
				!!s0 && !!s1 && s0.dataset.state === "waiting" && s1.dataset.state === "waiting" && s1.textContent.includes("stage1/2");
		})()`)
	}
	var st placementStatus
	if !testutil.Until(60*time.Second, func() bool {
		st, err = spark.placement(t)
		return err == nil && len(st.Placements) == 1 && slices.Equal(st.Placements[0].Waiting, []string{"mac"})
	}) {
		t.Fatalf("spark alone does not wait for mac's memory: %+v %v", st, err)
	}
	if len(st.Runners) != 0 || st.Placements[0].Stages != nil || !strings.Contains(st.Placements[0].Note, "waiting for mac to report its memory") {
		t.Errorf("spark while waiting: %+v", st)
	}
	if code, _, body := tryChat(spark.api, prompts[0]); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for mac") {
		t.Errorf("a request while the pipeline waits: %d %s, want 503 naming the wait", code, body)
	}

	mac := startHostEnv(t, exe, dir, cfgPath, "mac", "127.0.0.3", apiPort, hostmem.TestEnv+"=60")
	spark.waitRunners(t, "tiny-decode-stage0")
	mac.waitRunners(t, "tiny-decode-stage1")
	for i, h := range []*host{spark, mac} {
		st, err := h.placement(t)
		if err != nil || len(st.Runners) != 1 || len(st.Placements) != 1 {
			t.Fatalf("%s: %+v %v", h.name, st, err)
		}
		if got := st.Runners[0].Spec.Layers; got != wantLayers[i] {
			t.Errorf("%s runs layers %s, want %s (the split by reported memory)", h.name, got, wantLayers[i])
		}
		p := st.Placements[0]
		if p.Waiting != nil || len(p.Memory) != 2 || p.Memory[0].Source != config.MemReported || p.Memory[1].Source != config.MemReported ||
			p.Memory[0].Reported != 6<<30 || p.Memory[1].Reported != 60<<30 {
			t.Errorf("%s's placement: %+v", h.name, p)
		}
	}
	if p != nil {
		// Each stage's card says where its hidden states go.
		hidden := "stage link (TCP): cpu_backend"
		if hostBackend() != "cpu" {
			hidden = "MLX's ring"
		}
		p.wait("each stage's hidden states' transport", fmt.Sprintf(`(() => {
			const s0 = document.querySelector('[data-runner="spark/tiny-decode-stage0"]'), s1 = document.querySelector('[data-runner="mac/tiny-decode-stage1"]');
			return !!s0 && !!s1 && s0.textContent.includes(%[1]q) && s1.textContent.includes(%[1]q);
		})()`, hidden))
		p.wait("each stage's layers and the placement by reported memory", fmt.Sprintf(`(() => {
			const pl = document.querySelector('[data-model="tiny"] [data-placement="decode"]');
			const s0 = document.querySelector('[data-runner="spark/tiny-decode-stage0"]'), s1 = document.querySelector('[data-runner="mac/tiny-decode-stage1"]');
			return !!pl && pl.dataset.waiting === "" && pl.textContent.includes("stage 0 spark layers %[1]s · stage 1 mac layers %[2]s") &&
				pl.textContent.includes("spark 5.00 GiB (reported), mac 52.0 GiB (reported)") &&
				!!s0 && !!s1 && s0.dataset.state === "ready" && s1.dataset.state === "ready" &&
				s0.textContent.includes("0/2 · layers %[1]s") && s1.textContent.includes("1/2 · layers %[2]s");
		})()`, wantLayers[0], wantLayers[1]))
		p.screenshot("dashboard-pipeline.png", 1280, 900)
	}
	for _, h := range []*host{spark, mac} {
		for i, p := range prompts {
			runner, text := chatText(t, h.api, p)
			if runner != "spark/tiny-decode-stage0" || text != want[i] {
				t.Errorf("via %s, prompt %d: %s answered %q, one runner %q", h.name, i, runner, text, want[i])
			}
		}
	}
	for _, h := range []*host{spark, mac} {
		stopHost(t, h)
	}
}

// maybeChromium is chromium's path, or "" where it is absent and not
// required (CI and EXO_REQUIRE_CHROMIUM require it, as chromium does).
func maybeChromium(t *testing.T) string {
	t.Helper()
	if p := findChromium(); p != "" {
		return p
	}
	if os.Getenv("CI") != "" || os.Getenv("EXO_REQUIRE_CHROMIUM") != "" {
		return chromium(t) // fails the test
	}
	t.Log("chromium not found: the dashboard's part of this test does not run")
	return ""
}

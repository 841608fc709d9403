package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// python returns the interpreter for the SDK tests ($EXO_PYTHON, else
// python3) if it can import module; else the test skips, or fails under
// $EXO_REQUIRE_TEST_DEPS (scripts/run-tests installs the SDKs and sets it).
func python(t *testing.T, module string) string {
	t.Helper()
	py := os.Getenv("EXO_PYTHON")
	if py == "" {
		py = "python3"
	}
	if err := exec.Command(py, "-c", "import "+module).Run(); err != nil {
		testutil.Missing(t, "%s cannot import %s (pip install %s): %v", py, module, module, err)
	}
	return py
}

// cluster runs `exo supervise` on a one-host cluster file serving SmolLM2
// as "m" (decode runner only) and returns its gateway's base URL once the
// model is healthy there: the SDK tests go through the gateway, as users
// do.
func cluster(t *testing.T) string {
	t.Helper()
	gguf := testenv.SmolLM2(t)
	dir := t.TempDir()
	api := freeAddr(t)
	_, apiPort, _ := strings.Cut(api, ":")
	base := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")
	file := filepath.Join(dir, "cluster.toml")
	cfg := "[cluster]\nname = \"sdk\"\nrunner_port_base = " + base + "\n[api]\nlisten = \"127.0.0.1\"\nport = " + apiPort +
		"\n[hosts.h]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\n[[models]]\nname = \"m\"\nsource = \"" + gguf + "\"\ndecode = { hosts = [\"h\"] }\n"
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: "supervise", done: make(chan struct{})}
	p.launch(t, []string{"supervise", "--config", file, "--host", "h"}, "supervisor", 6000)
	exited := false
	if !testutil.Until(120*time.Second, func() bool {
		select {
		case <-p.done:
			exited = true
			return true
		default:
		}
		resp, err := http.Get("http://" + api + "/health")
		if err != nil {
			return false
		}
		var h struct {
			Models map[string]struct{ Healthy int } `json:"models"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		return h.Models["m"].Healthy == 1
	}) {
		t.Fatalf("model not healthy at the gateway after 120 s:\n%s", p.logs())
	}
	if exited {
		t.Fatalf("exo supervise exited:\n%s", p.logs())
	}
	return "http://" + api
}

// TestAnthropicSDK: the official anthropic Python SDK talks to the gateway
// of a cluster serving SmolLM2: create, stream (same text), a stop
// sequence, assistant prefill, count_tokens, a tool_use → tool_result
// round trip (the streamed tool_use equal to the non-streamed one).
func TestAnthropicSDK(t *testing.T) {
	py := python(t, "anthropic")
	url := cluster(t)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, filepath.Join(root, "scripts", "clients", "anthropic_sdk.py"), url, "m").CombinedOutput()
	if err != nil {
		t.Fatalf("anthropic SDK: %v\n%s", err, out)
	}
	var got struct {
		Create  string `json:"create"`
		Stream  string `json:"stream"`
		Prefill string `json:"prefill"`
		ToolUse struct {
			Name  string         `json:"name"`
			Input map[string]any `json:"input"`
		} `json:"tool_use"`
		AfterTool string `json:"after_tool"`
		Stop      []any  `json:"stop"`
		Count     int    `json:"count_tokens"`
		Prompt    int    `json:"create_prompt_tokens"`
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("%s", lines[len(lines)-1])
	if !strings.Contains(got.Create, "Paris") {
		t.Errorf("create answered %q", got.Create)
	}
	if len(got.Stop) != 3 || got.Stop[0] != "stop_sequence" || got.Stop[1] != "Paris" || strings.Contains(got.Stop[2].(string), "Paris") {
		t.Errorf("stop sequence: %v", got.Stop)
	}
	if got.Prefill == "" || strings.HasPrefix(strings.TrimSpace(got.Prefill), "The capital") {
		t.Errorf("prefill was not continued: %q", got.Prefill)
	}
	if got.Count == 0 || got.Count != got.Prompt {
		t.Errorf("count_tokens %d, the same request's prompt %d", got.Count, got.Prompt)
	}
	if got.ToolUse.Name != "get_weather" || got.AfterTool == "" {
		t.Errorf("tool round trip: %+v, then %q", got.ToolUse, got.AfterTool)
	}
}

// TestOpenAISDK: the official openai Python SDK against the gateway of a
// cluster serving SmolLM2: five temperature-1 requests without a seed give at
// least 4 texts, with a seed one; logprobs (greedy token = best of
// top_logprobs, streamed too); a refused field named; the Responses API
// (create and stream agree).
func TestOpenAISDK(t *testing.T) {
	py := python(t, "openai")
	url := cluster(t)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, filepath.Join(root, "scripts", "clients", "openai_sdk.py"), url, "m").CombinedOutput()
	if err != nil {
		t.Fatalf("openai SDK: %v\n%s", err, out)
	}
	var got struct {
		Unseeded      int      `json:"unseeded_distinct"`
		Seeded        int      `json:"seeded_distinct"`
		LogprobsText  string   `json:"logprobs_text"`
		Content       string   `json:"content"`
		Streamed      int      `json:"streamed_logprobs"`
		Refused       string   `json:"refused_param"`
		Responses     string   `json:"responses_text"`
		ResponsesStr  string   `json:"responses_stream_text"`
		ResponsesEvts []string `json:"responses_events"`
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("%s", lines[len(lines)-1])
	if got.Unseeded < 4 || got.Seeded != 1 {
		t.Errorf("sampling: %d distinct texts without a seed (want ≥ 4), %d with one (want 1)", got.Unseeded, got.Seeded)
	}
	if got.LogprobsText != got.Content || !strings.Contains(got.Content, "Paris") || got.Streamed == 0 {
		t.Errorf("logprobs: tokens spell %q, content %q, %d streamed", got.LogprobsText, got.Content, got.Streamed)
	}
	if got.Refused != "n" { // response_format is served since the grammar engine is wired
		t.Errorf("refused param %q", got.Refused)
	}
	if !strings.Contains(got.Responses, "Paris") || got.ResponsesStr != got.Responses ||
		len(got.ResponsesEvts) != 2 || got.ResponsesEvts[0] != "response.created" || got.ResponsesEvts[1] != "response.completed" {
		t.Errorf("responses: %q / %q, events %v", got.Responses, got.ResponsesStr, got.ResponsesEvts)
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// startCluster runs `exo supervise` on a one-host cluster file serving the
// GGUF model as "m" (decode and prefill runners on this machine) and
// returns the gateway's base URL once it answers a chat completion.
func startCluster(t *testing.T, gguf string) string {
	t.Helper()
	dir := t.TempDir()
	api := freeAddr(t)
	_, port, _ := strings.Cut(api, ":")
	base := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")
	cfg := fmt.Sprintf(`[cluster]
name = "sdk"
runner_port_base = %s

[api]
listen = "127.0.0.1"
port = %s

[hosts.local]
address = "127.0.0.1"
backend = "cpu"

[[models]]
name = "m"
source = %q
decode = { hosts = ["local"] }
`, base, port, gguf)
	path := filepath.Join(dir, "cluster.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: "supervise", done: make(chan struct{}), listen: api, http: api}
	p.cmd = exec.Command(exoBin, "supervise", "--config", path, "--host", "local", "--listen", api)
	p.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- supervise log:\n%s", tail(p.logs(), 6000))
		}
	})
	url := "http://" + api
	deadline := time.Now().Add(120 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("exo supervise exited:\n%s", p.logs())
		default:
		}
		resp, err := http.Post(url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return url
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not serve m within 120 s:\n%s", tail(p.logs(), 6000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestOpenAISDKToolsAndStructuredOutputs: the official openai Python SDK,
// through the gateway of a real cluster on SmolLM2: chat.completions.parse
// with a pydantic model returns a parsed object, a two-step tool loop with
// tool_choice "required" completes, the streamed call equals the
// non-streamed one, and an unsupported schema keyword is a 400 naming it.
func TestOpenAISDKToolsAndStructuredOutputs(t *testing.T) {
	gguf := testenv.SmolLM2(t)
	url := startCluster(t, gguf)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("python", func(t *testing.T) { pythonSDK(t, root, url) })
	t.Run("node", func(t *testing.T) { nodeSDK(t, root, url) })
}

// nodeSDK: the official openai npm package: runTools calls our function
// with parsed arguments, and streamed delta.tool_calls reassemble into the
// non-streamed call. $EXO_NODE_OPENAI names the node_modules holding it
// (scripts/run-tests installs it).
func nodeSDK(t *testing.T, root, url string) {
	mods := os.Getenv("EXO_NODE_OPENAI")
	node, err := exec.LookPath("node")
	if mods == "" || err != nil {
		t.Skip("needs node and $EXO_NODE_OPENAI (a node_modules with the openai package)")
	}
	cmd := exec.Command(node, filepath.Join(root, "scripts", "clients", "openai_runtools.cjs"), url, "m")
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("openai npm: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("%s", lines[len(lines)-1])
	var got struct {
		Args     map[string]any `json:"runtools_args"`
		Roles    []string       `json:"runtools_messages"`
		Whole    [][2]string    `json:"whole"`
		Streamed [][2]string    `json:"streamed"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, ok := got.Args["city"].(string); !ok || len(got.Whole) == 0 || got.Whole[0][0] != "get_weather" {
		t.Errorf("runTools args %v, call %v", got.Args, got.Whole)
	}
}

func pythonSDK(t *testing.T, root, url string) {
	py := python(t, "openai, pydantic")
	out, err := exec.Command(py, filepath.Join(root, "scripts", "clients", "openai_tools_sdk.py"), url, "m").CombinedOutput()
	if err != nil {
		t.Fatalf("openai SDK: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	t.Logf("%s", last)
	var got struct {
		Parsed map[string]any `json:"parsed"`
		Call   struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		} `json:"call"`
		Answer struct {
			FinishReason string `json:"finish_reason"`
		} `json:"answer"`
		SchemaError string `json:"schema_error"`
	}
	if err := json.Unmarshal([]byte(last), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, ok := got.Parsed["name"].(string); !ok {
		t.Errorf("parsed object %v", got.Parsed)
	}
	if got.Call.Name != "get_weather" {
		t.Errorf("call %+v", got.Call)
	}
	if !strings.Contains(got.SchemaError, "pattern") {
		t.Errorf("schema error %q does not name pattern", got.SchemaError)
	}
}

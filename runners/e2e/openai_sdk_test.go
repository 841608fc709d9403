package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

// TestOpenAISDKToolsAndStructuredOutputs: clients no one here wrote,
// through the gateway of a real cluster on SmolLM2. The official openai
// Python SDK: chat.completions.parse with a pydantic model returns a parsed
// object, a two-step tool loop with tool_choice "required" completes, the
// streamed call equals the non-streamed one, an unsupported schema keyword
// is a 400 naming it. The openai npm package: runTools, streamed deltas.
// langchain-openai: with_structured_output and bind_tools.
func TestOpenAISDKToolsAndStructuredOutputs(t *testing.T) {
	url := cluster(t)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("python", func(t *testing.T) { pythonSDK(t, root, url) })
	t.Run("node", func(t *testing.T) { nodeSDK(t, root, url) })
	t.Run("langchain", func(t *testing.T) { langchainOpenAI(t, root, url) })
}

// langchainOpenAI: langchain-openai's with_structured_output (a pydantic
// model) and bind_tools with a forced tool.
func langchainOpenAI(t *testing.T, root, url string) {
	py := python(t, "langchain_openai")
	out, err := exec.Command(py, filepath.Join(root, "scripts", "clients", "langchain_client.py"), url, "m").CombinedOutput()
	if err != nil {
		t.Fatalf("langchain-openai: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("%s", lines[len(lines)-1])
	var got struct {
		Structured map[string]any `json:"structured"`
		ToolCall   struct {
			Name string `json:"name"`
		} `json:"tool_call"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, ok := got.Structured["name"].(string); !ok || got.ToolCall.Name != "get_weather" {
		t.Errorf("langchain: %+v", got)
	}
}

// nodeSDK: the official openai npm package: runTools calls our function
// with parsed arguments, and streamed delta.tool_calls reassemble into the
// non-streamed call. $EXO_NODE_OPENAI names the node_modules holding it
// (scripts/run-tests installs it).
func nodeSDK(t *testing.T, root, url string) {
	mods := os.Getenv("EXO_NODE_OPENAI")
	node, err := exec.LookPath("node")
	if mods == "" || err != nil {
		testutil.Missing(t, "needs node and $EXO_NODE_OPENAI (a node_modules with the openai package: npm install openai)")
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

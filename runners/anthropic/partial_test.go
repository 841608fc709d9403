package anthropic

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/gen"
)

// partialCases: arguments cut off, and the input a tool_use gets; the
// same objects as the anthropic SDK's partial parse of the streamed
// pieces (jiter's from_json(partial_mode=True)), which
// TestCompleteInputMatchesTheSDK checks where python3 has jiter.
var partialCases = []struct{ args, want string }{
	{`{"city": "Par`, `{}`},
	{`{"city": "Paris", "n`, `{"city": "Paris"}`},
	{`{"city": "Paris", "n":`, `{"city": "Paris"}`},
	{`{"a": [1, 2`, `{"a": [1, 2]}`},
	{`{"a": tr`, `{}`},
	{`{"a": true`, `{"a": true}`},
	{`{"a": 12`, `{"a": 12}`},
	{`{"a": 1.`, `{}`},
	{`{"a": -`, `{}`},
	{`{"a": 1e`, `{}`},
	{`{"a": {"b": ["x", "y`, `{"a": {"b": ["x"]}}`},
	{`{"a": {"b": ["x", {`, `{"a": {"b": ["x", {}]}}`},
	{`{`, `{}`},
	{``, `{}`},
	{`{"a": "x\`, `{}`},
	{`{"a": nul`, `{}`},
	{`{"a": [tr`, `{"a": []}`},
	{`{"a": 1, "b": "q\"`, `{"a": 1}`},
	{`{"a":[]`, `{"a": []}`},
	{`{"a": "x\"y", "b": [null, false`, `{"a": "x\"y", "b": [null, false]}`},
	{`[1, 2`, `{}`},
	{`not json`, `{}`},
}

func TestCompleteInput(t *testing.T) {
	for _, c := range partialCases {
		got := completeInput([]byte(c.args))
		if !jsonEqual(t, got, []byte(c.want)) {
			t.Errorf("completeInput(%q) = %s, want %s", c.args, got, c.want)
		}
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Errorf("%s: %v", a, err)
		return false
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	xs, _ := json.Marshal(x)
	ys, _ := json.Marshal(y)
	return bytes.Equal(xs, ys)
}

// TestCompleteInputMatchesTheSDK: the non-streamed input equals what the
// anthropic SDK builds from the same text streamed (skips without jiter).
func TestCompleteInputMatchesTheSDK(t *testing.T) {
	if exec.Command("python3", "-c", "import jiter").Run() != nil {
		testutil.Missing(t, "python3 cannot import jiter, the anthropic SDK's partial JSON parser (pip install anthropic)")
	}
	var args []string
	for _, c := range partialCases {
		if strings.HasPrefix(c.args, "{") { // the SDK only sees objects' pieces
			args = append(args, c.args)
		}
	}
	in, _ := json.Marshal(args)
	cmd := exec.Command("python3", "-c", `
import json, sys
from jiter import from_json
print(json.dumps([from_json(a.encode(), partial_mode=True) for a in json.load(sys.stdin)]))`)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var sdk []json.RawMessage
	if err := json.Unmarshal(out, &sdk); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	for i, a := range args {
		if got := completeInput([]byte(a)); !jsonEqual(t, got, sdk[i]) {
			t.Errorf("%q: completeInput %s, the SDK %s", a, got, sdk[i])
		}
	}
}

// FuzzCompleteInput: whatever the arguments, the input is a JSON object;
// every prefix of an object's text completes to one.
func FuzzCompleteInput(f *testing.F) {
	for _, c := range partialCases {
		f.Add(c.args)
	}
	f.Fuzz(func(t *testing.T, s string) {
		check := func(p string) {
			out := completeInput([]byte(p))
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("completeInput(%q) = %s: not an object: %v", p, out, err)
			}
		}
		check(s)
		var v map[string]any
		if json.Unmarshal([]byte(s), &v) == nil && len(s) < 512 {
			for i := range len(s) {
				check(s[:i])
			}
		}
	})
}

// TestTruncatedToolUse: a tool_use cut off by max_tokens has stop_reason
// "max_tokens" and, streamed or not, the same input: the complete part of
// its arguments (streamed: the input_json_delta pieces as generated, which
// the SDK parses to that object; whole: that object).
func TestTruncatedToolUse(t *testing.T) {
	g := &scriptGen{pieces: []string{"Checking."}, calls: []scriptCall{{"get_weather", []string{`{"city": "Paris", `, `"unit": "cel`}}},
		res: gen.Result{FinishReason: "length"}}
	url := serveWith(t, &Handler{Gen: g, Served: []string{"tiny"}, AcceptTools: true})
	req := `{"model":"tiny","max_tokens":20,%s"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"Weather?"}]}`
	code, body := post(t, url, strings.Replace(req, "%s", "", 1))
	if code != 200 || !strings.Contains(body, `{"type":"tool_use","id":"toolu_0","name":"get_weather","input":{"city":"Paris"}}`) ||
		!strings.Contains(body, `"stop_reason":"max_tokens"`) {
		t.Errorf("whole: %d %s", code, body)
	}
	code, body = post(t, url, strings.Replace(req, "%s", `"stream":true,`, 1))
	names, datas := events(t, body)
	var partial strings.Builder
	for i, n := range names {
		if n == "content_block_delta:input_json_delta" {
			partial.WriteString(datas[i]["delta"].(map[string]any)["partial_json"].(string))
		}
	}
	last := datas[len(datas)-2]
	if code != 200 || partial.String() != `{"city": "Paris", "unit": "cel` ||
		last["delta"].(map[string]any)["stop_reason"] != "max_tokens" {
		t.Errorf("stream: %d %s", code, body)
	}
	if got := completeInput([]byte(partial.String())); string(got) != `{"city": "Paris"}` {
		t.Errorf("the streamed pieces complete to %s", got)
	}
}

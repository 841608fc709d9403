package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSchemaClients: the llm CLI's --schema and a plain pydantic
// model_json_schema() (both without additionalProperties) give, on
// SmolLM2, documents with every required key and no key the schema does
// not name (scripts/clients/schema_clients.py).
func TestSchemaClients(t *testing.T) {
	py := python(t, "llm, openai, pydantic")
	url := cluster(t)
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, filepath.Join(root, "scripts", "clients", "schema_clients.py"), url, "m").CombinedOutput()
	if err != nil {
		t.Fatalf("schema clients: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	t.Logf("%s", last)
	var got struct {
		LLM            map[string]any `json:"llm"`
		Pydantic       map[string]any `json:"pydantic"`
		PydanticFinish string         `json:"pydantic_finish"`
	}
	if err := json.Unmarshal([]byte(last), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	check := func(name string, doc map[string]any, required, allowed []string) {
		for _, k := range required {
			if _, ok := doc[k]; !ok {
				t.Errorf("%s: document %v lacks required key %q", name, doc, k)
			}
		}
		for k := range doc {
			if !slices.Contains(allowed, k) {
				t.Errorf("%s: document %v has key %q the schema does not name", name, doc, k)
			}
		}
	}
	check("llm --schema", got.LLM, []string{"name", "age", "city"}, []string{"name", "age", "city"})
	if _, ok := got.LLM["age"].(float64); !ok {
		t.Errorf("llm --schema: age %v is not a number", got.LLM["age"])
	}
	check("pydantic", got.Pydantic, []string{"name", "age", "city"}, []string{"name", "age", "email", "city"})
	if got.PydanticFinish != "stop" {
		t.Errorf("pydantic: finish_reason %q, want stop", got.PydanticFinish)
	}
}

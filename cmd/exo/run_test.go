package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/internal/localrun"
)

func TestRunUsageErrors(t *testing.T) {
	if err := cmdRun(context.Background(), []string{"--max-tokens", "0", "hi"}); err == nil {
		t.Fatal("--max-tokens 0 accepted")
	}
	if err := cmdRun(context.Background(), []string{"--model", "x"}); err == nil {
		t.Fatal("no prompt accepted")
	}
	o := localrun.Options{Model: filepath.Join(t.TempDir(), "missing.gguf"), Backend: "cpu", MaxTokens: 1, Offline: true}
	if err := localrun.Run(context.Background(), o, "hi", &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("a missing model path succeeded")
	}
}

// TestRunServedName: --model accepts a served name of the cluster file
// (the embedded default's smollm2-135m is builtin:smollm2) and takes its
// [models.defaults].
func TestRunServedName(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c.toml")
	os.WriteFile(f, []byte("[hosts.h]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\n[[models]]\nname = \"tiny\"\nsource = \"/models/tiny\"\ndecode = { hosts = [\"h\"] }\n[models.defaults]\ntemperature = 0.25\n"), 0o644)
	o := runOptions{Options: localrun.Options{Model: "tiny"}, configPath: f}
	if err := o.resolveServedName(); err != nil || o.Model != "/models/tiny" || o.Cluster.Temperature == nil || *o.Cluster.Temperature != 0.25 {
		t.Fatalf("%v %+v", err, o)
	}
	o = runOptions{Options: localrun.Options{Model: "other/model"}, configPath: f}
	if err := o.resolveServedName(); err != nil || o.Model != "other/model" {
		t.Fatalf("%v %+v", err, o)
	}
}

package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

func TestConfigCheckExample(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := configCheck(&out, &errOut, filepath.Join("..", "..", "etc", "exo", "cluster.example.toml")); err != nil {
		t.Fatalf("example does not pass config check: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{
		"ok: cluster lab, 3 host(s), 2 model(s), API on port 52415",
		"host spark (10.0.0.10, backend cuda): 2 runner(s)",
		"qwen3-8b-prefill         exo runner prefill --model Qwen/Qwen3-8B --served-name qwen3-8b --listen 10.0.0.10:52501 --metrics 10.0.0.10:52502",
		"host mini (10.0.0.21, backend metal): 1 runner(s)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, out.String())
		}
	}
}

func TestConfigCheckErrors(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(p, []byte("[hosts.a]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\nbogus = 1\n"), 0o644)
	var out, errOut bytes.Buffer
	err := configCheck(&out, &errOut, p)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("err = %v, want exit 1", err)
	}
	want := p + ":1:1: no models: add at least one [[models]] table\n" + p + ":4:1: unknown key \"bogus\" (known keys here: address, backend, threads, memory_gib, rdma)\n"
	if errOut.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errOut.String(), want)
	}
}

// TestConfigCheckPipeline: with the model on this machine, config check
// prints each stage (host, layers, weight GiB, KV reserve) and the stage
// flags; a split that does not fit fails at the decode key; a model that
// is not here leaves placement to start-up.
func TestConfigCheckPipeline(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny")
	if err := testmodel.Write(model, testmodel.Spec{Arch: "llama", Layers: 4}); err != nil {
		t.Fatal(err)
	}
	file := func(src, mem string) string {
		p := filepath.Join(dir, "c.toml")
		os.WriteFile(p, []byte(`[cluster]
insecure = true
models_dir = "`+filepath.Join(dir, "store")+`"
[hosts.a]
address = "127.0.0.2"
backend = "cpu"
memory_gib = `+mem+`
[hosts.b]
address = "127.0.0.3"
backend = "mlx-cpu"
memory_gib = `+mem+`
[[models]]
name = "m"
source = "`+src+`"
decode = { hosts = ["a", "b"], shard = "pipeline" }
`), 0o644)
		return p
	}
	var out, errOut bytes.Buffer
	if err := configCheck(&out, &errOut, file(model, "1")); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	for _, want := range []string{
		"--layers 0:2 --stage 0/2 --stage-listen 127.0.0.2:52503 --stage-next 127.0.0.3:52503",
		"--layers 2:4 --stage 1/2 --stage-listen 127.0.0.3:52503 --stage-next 127.0.0.2:52503",
		"--backend mlx --device cpu",
		"model m decode: pipeline over 2 hosts (a, b), KV reserved for 512 tokens",
		"stage 0  host a            layers   0:2    weights ",
		"stage 1  host b            layers   2:4",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	err := configCheck(&out, &errOut, file(model, "0.0001"))
	if err == nil || !strings.Contains(errOut.String(), "c.toml:15:1: model m: decode: placement does not fit: host a (stage 0, layers 0:2) needs") {
		t.Errorf("too small: %v\n%s", err, errOut.String())
	}
	out.Reset()
	if err := configCheck(&out, &errOut, file("org/elsewhere", "1")); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "placement is decided at start-up") || strings.Contains(out.String(), "--stage") {
		t.Errorf("model not here:\n%s", out.String())
	}
}

// TestConfigCheckMissingFile: a file that is not there says how to get
// one (the check of a fresh machine with no /etc/exo/cluster.toml).
func TestConfigCheckMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.toml")
	var out, errOut bytes.Buffer
	err := configCheck(&out, &errOut, p)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(ee.msg, "no such file") || !strings.Contains(ee.msg, "exo config default") {
		t.Fatalf("err = %v, want exit 1 naming `exo config default`", err)
	}
}

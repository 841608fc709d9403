package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	want := p + ":1:1: no models: add at least one [[models]] table\n" + p + ":4:1: unknown key \"bogus\" (known keys here: address, backend, threads, memory_gib)\n"
	if errOut.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errOut.String(), want)
	}
}

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/kvwire"
)

func TestWeightBytes(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "model-00001.safetensors"), make([]byte, 300), 0o644)
	os.WriteFile(filepath.Join(dir, "model-00002.safetensors"), make([]byte, 200), 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), make([]byte, 999), 0o644)
	gguf := filepath.Join(dir, "m.gguf")
	os.WriteFile(gguf, make([]byte, 123), 0o644)
	empty := t.TempDir()
	for _, tt := range []struct {
		path string
		want int64
		err  bool
	}{{dir, 500, false}, {gguf, 123, false}, {empty, 0, true}, {filepath.Join(dir, "none"), 0, true}} {
		got, err := weightBytes(tt.path)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("weightBytes(%s) = %d, %v; want %d (error %v)", tt.path, got, err, tt.want, tt.err)
		}
	}
}

func TestKVFailureFix(t *testing.T) {
	for _, tt := range []struct {
		err        error
		secretFile string
		want       string
	}{
		{fmt.Errorf("x: %w", kvwire.ErrAuth), "/etc/exo/secret", "the secrets differ: copy /etc/exo/secret from spark"},
		{kvwire.ErrAuth, "", "this host has none"},
		{kvwire.ErrMismatch, "/s", "predates the link probe"},
		{errors.New("connection refused"), "/s", "does not answer on the KV wire"},
	} {
		c := kvFailure("KV wire", "spark", tt.secretFile, tt.err)
		if c.Status != checkFail || !strings.Contains(c.Fix, tt.want) {
			t.Errorf("%v: %+v, want a fix containing %q", tt.err, c, tt.want)
		}
	}
}

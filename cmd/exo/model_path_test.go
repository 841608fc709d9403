package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestModelCommandStaysInTheStore: `exo model pull` (offline, so only the
// store is looked at) and `exo model rm` refuse ids with "..", absolute
// paths, "/" where an id has none, or control characters, and touch
// nothing outside the store: a directory beside the store that such an id
// would reach is still there, and nothing new appears beside it.
func TestModelCommandStaysInTheStore(t *testing.T) {
	root := t.TempDir()
	store := filepath.Join(root, "store")
	victim := filepath.Join(root, "victim", "model")
	for _, d := range []string{filepath.Join(store, "org", "name"), victim} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(victim, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	listing := func() []string {
		var all []string
		filepath.WalkDir(root, func(p string, _ os.DirEntry, _ error) error { all = append(all, p); return nil })
		return all
	}
	before := listing()
	for _, id := range []string{
		"../victim", "../victim/model", "org/../../victim/model", "org/..", "../../..", "./org/name",
		"/etc", "/tmp/x/y", victim, "org//name", "org/name/../../../victim/model.gguf",
		"org/name@../../../victim", "org/name@main/../..", "org/na\x00me", "org/name\n", "org\x1b[2J/name", "org/name\t",
		"org/na%2e%2e", "..%2fvictim/model",
	} {
		for _, sub := range []string{"pull", "rm"} {
			err := cmdModel(context.Background(), []string{sub, "--models-dir", store, "--offline", id})
			if err == nil {
				t.Errorf("exo model %s %q: no error", sub, id)
			}
		}
	}
	if after := listing(); !slices.Equal(before, after) {
		t.Fatalf("files changed:\nbefore %q\nafter  %q", before, after)
	}
}

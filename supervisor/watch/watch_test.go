package watch

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// debounce is long against the microseconds between a burst's writes, so that a test
// goroutine descheduled on a loaded machine cannot split one burst into two changes (at
// 50 ms, TestInPlaceWriteDebounced failed under CI load); quiet waits out three of them.
const debounce = 500 * time.Millisecond

type harness struct {
	t       *testing.T
	changes chan string
	trigger chan os.Signal
}

func start(t *testing.T, path string) *harness {
	h := &harness{t, make(chan string, 16), make(chan os.Signal, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done, started := make(chan error, 1), make(chan struct{})
	go func() {
		o := Options{Debounce: debounce, Trigger: h.trigger, Started: func() { close(started) }}
		done <- Run(ctx, path, o, func(r string) { h.changes <- r })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	<-started
	return h
}

func (h *harness) expectChange() string {
	h.t.Helper()
	select {
	case r := <-h.changes:
		return r
	case <-time.After(10 * time.Second):
		h.t.Fatal("no change reported")
		return ""
	}
}

func (h *harness) expectQuiet() {
	h.t.Helper()
	select {
	case r := <-h.changes:
		h.t.Fatalf("unexpected change: %s", r)
	case <-time.After(3 * debounce):
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestInPlaceWriteDebounced(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cluster.toml")
	write(t, f, "a")
	h := start(t, f)
	for _, s := range []string{"b", "bc", "bcd"} { // a burst: one call
		write(t, f, s)
	}
	h.expectChange()
	h.expectQuiet()
}

func TestOtherFilesIgnored(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cluster.toml")
	write(t, f, "a")
	h := start(t, f)
	write(t, filepath.Join(dir, "other.toml"), "x")
	h.expectQuiet()
}

func TestRenameOver(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cluster.toml")
	write(t, f, "a")
	h := start(t, f)
	tmp := filepath.Join(dir, ".cluster.toml.swp")
	write(t, tmp, "b")
	if err := os.Rename(tmp, f); err != nil {
		t.Fatal(err)
	}
	h.expectChange()
	// And again: the watch survives the inode change.
	write(t, tmp, "c")
	os.Rename(tmp, f)
	h.expectChange()
}

func TestSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		os.Mkdir(filepath.Join(dir, v), 0o755)
		write(t, filepath.Join(dir, v, "cluster.toml"), v)
	}
	f := filepath.Join(dir, "cluster.toml")
	os.Symlink("v1/cluster.toml", f)
	h := start(t, f)
	// ln -sfn: a new link renamed over the old one.
	os.Symlink("v2/cluster.toml", filepath.Join(dir, "tmp-link"))
	if err := os.Rename(filepath.Join(dir, "tmp-link"), f); err != nil {
		t.Fatal(err)
	}
	h.expectChange()
	// Editing the new target in place is seen too (its directory is watched now).
	write(t, filepath.Join(dir, "v2", "cluster.toml"), "v2b")
	h.expectChange()
}

func TestNixOSEtcStaticSwap(t *testing.T) {
	// /etc/exo/cluster.toml -> /etc/static/exo/cluster.toml, /etc/static -> store/gen-N/etc
	root := t.TempDir()
	for _, g := range []string{"gen1", "gen2"} {
		os.MkdirAll(filepath.Join(root, "store", g, "etc", "exo"), 0o755)
		write(t, filepath.Join(root, "store", g, "etc", "exo", "cluster.toml"), g)
	}
	etc := filepath.Join(root, "etc")
	os.MkdirAll(filepath.Join(etc, "exo"), 0o755)
	os.Symlink(filepath.Join(root, "store", "gen1", "etc"), filepath.Join(etc, "static"))
	f := filepath.Join(etc, "exo", "cluster.toml")
	os.Symlink(filepath.Join(etc, "static", "exo", "cluster.toml"), f)
	if b, _ := os.ReadFile(f); string(b) != "gen1" {
		t.Fatalf("setup: read %q", b)
	}
	h := start(t, f)
	os.Symlink(filepath.Join(root, "store", "gen2", "etc"), filepath.Join(etc, ".static.tmp"))
	if err := os.Rename(filepath.Join(etc, ".static.tmp"), filepath.Join(etc, "static")); err != nil {
		t.Fatal(err)
	}
	h.expectChange()
	if b, _ := os.ReadFile(f); string(b) != "gen2" {
		t.Fatalf("after swap: read %q", b)
	}
}

func TestTrigger(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cluster.toml")
	write(t, f, "a")
	h := start(t, f)
	h.trigger <- syscall.SIGHUP
	if r := h.expectChange(); r != "hangup" {
		t.Errorf("reason = %q", r)
	}
}

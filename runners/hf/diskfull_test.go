package hf

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestDiskFullMidPull: the disk fills up in the middle of a weight file.
// The pull fails with ErrNoSpace and a message that says so; the .partial
// and its resume state stay, nothing incomplete sits under the final name,
// and the model does not look present. Once space is back, the next pull
// resumes where the disk filled up instead of starting over.
func TestDiskFullMidPull(t *testing.T) {
	h := newFakeHub(t)
	files := modelFiles()
	h.addRepo("org/tiny", false, files)
	store := t.TempDir()
	const big = "model-00001-of-00002.safetensors"
	const room = 100_000 // bytes of weights the disk takes before it is full

	c := testClient(t, h, store, nil)
	c.parallel = 1
	var mu sync.Mutex
	written := int64(0)
	c.writeAt = func(f *os.File, b []byte, off int64) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if !strings.HasSuffix(f.Name(), big+".partial") {
			return f.WriteAt(b, off)
		}
		if written+int64(len(b)) > room {
			return 0, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
		}
		written += int64(len(b))
		return f.WriteAt(b, off)
	}
	_, err := c.pull(context.Background(), mustRef(t, "org/tiny"))
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "partial file is kept") {
		t.Fatalf("pull onto a full disk: err = %v, want ErrNoSpace saying the partial is kept", err)
	}
	t.Logf("error: %v", err)
	partials, _ := filepath.Glob(filepath.Join(store, "org", "tiny", "snapshots", "*", big+".partial"))
	if len(partials) != 1 {
		t.Fatalf("want one .partial kept, got %v", partials)
	}
	if _, err := os.Stat(partials[0] + ".json"); err != nil {
		t.Fatalf("resume state not kept: %v", err)
	}
	if _, err := os.Stat(strings.TrimSuffix(partials[0], ".partial")); err == nil {
		t.Fatal("an incomplete file exists under the final name")
	}
	if _, err := Resolve(context.Background(), "org/tiny", Options{StoreDir: store, Offline: true}); !errors.Is(err, ErrNotInStore) {
		t.Fatalf("a pull that ran out of disk must not look complete: %v", err)
	}

	// Space is back: the next pull resumes.
	before := h.servedBytes(big)
	var planned []int64
	c = testClient(t, h, store, func(o *Options) {
		o.Plan = func(dir string, need, free int64) { planned = append(planned, need, free) }
	})
	dir, err := c.pull(context.Background(), mustRef(t, "org/tiny"))
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, dir, files, wantFiles)
	total := int64(len(files[big]))
	if got := h.servedBytes(big); got >= before+total {
		t.Errorf("%s: %d bytes served before, %d after: the second pull started over", big, before, got)
	}
	if len(planned) != 2 || planned[0] <= 0 || planned[1] == 0 {
		t.Errorf("Plan called with %v, want one call with the bytes needed and free", planned)
	}
}

// TestPlanRefusesBeforeDownloading: Plan states what is needed, and a disk
// too small fails before any weight byte is fetched.
func TestPlanRefusesBeforeDownloading(t *testing.T) {
	h := newFakeHub(t)
	files := modelFiles()
	h.addRepo("org/tiny", false, files)
	var need, free int64
	c := testClient(t, h, t.TempDir(), func(o *Options) { o.Plan = func(_ string, n, f int64) { need, free = n, f } })
	c.free = func(string) (int64, error) { return 1 << 20, nil }
	_, err := c.pull(context.Background(), mustRef(t, "org/tiny"))
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err = %v, want ErrNoSpace", err)
	}
	var weights int64
	for _, n := range wantFiles {
		weights += int64(len(files[n]))
	}
	if need < weights || free != 1<<20 {
		t.Fatalf("Plan(need %d, free %d), want need ≥ %d and free %d", need, free, weights, 1<<20)
	}
	if h.servedBytes("model-00001-of-00002.safetensors") != 0 {
		t.Error("downloaded although the disk was too small")
	}
}

package hf

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkPull measures a whole pull over loopback: 32 MiB of weights in
// 4 MiB ranges on 4 connections, written, sha256-verified and placed.
func BenchmarkPull(b *testing.B) {
	h := newFakeHub(b)
	files := modelFiles()
	files["model-00001-of-00002.safetensors"] = randBytes(1, 32<<20)
	h.addRepo("org/bench", false, files)
	var size int64
	for _, n := range wantFiles {
		size += int64(len(files[n]))
	}
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		store := b.TempDir()
		c, err := newClient(Options{StoreDir: store, Endpoint: h.hub.URL, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		c.chunkSize = 4 << 20
		c.parallel = 4
		if _, err := c.pull(context.Background(), Ref{Repo: "org/bench", Revision: "main"}); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(store)
	}
}

// BenchmarkVerify measures the sha256 pass over a downloaded file.
func BenchmarkVerify(b *testing.B) {
	data := randBytes(9, 16<<20)
	p := filepath.Join(b.TempDir(), "f")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(data)
	f, err := os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rf := repoFile{Name: "f", Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := verify(f, rf); err != nil {
			b.Fatal(err)
		}
	}
}

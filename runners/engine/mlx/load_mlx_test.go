//go:build mlx && cgo && (linux || darwin)

package mlx

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/hf"
)

// readerLoadBackend is a test backend whose FromBytes loads through MLX's
// safetensors reader when via is true and copies with mlx_array_new_data
// (the old path) when it is false. It skips when this device and library
// cannot take the reader path.
func readerLoadBackend(t *testing.T, via bool) *backend {
	t.Helper()
	b := newTestBackend(t)
	var ok bool
	b.do(func() { ok = b.readerLoad; b.readerLoad = via })
	if !ok {
		t.Skipf("%s: FromBytes does not load through MLX's reader here (device not the CPU, not Linux, or libmlxc lacks mlx_load_safetensors_reader)", b.Name())
	}
	return b
}

// Every dtype and a few shapes: the reader path's array holds exactly the
// bytes given, as the old path's does; arrays under readerLoadMin take the
// old path (nothing advised), larger ones are advised as huge pages.
func TestReaderLoadBytes(t *testing.T) {
	viaR, plain := readerLoadBackend(t, true), readerLoadBackend(t, false)
	thp := hasTHP()
	rng := rand.New(rand.NewPCG(31, 7))
	cases := []struct {
		dt    engine.DType
		shape []int
	}{
		{engine.F32, []int{1283, 1021}}, // 5.0 MiB, rows not a multiple of anything
		{engine.F32, []int{3, 517, 1031}},
		{engine.BF16, []int{2049, 1537}},
		{engine.F16, []int{1024, 2050}},
		{engine.I32, []int{1 << 20, 1}},
		{engine.U32, []int{4096, 320}}, // packed quantized weights
		{engine.U8, []int{5 << 20}},
		{engine.F32, []int{1000, 1000}}, // under readerLoadMin: the old path
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%v%v", c.dt, c.shape), func(t *testing.T) {
			data := make([]byte, numel(c.shape)*c.dt.Size())
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			before := hugeMiB(viaR)
			for _, b := range []*backend{viaR, plain} {
				a := b.FromBytes(data, c.shape, c.dt)
				if got := a.Shape(); fmt.Sprint(got) != fmt.Sprint(c.shape) || a.DType() != c.dt {
					t.Fatalf("%v: %v %v, want %v %v", b.readerLoad, got, a.DType(), c.shape, c.dt)
				}
				got, err := b.Bytes(a)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, data) {
					t.Errorf("reader path %v: the array's bytes differ from the input", b.readerLoad)
				}
				b.Free(a)
			}
			advised := hugeMiB(viaR) - before
			if big := len(data) >= readerLoadMin; thp && big != (advised > 0) {
				t.Errorf("%d bytes: %d MiB advised as huge pages", len(data), advised)
			}
		})
	}
	if n := hugeMiB(plain); n != 0 {
		t.Errorf("the old path advised %d MiB", n)
	}
}

// hasTHP: the kernel has transparent huge pages (madvise MADV_HUGEPAGE
// succeeds; without them it fails and nothing is advised).
func hasTHP() bool {
	_, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled")
	return runtime.GOOS == "linux" && err == nil
}

func hugeMiB(b *backend) (n int) {
	b.do(func() { n = b.hugeMiB })
	return n
}

// The weight buffers the reader path makes carry the huge-page advice
// (VmFlags "hg" in /proc/self/smaps for the 2 MiB-aligned interior of the
// buffer): whether the kernel then found 2 MiB pages is its business
// (AnonHugePages, logged).
func TestReaderLoadAdvisesHugePages(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("huge-page advice is Linux's")
	}
	if !hasTHP() {
		t.Skip("kernel without transparent huge pages")
	}
	b := readerLoadBackend(t, true)
	data := make([]byte, 16<<20)
	a := b.FromBytes(data, []int{4 << 20}, engine.F32)
	defer b.Free(a)
	var p uintptr
	var err error
	b.do(func() { p, err = b.dataAddr(b.arr(a)) })
	if err != nil || p == 0 {
		t.Fatalf("no data pointer: %v", err)
	}
	const huge = 2 << 20
	lo := (p + huge - 1) &^ (huge - 1)
	flags, anonHuge := smapsAt(t, lo)
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Errorf("the buffer at %#x: VmFlags %q lack hg (MADV_HUGEPAGE)", lo, flags)
	}
	t.Logf("VmFlags %q, AnonHugePages %s", flags, anonHuge)
}

// smapsAt returns the VmFlags and AnonHugePages of this process's mapping
// holding address p.
func smapsAt(t *testing.T, p uintptr) (flags, anonHuge string) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := strings.Cut(strings.Fields(line + " x")[0], "-"); ok && !strings.HasSuffix(line, ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				in = uint64(p) >= l && uint64(p) < h
				continue
			}
		}
		if !in {
			continue
		}
		if v, ok := strings.CutPrefix(line, "AnonHugePages:"); ok {
			anonHuge = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			return strings.TrimSpace(v), anonHuge
		}
	}
	t.Fatalf("no mapping holds %#x", p)
	return "", ""
}

// A model loaded through the reader gives the same logits, bit for bit, as
// the same model copied in with mlx_array_new_data: an f32 and a bf16
// stack whose projections pass readerLoadMin (the embedding does not), and the real
// SmolLM2-135M (GGUF Q4_1: packed U32 weights, f32 scales) where present.
func TestReaderLoadSameLogits(t *testing.T) {
	viaR, plain := readerLoadBackend(t, true), readerLoadBackend(t, false)
	root := t.TempDir()
	paths := map[string]string{}
	for _, dt := range []engine.DType{engine.F32, engine.BF16} {
		dir := filepath.Join(root, dt.String())
		spec := testmodel.Spec{Arch: "llama", DType: dt, Seed: 31, Hidden: 1024, Heads: 8, KVHeads: 4,
			Intermediate: 2048}
		if err := testmodel.Write(dir, spec); err != nil {
			t.Fatal(err)
		}
		paths[dt.String()] = dir
	}
	if p, err := hf.FindSmolLM2(context.Background()); err == nil {
		paths["SmolLM2-Q4_1"] = p
	} else {
		t.Logf("SmolLM2-135M not found (%v): the generated stacks only", err)
	}
	for name, path := range paths {
		t.Run(name, func(t *testing.T) {
			before := hugeMiB(viaR)
			mr, mp := load(t, path, viaR), load(t, path, plain)
			if hugeMiB(viaR) == before {
				t.Fatalf("no weight of %s went through the reader path", name)
			}
			prompt := []int32{1, 7, 42, 99, 3, 250, 17}
			cr, cp := mr.NewCache(), mp.NewCache()
			defer cr.Free()
			defer cp.Free()
			lr, lp := forward(t, mr, cr, prompt...), forward(t, mp, cp, prompt...)
			for step := range 4 {
				if !equalBits(lr, lp) {
					t.Fatalf("step %d: logits differ between the reader path and mlx_array_new_data", step)
				}
				next := argmax(lp)
				lr, lp = forward(t, mr, cr, next), forward(t, mp, cp, next)
			}
		})
	}
}

func equalBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && (a[i] == a[i] || b[i] == b[i]) {
			return false
		}
	}
	return true
}

package modelinfo

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// GGUF header limits: far above real files, low enough that a hostile
// header cannot make the reader allocate much.
const (
	ggufMaxKV      = 1 << 16
	ggufMaxTensors = 1 << 20
	ggufMaxArray   = 1 << 26
	ggufMaxName    = 1 << 16
	ggufMaxString  = 1 << 26
	ggufMaxDims    = 8
)

// GGUFHeader is what a GGUF file's header says that placement needs.
type GGUFHeader struct {
	Version uint32
	// Ints holds every integer (and bool) metadata value; an integer array
	// is kept as its largest element. Strings holds string values.
	Ints    map[string]int64
	Strings map[string]string
	// Tensors are sorted by offset; Bytes is the distance to the next
	// tensor's data (the last one's: to the end of the file), so it counts
	// the alignment padding too (at most general.alignment bytes).
	Tensors []Tensor
	// DataStart is where tensor data begins (the header's end, aligned).
	DataStart int64
}

type ggufTensorInfo struct {
	name   string
	offset uint64
}

type ggufReader struct {
	r   *bufio.Reader
	n   int64 // bytes read
	err error
}

func (g *ggufReader) fail(format string, args ...any) {
	if g.err == nil {
		g.err = fmt.Errorf("%w: gguf: "+format, append([]any{ErrFormat}, args...)...)
	}
}

func (g *ggufReader) read(b []byte) {
	if g.err != nil {
		return
	}
	k, err := io.ReadFull(g.r, b)
	g.n += int64(k)
	if err != nil {
		g.fail("truncated header at byte %d", g.n)
	}
}

func (g *ggufReader) u32() uint32 {
	var b [4]byte
	g.read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (g *ggufReader) u64() uint64 {
	var b [8]byte
	g.read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// str reads a string, keeping it when it is at most keep bytes (else
// skipping it and returning "").
func (g *ggufReader) str(keep int) (string, bool) {
	n := g.u64()
	if g.err != nil {
		return "", false
	}
	if n > ggufMaxString {
		g.fail("string of %d bytes", n)
		return "", false
	}
	if int(n) > keep {
		k, err := g.r.Discard(int(n))
		g.n += int64(k)
		if err != nil {
			g.fail("truncated string at byte %d", g.n)
		}
		return "", false
	}
	b := make([]byte, n)
	g.read(b)
	return string(b), g.err == nil
}

func ggufScalarSize(t uint32) int {
	switch t {
	case 0, 1, 7:
		return 1
	case 2, 3:
		return 2
	case 4, 5, 6:
		return 4
	case 10, 11, 12:
		return 8
	}
	return 0
}

// scalar reads one value of scalar type t; isInt says it is an integer or
// bool.
func (g *ggufReader) scalar(t uint32) (int64, bool) {
	var b [8]byte
	sz := ggufScalarSize(t)
	g.read(b[:sz])
	switch t {
	case 0, 7:
		return int64(b[0]), true
	case 1:
		return int64(int8(b[0])), true
	case 2:
		return int64(binary.LittleEndian.Uint16(b[:])), true
	case 3:
		return int64(int16(binary.LittleEndian.Uint16(b[:]))), true
	case 4:
		return int64(binary.LittleEndian.Uint32(b[:])), true
	case 5:
		return int64(int32(binary.LittleEndian.Uint32(b[:]))), true
	case 10:
		v := binary.LittleEndian.Uint64(b[:])
		return int64(min(v, math.MaxInt64)), true
	case 11:
		return int64(binary.LittleEndian.Uint64(b[:])), true
	}
	return 0, false // floats
}

// value reads a metadata value of type t into h under key.
func (g *ggufReader) value(h *GGUFHeader, key string, t uint32) {
	switch {
	case t == 8:
		if s, ok := g.str(1 << 12); ok {
			h.Strings[key] = s
		}
	case t == 9:
		et := g.u32()
		n := g.u64()
		if g.err != nil {
			return
		}
		if n > ggufMaxArray {
			g.fail("array %q of %d elements", key, n)
			return
		}
		if et == 8 {
			for i := uint64(0); i < n && g.err == nil; i++ {
				g.str(-1)
			}
			return
		}
		sz := ggufScalarSize(et)
		if sz == 0 {
			g.fail("array %q of element type %d", key, et)
			return
		}
		var best int64
		isInt := false
		for i := uint64(0); i < n && g.err == nil; i++ {
			v, ok := g.scalar(et)
			if ok && (!isInt || v > best) {
				best, isInt = v, true
			}
		}
		if isInt && g.err == nil {
			h.Ints[key] = best
		}
	case ggufScalarSize(t) > 0:
		if v, ok := g.scalar(t); ok && g.err == nil {
			h.Ints[key] = v
		}
	default:
		g.fail("metadata %q of unknown type %d", key, t)
	}
}

// ParseGGUFHeader reads a GGUF header (version 2 or 3) from r, a file of
// size bytes, without reading tensor data.
func ParseGGUFHeader(r io.Reader, size int64) (*GGUFHeader, error) {
	g := &ggufReader{r: bufio.NewReaderSize(r, 1<<16)}
	if m := g.u32(); g.err == nil && m != 0x46554747 {
		return nil, fmt.Errorf("%w: not a GGUF file (magic %#x)", ErrFormat, m)
	}
	h := &GGUFHeader{Version: g.u32(), Ints: map[string]int64{}, Strings: map[string]string{}}
	if g.err == nil && h.Version != 2 && h.Version != 3 {
		return nil, fmt.Errorf("%w: gguf version %d (want 2 or 3)", ErrFormat, h.Version)
	}
	nt, nkv := g.u64(), g.u64()
	if g.err == nil && (nt > ggufMaxTensors || nkv > ggufMaxKV) {
		g.fail("%d tensors and %d metadata keys", nt, nkv)
	}
	for i := uint64(0); i < nkv && g.err == nil; i++ {
		key, ok := g.str(ggufMaxName)
		if !ok && g.err == nil {
			g.fail("metadata key %d longer than %d bytes", i, ggufMaxName)
		}
		t := g.u32()
		g.value(h, key, t)
	}
	infos := make([]ggufTensorInfo, 0, min(nt, 4096))
	for i := uint64(0); i < nt && g.err == nil; i++ {
		name, ok := g.str(ggufMaxName)
		if !ok && g.err == nil {
			g.fail("tensor %d name longer than %d bytes", i, ggufMaxName)
		}
		nd := g.u32()
		if g.err == nil && nd > ggufMaxDims {
			g.fail("tensor %q has %d dimensions", name, nd)
		}
		for d := uint32(0); d < nd && g.err == nil; d++ {
			g.u64()
		}
		g.u32() // ggml type: sizes come from the offsets
		infos = append(infos, ggufTensorInfo{name, g.u64()})
	}
	if g.err != nil {
		return nil, g.err
	}
	align := int64(32)
	if a, ok := h.Ints["general.alignment"]; ok {
		if a < 1 || a > 1<<20 || a&(a-1) != 0 {
			return nil, fmt.Errorf("%w: gguf general.alignment %d", ErrFormat, a)
		}
		align = a
	}
	h.DataStart = (g.n + align - 1) / align * align
	if size < h.DataStart {
		return nil, fmt.Errorf("%w: gguf data starts at %d past the file's %d bytes", ErrFormat, h.DataStart, size)
	}
	sort.SliceStable(infos, func(i, j int) bool { return infos[i].offset < infos[j].offset })
	dataLen := uint64(size - h.DataStart)
	for i, t := range infos {
		end := dataLen
		if i+1 < len(infos) {
			end = infos[i+1].offset
		}
		if t.offset > end || end > dataLen {
			return nil, fmt.Errorf("%w: gguf tensor %q at offset %d past its end %d (data %d bytes)", ErrFormat, t.name, t.offset, end, dataLen)
		}
		if i > 0 && t.offset == infos[i-1].offset && t.offset != end {
			return nil, fmt.Errorf("%w: gguf tensors %q and %q share offset %d", ErrFormat, infos[i-1].name, t.name, t.offset)
		}
		h.Tensors = append(h.Tensors, Tensor{t.name, int64(end - t.offset)})
	}
	return h, nil
}

var ggufLayerRe = regexp.MustCompile(`^blk\.(\d+)\.`)

func ggufKind(name string) (int, tensorKind) {
	if m := ggufLayerRe.FindStringSubmatch(name); m != nil {
		if i, err := strconv.Atoi(m[1]); err == nil {
			return i, kindOther
		}
	}
	switch {
	case strings.HasPrefix(name, "token_embd."):
		return -1, kindEmbed
	case strings.HasPrefix(name, "output_norm."):
		return -1, kindNorm
	case strings.HasPrefix(name, "output."):
		return -1, kindHead
	}
	return -1, kindOther
}

// ggufFacts turns a parsed header into Facts.
func ggufFacts(h *GGUFHeader) (*Facts, error) {
	arch := h.Strings["general.architecture"]
	if arch == "" {
		return nil, fmt.Errorf("%w: gguf has no general.architecture", ErrFormat)
	}
	get := func(k string) int {
		v := h.Ints[arch+"."+k]
		return int(min(max(v, 0), 1<<40))
	}
	f := &Facts{Format: "gguf", Arch: arch, Layers: get("block_count"), Hidden: get("embedding_length"),
		Heads: get("attention.head_count"), KVHeads: get("attention.head_count_kv"), HeadDim: get("attention.key_length"),
		Intermediate: get("feed_forward_length"), MoEIntermediate: get("expert_feed_forward_length"),
		Experts: get("expert_count"), MaxContext: get("context_length"), KVElemBytes: 4}
	if f.Layers > 1<<16 {
		return nil, fmt.Errorf("%w: gguf block_count %d", ErrFormat, f.Layers)
	}
	if _, ok := h.Ints[arch+".attention.head_count_kv"]; !ok {
		f.KVHeads = f.Heads
	}
	if f.HeadDim == 0 && f.Heads > 0 {
		f.HeadDim = f.Hidden / f.Heads
	}
	f.LayerBytes = make([]int64, f.Layers)
	f.KVLayer = make([]bool, f.Layers)
	f.Window = make([]int, f.Layers)
	f.SharedExpertIntermediate = get("expert_shared_feed_forward_length")
	f.SparseMLP = f.Experts > 0
	f.DenseMLP = f.Experts == 0 || get("leading_dense_block_count") > 0
	k := get("full_attention_interval")
	for i := range f.KVLayer {
		f.KVLayer[i] = k <= 0 || (i+1)%k == 0
	}
	for _, t := range h.Tensors {
		layer, kind := ggufKind(t.Name)
		f.add(layer, kind, t.Bytes)
	}
	f.Tied = f.HeadBytes == 0
	return f, nil
}

func readGGUFFile(path string) (*Facts, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("modelinfo: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("modelinfo: %w", err)
	}
	h, err := ParseGGUFHeader(fh, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f, err := ggufFacts(h)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

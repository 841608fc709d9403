package weights

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// ggufBuilder writes GGUF v3 files for tests.
type ggufBuilder struct {
	kv      bytes.Buffer
	nKV     int
	tensors []ggufTestTensor
	align   uint64
}

type ggufTestTensor struct {
	name string
	dims []uint64
	typ  GGMLType
	data []byte
}

func le(w *bytes.Buffer, v any) { binary.Write(w, binary.LittleEndian, v) }

func putStr(w *bytes.Buffer, s string) {
	le(w, uint64(len(s)))
	w.WriteString(s)
}

func (b *ggufBuilder) key(k string, t uint32) {
	putStr(&b.kv, k)
	le(&b.kv, t)
	b.nKV++
}

func (b *ggufBuilder) Str(k, v string)        { b.key(k, gString); putStr(&b.kv, v) }
func (b *ggufBuilder) U32(k string, v uint32) { b.key(k, gUint32); le(&b.kv, v) }
func (b *ggufBuilder) F32(k string, v float32) {
	b.key(k, gFloat32)
	le(&b.kv, v)
}
func (b *ggufBuilder) Bool(k string, v bool) { b.key(k, gBool); le(&b.kv, v) }
func (b *ggufBuilder) Bools(k string, v []bool) {
	b.key(k, gArray)
	le(&b.kv, uint32(gBool))
	le(&b.kv, uint64(len(v)))
	le(&b.kv, v)
}
func (b *ggufBuilder) Strs(k string, v []string) {
	b.key(k, gArray)
	le(&b.kv, uint32(gString))
	le(&b.kv, uint64(len(v)))
	for _, s := range v {
		putStr(&b.kv, s)
	}
}
func (b *ggufBuilder) I32s(k string, v []int32) {
	b.key(k, gArray)
	le(&b.kv, uint32(gInt32))
	le(&b.kv, uint64(len(v)))
	le(&b.kv, v)
}
func (b *ggufBuilder) F32s(k string, v []float32) {
	b.key(k, gArray)
	le(&b.kv, uint32(gFloat32))
	le(&b.kv, uint64(len(v)))
	le(&b.kv, v)
}

func (b *ggufBuilder) Tensor(name string, typ GGMLType, data []byte, dims ...uint64) {
	b.tensors = append(b.tensors, ggufTestTensor{name, dims, typ, data})
}

func (b *ggufBuilder) Bytes() []byte {
	align := b.align
	if align == 0 {
		align = 32
	}
	var w bytes.Buffer
	le(&w, uint32(ggufMagic))
	le(&w, uint32(3))
	le(&w, uint64(len(b.tensors)))
	le(&w, uint64(b.nKV))
	w.Write(b.kv.Bytes())
	var off uint64
	offs := make([]uint64, len(b.tensors))
	for i, t := range b.tensors {
		putStr(&w, t.name)
		le(&w, uint32(len(t.dims)))
		le(&w, t.dims)
		le(&w, uint32(t.typ))
		offs[i] = off
		le(&w, off)
		off += uint64(len(t.data))
		off = (off + align - 1) / align * align
	}
	for w.Len()%int(align) != 0 {
		w.WriteByte(0)
	}
	base := w.Len()
	for i, t := range b.tensors {
		for uint64(w.Len()-base) < offs[i] {
			w.WriteByte(0)
		}
		w.Write(t.data)
	}
	return w.Bytes()
}

func f32Bytes(v ...float32) []byte {
	out := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
	}
	return out
}

func sampleGGUF() []byte {
	var b ggufBuilder
	b.Str("general.architecture", "llama")
	b.U32("llama.block_count", 1)
	b.F32("llama.rope.freq_base", 10000)
	b.Bool("tokenizer.ggml.add_bos_token", true)
	b.Strs("tokenizer.ggml.tokens", []string{"a", "b", "<s>"})
	b.I32s("tokenizer.ggml.token_type", []int32{1, 1, 3})
	b.F32s("tokenizer.ggml.scores", []float32{0, -1, -2})
	b.Tensor("w", TypeF32, f32Bytes(1, 2, 3, 4, 5, 6), 3, 2)
	b.Tensor("n", TypeF32, f32Bytes(7), 1)
	return b.Bytes()
}

func TestParseGGUFMetadata(t *testing.T) {
	g, err := ParseGGUF(sampleGGUF())
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := g.String("general.architecture"); !ok || s != "llama" {
		t.Errorf("architecture = %q %v", s, ok)
	}
	if u, ok := g.Uint("llama.block_count"); !ok || u != 1 {
		t.Errorf("block_count = %d %v", u, ok)
	}
	if f, ok := g.Float("llama.rope.freq_base"); !ok || f != 10000 {
		t.Errorf("freq_base = %v %v", f, ok)
	}
	if b, ok := g.Bool("tokenizer.ggml.add_bos_token"); !ok || !b {
		t.Errorf("add_bos = %v %v", b, ok)
	}
	if s, ok := g.Strings("tokenizer.ggml.tokens"); !ok || !reflect.DeepEqual(s, []string{"a", "b", "<s>"}) {
		t.Errorf("tokens = %q %v", s, ok)
	}
	if s, ok := g.Int32s("tokenizer.ggml.token_type"); !ok || !reflect.DeepEqual(s, []int32{1, 1, 3}) {
		t.Errorf("token_type = %v %v", s, ok)
	}
	if s, ok := g.Float32s("tokenizer.ggml.scores"); !ok || !reflect.DeepEqual(s, []float32{0, -1, -2}) {
		t.Errorf("scores = %v %v", s, ok)
	}
	if _, ok := g.String("llama.block_count"); ok {
		t.Error("String on a uint32 key succeeded")
	}
	if _, ok := g.Meta("missing"); ok {
		t.Error("missing key found")
	}
	ti, data, err := g.TensorData("w")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ti.Dims, []uint64{3, 2}) || !bytes.Equal(data, f32Bytes(1, 2, 3, 4, 5, 6)) {
		t.Errorf("w = %v %v", ti.Dims, data)
	}
	_, data, err = g.TensorData("n")
	if err != nil || !bytes.Equal(data, f32Bytes(7)) {
		t.Errorf("n = %v %v", data, err)
	}
	if g.DataOffset%32 != 0 {
		t.Errorf("data offset %d not aligned", g.DataOffset)
	}
}

func TestParseGGUFRejectsCorruption(t *testing.T) {
	good := sampleGGUF()
	cases := map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("GGUX"), good[4:]...),
		"truncated": good[:len(good)-3],
		"header":    good[:20],
	}
	v1 := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(v1[4:], 1)
	cases["version 1"] = v1
	huge := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(huge[8:], 1<<60) // tensor count
	cases["tensor count"] = huge
	hugeKV := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(hugeKV[16:], 1<<40)
	cases["kv count"] = hugeKV
	longKey := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(longKey[24:], 1<<62)
	cases["key length"] = longKey
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseGGUF(b)
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("err = %v, want ErrFormat", err)
			}
		})
	}
}

func TestOpenGGUFSmolLM2(t *testing.T) {
	g, err := OpenGGUF(testenv.SmolLM2(t))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if n, _ := g.Uint("llama.block_count"); n != 30 {
		t.Errorf("block_count = %d", n)
	}
	toks, ok := g.Strings("tokenizer.ggml.tokens")
	if !ok || len(toks) != 49152 || toks[1] != "<|im_start|>" {
		t.Errorf("tokens: %d %v", len(toks), ok)
	}
	if len(g.Tensors()) != 272 {
		t.Errorf("%d tensors", len(g.Tensors()))
	}
	ti, data, err := g.TensorData("token_embd.weight")
	if err != nil || ti.Type != TypeQ8_0 || len(data) != 49152*576/32*34 {
		t.Errorf("token_embd: %v %v %d", ti, err, len(data))
	}
}

func FuzzParseGGUF(f *testing.F) {
	f.Add(sampleGGUF())
	f.Add([]byte("GGUF"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := ParseGGUF(b)
		if err != nil {
			return
		}
		for _, ti := range g.Tensors() {
			if _, ok := ggmlTypes[ti.Type]; !ok {
				continue
			}
			_, data, err := g.TensorData(ti.Name)
			if err != nil || uint64(len(data)) != ti.Size {
				t.Fatalf("tensor %q: %v (%d bytes, want %d)", ti.Name, err, len(data), ti.Size)
			}
		}
	})
}

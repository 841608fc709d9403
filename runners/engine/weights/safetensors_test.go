package weights

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

func stBytes(t testing.TB, tensors []engine.Tensor) []byte {
	var b bytes.Buffer
	if err := WriteSafetensors(&b, tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func sampleTensors() []engine.Tensor {
	return []engine.Tensor{
		{Name: "a.weight", DType: engine.F32, Shape: []int{2, 2}, Data: f32Bytes(1, 2, 3, 4)},
		{Name: "b.weight", DType: engine.BF16, Shape: []int{3}, Data: []byte{0x80, 0x3f, 0, 0x40, 0x40, 0x40}},
		{Name: "c.weight", DType: engine.U32, Shape: []int{1, 1}, Data: []byte{1, 2, 3, 4}},
	}
}

func TestSafetensorsRoundTrip(t *testing.T) {
	f, err := parseSafetensors(stBytes(t, sampleTensors()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range sampleTensors() {
		got, ok := f.tensor(want.Name)
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v", want.Name, got)
		}
	}
	if f.meta["format"] != "pt" {
		t.Errorf("meta %v", f.meta)
	}
}

func TestSafetensorsRejectsCorruption(t *testing.T) {
	good := stBytes(t, sampleTensors())
	hdr := func(js string) []byte {
		b := make([]byte, 8, 8+len(js)+16)
		binary.LittleEndian.PutUint64(b, uint64(len(js)))
		return append(append(b, js...), make([]byte, 16)...)
	}
	cases := map[string][]byte{
		"empty":        nil,
		"huge header":  append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, good[8:]...),
		"truncated":    good[:len(good)-1],
		"bad json":     hdr(`{"a": `),
		"bad dtype":    hdr(`{"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}}`),
		"size":         hdr(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`),
		"outside":      hdr(`{"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}`),
		"reversed":     hdr(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`),
		"negative dim": hdr(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`),
		"overflow":     hdr(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}}`),
		"overlap":      hdr(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := parseSafetensors(b); !errors.Is(err, ErrFormat) {
				t.Fatalf("err = %v, want ErrFormat", err)
			}
		})
	}
}

func writeConfig(t *testing.T, dir, cfg string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenShardedDirWithPerLayerQuant(t *testing.T) {
	dir := t.TempDir()
	ts := []engine.Tensor{
		{Name: "x.weight", DType: engine.U32, Shape: []int{1, 1}, Data: make([]byte, 4)},
		{Name: "x.scales", DType: engine.BF16, Shape: []int{1, 1}, Data: make([]byte, 2)},
		{Name: "x.biases", DType: engine.BF16, Shape: []int{1, 1}, Data: make([]byte, 2)},
		{Name: "y.weight", DType: engine.U32, Shape: []int{1, 1}, Data: make([]byte, 4)},
		{Name: "y.scales", DType: engine.BF16, Shape: []int{1, 1}, Data: make([]byte, 2)},
		{Name: "y.biases", DType: engine.BF16, Shape: []int{1, 1}, Data: make([]byte, 2)},
		{Name: "z.weight", DType: engine.F32, Shape: []int{2}, Data: f32Bytes(5, 6)},
	}
	if err := WriteSafetensorsFile(filepath.Join(dir, "model-00001-of-00002.safetensors"), ts[:4], nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteSafetensorsFile(filepath.Join(dir, "model-00002-of-00002.safetensors"), ts[4:], nil); err != nil {
		t.Fatal(err)
	}
	// A stray file not in the index must be ignored.
	if err := WriteSafetensorsFile(filepath.Join(dir, "stray.safetensors"), ts[6:], nil); err != nil {
		t.Fatal(err)
	}
	index := `{"metadata":{},"weight_map":{`
	for i, x := range ts {
		shard := "model-00001-of-00002.safetensors"
		if i >= 4 {
			shard = "model-00002-of-00002.safetensors"
		}
		if i > 0 {
			index += ","
		}
		index += `"` + x.Name + `":"` + shard + `"`
	}
	index += "}}"
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(index), 0o644); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, dir, `{"quantization":{"group_size":64,"bits":4,"mode":"affine","y":{"group_size":32,"bits":8,"mode":"affine"},"z":false}}`)
	src, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if got := src.Names(); len(got) != 7 {
		t.Errorf("names %v", got)
	}
	if q := src.Quant("x"); q != (engine.QuantSpec{Bits: 4, GroupSize: 64}) {
		t.Errorf("x: %v", q)
	}
	if q := src.Quant("y"); q != (engine.QuantSpec{Bits: 8, GroupSize: 32}) {
		t.Errorf("y: %v", q)
	}
	if q := src.Quant("z"); q.Bits != 0 {
		t.Errorf("z: %v", q)
	}
	z, err := src.Tensor("z.weight")
	if err != nil || !bytes.Equal(z.Data, f32Bytes(5, 6)) {
		t.Errorf("z = %v %v", z, err)
	}
	if _, err := src.Tensor("nope"); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("missing tensor: %v", err)
	}

	// A pipeline stage's download holds only some of the shards the index
	// names: the directory opens with what is there, and a tensor of an
	// absent shard is an error naming the shard (not ErrNotFound, which a
	// loader may read as an optional tensor being absent).
	if err := os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
	part, err := Open(dir)
	if err != nil {
		t.Fatalf("partial shards: %v", err)
	}
	defer part.Close()
	if got := part.Names(); len(got) != 4 {
		t.Errorf("partial names %v", got)
	}
	if _, err := part.Tensor("x.weight"); err != nil {
		t.Errorf("present tensor: %v", err)
	}
	if _, err := part.Tensor("z.weight"); err == nil || errors.Is(err, engine.ErrNotFound) || !strings.Contains(err.Error(), "model-00002-of-00002.safetensors") {
		t.Errorf("tensor of an absent shard: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "model-00001-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil {
		t.Error("a directory holding none of the index's shards opened")
	}
}

func TestOpenDirErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(dir); err == nil {
		t.Error("dir without config.json opened")
	}
	writeConfig(t, dir, `{}`)
	if _, err := Open(dir); err == nil {
		t.Error("dir without safetensors opened")
	}
	ts := sampleTensors()
	WriteSafetensorsFile(filepath.Join(dir, "a.safetensors"), ts, nil)
	WriteSafetensorsFile(filepath.Join(dir, "b.safetensors"), ts[:1], nil)
	if _, err := Open(dir); err == nil {
		t.Error("duplicate tensor across files accepted")
	}
	os.Remove(filepath.Join(dir, "b.safetensors"))
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(`{"weight_map":{"a":"../x.safetensors"}}`), 0o644)
	if _, err := Open(dir); err == nil {
		t.Error("index escaping the directory accepted")
	}
	os.Remove(filepath.Join(dir, "model.safetensors.index.json"))
	// mxfp4 is supported (gpt-oss's experts); nvfp4 and mxfp8 are not.
	for _, q := range []string{`{"bits":"four"}`, `{"bits":4,"group_size":16,"mode":"nvfp4"}`, `{"bits":4,"x":{"bits":4,"mode":"nvfp4"}}`, `{"bits":8,"mode":"mxfp8"}`} {
		writeConfig(t, dir, `{"quantization":`+q+`}`)
		if _, err := Open(dir); err == nil {
			t.Errorf("quantization %s accepted", q)
		}
	}
}

func TestVocabFromTokenizerJSON(t *testing.T) {
	v, err := vocabFromTokenizerJSON([]byte(`{"model":{"vocab":{"a":0,"b":1,"ab":3}},"added_tokens":[{"id":2,"content":"<s>"},{"id":4,"content":"</s>"}]}`))
	if err != nil || !reflect.DeepEqual(v, []string{"a", "b", "<s>", "ab", "</s>"}) {
		t.Errorf("%q %v", v, err)
	}
	v, err = vocabFromTokenizerJSON([]byte(`{"model":{"vocab":[["x",0.0],["y",-1.5]]}}`))
	if err != nil || !reflect.DeepEqual(v, []string{"x", "y"}) {
		t.Errorf("unigram %q %v", v, err)
	}
	if _, err := vocabFromTokenizerJSON([]byte(`{"model":{"vocab":{"a":-1}}}`)); err == nil {
		t.Error("negative id accepted")
	}
}

func FuzzParseSafetensors(f *testing.F) {
	f.Add(stBytes(f, sampleTensors()))
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseSafetensors(b)
		if err != nil {
			return
		}
		for name := range st.entries {
			x, ok := st.tensor(name)
			n := x.DType.Size()
			for _, d := range x.Shape {
				n *= d
			}
			if !ok || n != len(x.Data) {
				t.Fatalf("%s: %d bytes for %v", name, len(x.Data), x.Shape)
			}
		}
	})
}

package modelinfo

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// encodeSafetensors writes a safetensors header for ts (each tensor's data
// from offset 0: the parser reads sizes, not layout).
func encodeSafetensors(ts []Tensor) []byte {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	for _, t := range ts {
		hdr[t.Name] = map[string]any{"dtype": "U8", "shape": []int64{t.Bytes}, "data_offsets": []int64{0, t.Bytes}}
	}
	j, _ := json.Marshal(hdr)
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(j)))
	return append(b, j...)
}

func FuzzParseSafetensorsHeader(f *testing.F) {
	f.Add(encodeSafetensors([]Tensor{{"model.layers.0.mlp.up_proj.weight", 64}, {"lm_head.weight", 8}}))
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, err := ParseSafetensorsHeader(b)
		if err != nil {
			return
		}
		again, err := ParseSafetensorsHeader(encodeSafetensors(ts))
		if err != nil {
			t.Fatalf("re-encoded header refused: %v", err)
		}
		if !slices.Equal(ts, again) {
			t.Fatalf("round trip: %v != %v", again, ts)
		}
	})
}

// encodeGGUF writes a GGUF v3 header with the given integer and string
// metadata and tensors (one dimension, type F32 by name only), then the
// data section (tensor i's data is Bytes long, aligned to 32).
func encodeGGUF(ints map[string]int64, strs map[string]string, ts []Tensor) []byte {
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); b.WriteString(s) }
	le(uint32(0x46554747))
	le(uint32(3))
	le(uint64(len(ts)))
	le(uint64(len(ints) + len(strs) + 1))
	for _, k := range sortedKeys(ints) {
		str(k)
		le(uint32(11))
		le(ints[k])
	}
	for _, k := range sortedKeys(strs) {
		str(k)
		le(uint32(8))
		str(strs[k])
	}
	str("tokenizer.ggml.tokens")
	le(uint32(9))
	le(uint32(8))
	le(uint64(2))
	str("a")
	str("bb")
	var off uint64
	for _, t := range ts {
		str(t.Name)
		le(uint32(1))
		le(uint64(t.Bytes))
		le(uint32(0))
		le(off)
		off += (uint64(t.Bytes) + 31) / 32 * 32
	}
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	b.Write(make([]byte, off))
	return b.Bytes()
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func FuzzParseGGUFHeader(f *testing.F) {
	seed := encodeGGUF(map[string]int64{"llama.block_count": 2, "llama.attention.head_count": 4},
		map[string]string{"general.architecture": "llama"},
		[]Tensor{{"token_embd.weight", 64}, {"blk.0.attn_q.weight", 32}, {"blk.1.attn_q.weight", 32}})
	f.Add(seed)
	f.Add(seed[:40])
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseGGUFHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		var sum int64
		for _, x := range h.Tensors {
			if x.Bytes < 0 {
				t.Fatalf("tensor %s: %d bytes", x.Name, x.Bytes)
			}
			sum += x.Bytes
		}
		if len(h.Tensors) > 0 && h.DataStart+sum > int64(len(b)) {
			t.Fatalf("tensors span %d bytes past data start %d of %d", sum, h.DataStart, len(b))
		}
		_, _ = ggufFacts(h) // must not panic
		// Round trip: what was parsed, written again, parses the same.
		ts := make([]Tensor, len(h.Tensors))
		for i, x := range h.Tensors {
			ts[i] = Tensor{fmt.Sprintf("t%d", i), (x.Bytes + 31) / 32 * 32}
		}
		ints := maps.Clone(h.Ints)
		delete(ints, "general.alignment") // the encoder aligns to 32
		enc := encodeGGUF(ints, h.Strings, ts)
		h2, err := ParseGGUFHeader(bytes.NewReader(enc), int64(len(enc)))
		if err != nil {
			t.Fatalf("re-encoded header refused: %v", err)
		}
		if len(h2.Tensors) != len(ts) {
			t.Fatalf("round trip: %d tensors, want %d", len(h2.Tensors), len(ts))
		}
		for i := range ts {
			if h2.Tensors[i] != ts[i] {
				t.Fatalf("round trip tensor %d: %v, want %v", i, h2.Tensors[i], ts[i])
			}
		}
		for k, v := range ints {
			if h2.Ints[k] != v {
				t.Fatalf("round trip %s = %d, want %d", k, h2.Ints[k], v)
			}
		}
		for k, v := range h.Strings {
			if h2.Strings[k] != v {
				t.Fatalf("round trip %s = %q, want %q", k, h2.Strings[k], v)
			}
		}
	})
}

func TestGGUFSeedFacts(t *testing.T) {
	b := encodeGGUF(map[string]int64{"llama.block_count": 2, "llama.attention.head_count": 4, "llama.embedding_length": 32, "llama.context_length": 128},
		map[string]string{"general.architecture": "llama"},
		[]Tensor{{"token_embd.weight", 64}, {"blk.0.attn_q.weight", 32}, {"blk.1.attn_q.weight", 96}, {"output_norm.weight", 32}})
	h, err := ParseGGUFHeader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := ggufFacts(h)
	if err != nil {
		t.Fatal(err)
	}
	f.Path = "x"
	if err := f.check(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.LayerBytes, []int64{32, 96}) || f.EmbedBytes != 64 || f.NormBytes != 32 || !f.Tied || f.KVHeads != 4 || f.HeadDim != 8 || f.MaxContext != 128 {
		t.Errorf("facts %+v", f)
	}
}

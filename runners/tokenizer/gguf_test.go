package tokenizer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// ggufKV writes a GGUF v3 file holding only metadata (no tensors), for
// tests that need a vocabulary too large to commit.
type ggufKV struct {
	buf bytes.Buffer
	n   int
}

const (
	ggufTUint32  = 4
	ggufTInt32   = 5
	ggufTFloat32 = 6
	ggufTBool    = 7
	ggufTString  = 8
	ggufTArray   = 9
)

func (w *ggufKV) str(s string) {
	binary.Write(&w.buf, binary.LittleEndian, uint64(len(s)))
	w.buf.WriteString(s)
}

func (w *ggufKV) key(k string, typ uint32) {
	w.n++
	w.str(k)
	binary.Write(&w.buf, binary.LittleEndian, typ)
}

func (w *ggufKV) String(k, v string) { w.key(k, ggufTString); w.str(v) }
func (w *ggufKV) Uint32(k string, v uint32) {
	w.key(k, ggufTUint32)
	binary.Write(&w.buf, binary.LittleEndian, v)
}
func (w *ggufKV) Bool(k string, v bool) {
	w.key(k, ggufTBool)
	binary.Write(&w.buf, binary.LittleEndian, v)
}

func (w *ggufKV) Strings(k string, v []string) {
	w.key(k, ggufTArray)
	binary.Write(&w.buf, binary.LittleEndian, uint32(ggufTString))
	binary.Write(&w.buf, binary.LittleEndian, uint64(len(v)))
	for _, s := range v {
		w.str(s)
	}
}

func (w *ggufKV) Float32s(k string, v []float32) {
	w.key(k, ggufTArray)
	binary.Write(&w.buf, binary.LittleEndian, uint32(ggufTFloat32))
	binary.Write(&w.buf, binary.LittleEndian, uint64(len(v)))
	binary.Write(&w.buf, binary.LittleEndian, v)
}

func (w *ggufKV) Int32s(k string, v []int32) {
	w.key(k, ggufTArray)
	binary.Write(&w.buf, binary.LittleEndian, uint32(ggufTInt32))
	binary.Write(&w.buf, binary.LittleEndian, uint64(len(v)))
	binary.Write(&w.buf, binary.LittleEndian, v)
}

func (w *ggufKV) Bytes() []byte {
	var out bytes.Buffer
	out.WriteString("GGUF")
	binary.Write(&out, binary.LittleEndian, uint32(3))
	binary.Write(&out, binary.LittleEndian, uint64(0))
	binary.Write(&out, binary.LittleEndian, uint64(w.n))
	out.Write(w.buf.Bytes())
	return out.Bytes()
}

// gemmaGGUFVocab writes the vocabulary of a Gemma 3 tokenizer.json as
// llama.cpp's convert_hf_to_gguf.py writes Gemma 3's (SentencePiece
// "llama" model, add_space_prefix false): pieces with scores (the
// SentencePiece model's scores order pieces as tokenizer.json's merges do:
// here minus the rank of the merge that makes the piece), types UNKNOWN,
// BYTE and NORMAL from the pieces, then tokenizer_config's added tokens:
// special ones and those that look special (<unused…>, <mask>) CONTROL,
// the rest USER_DEFINED with "▁" written as " " and score -1000.
func gemmaGGUFVocab(t *testing.T, dir string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj tokenizerJSON
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	pairs, err := parseMerges(tj.Model.Merges)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, id := range tj.Model.Vocab {
		n = max(n, int(id)+1)
	}
	tokens := make([]string, n)
	for s, id := range tj.Model.Vocab {
		tokens[id] = s
	}
	rank := make(map[string]int, len(pairs))
	for r, p := range pairs {
		if _, ok := rank[p[0]+p[1]]; !ok {
			rank[p[0]+p[1]] = r
		}
	}
	scores := make([]float32, n)
	types := make([]int32, n)
	for id, s := range tokens {
		scores[id] = -float32(len(pairs) + id)
		if r, ok := rank[s]; ok {
			scores[id] = -float32(r)
		}
		types[id] = ggufNormal
		var b byte
		if len(s) == 6 && strings.HasPrefix(s, "<0x") {
			if _, err := fmt.Sscanf(s, "<0x%02X>", &b); err == nil {
				types[id] = ggufByte
			}
		}
		if tj.Model.UnkToken != nil && s == *tj.Model.UnkToken {
			types[id] = ggufUnknown
		}
	}
	for _, a := range tj.AddedTokens {
		if int(a.ID) >= n {
			continue
		}
		c := a.Content
		if a.Special || c == "<mask>" || strings.HasPrefix(c, "<unused") && strings.HasSuffix(c, ">") ||
			strings.HasPrefix(c, "<|") && strings.HasSuffix(c, "|>") {
			types[a.ID] = ggufControl
		} else {
			types[a.ID] = ggufUserDefined
			c = strings.ReplaceAll(c, spmSpace, " ")
		}
		scores[a.ID] = -1000
		tokens[a.ID] = c
	}
	var w ggufKV
	w.String("general.architecture", "gemma3")
	w.String("tokenizer.ggml.model", "llama")
	w.String("tokenizer.ggml.pre", "default")
	w.Strings("tokenizer.ggml.tokens", tokens)
	w.Float32s("tokenizer.ggml.scores", scores)
	w.Int32s("tokenizer.ggml.token_type", types)
	w.Uint32("tokenizer.ggml.bos_token_id", 2)
	w.Uint32("tokenizer.ggml.eos_token_id", 1)
	w.Uint32("tokenizer.ggml.unknown_token_id", 3)
	w.Uint32("tokenizer.ggml.padding_token_id", 0)
	w.Bool("tokenizer.ggml.add_bos_token", true)
	w.Bool("tokenizer.ggml.add_space_prefix", false)
	return w.Bytes()
}

// TestRealGemma3GGUF: Gemma 3's real vocabulary written as a GGUF
// SentencePiece vocabulary (gemmaGGUFVocab) loads through the GGUF
// SentencePiece path (add_space_prefix false; whitespace runs, "\n\n" and
// HTML tags as user-defined tokens matched in the text; <unused…> as
// control tokens) and tokenizes texts_broad.txt as HF does with Gemma 3's
// tokenizer.json. Left out: texts holding a literal "▁" (the GGUF's
// user-defined tokens are written with spaces, so "▁▁" typed by a user is
// not one, in llama.cpp either) or "[multimodal]" (an added token whose id
// is past the vocabulary the converter writes).
func TestRealGemma3GGUF(t *testing.T) {
	root := os.Getenv("EXO_REAL_TOKENIZERS")
	if root == "" {
		testutil.Missing(t, "set EXO_REAL_TOKENIZERS (see TestRealTokenizersMatchHF)")
	}
	g, err := weights.ParseGGUF(gemmaGGUFVocab(t, filepath.Join(root, "gemma3")))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := fromGGUF(g)
	if err != nil {
		t.Fatal(err)
	}
	f := decodedFixture(t, "testdata/real_gemma3_broad_ids.json")
	compared := 0
	for i, s := range broadTexts(t) {
		if strings.Contains(s, spmSpace) || strings.Contains(s, "[multimodal]") {
			continue
		}
		compared++
		if got := tok.Encode(s); !slices.Equal(got, f.IDs[i]) {
			t.Errorf("text %d %q:\n got %v\nwant %v", i, s, got, f.IDs[i])
		}
		if got := tok.Decode(f.IDs[i]); got != f.Decoded[i] {
			t.Errorf("text %d: Decode %q, HF %q", i, got, f.Decoded[i])
		}
	}
	if compared < 100 {
		t.Fatalf("only %d texts compared", compared)
	}
	if tok.BOS() != 2 || !slices.Contains(tok.EOS(), 1) || !slices.Contains(tok.EOS(), 106) { // <end_of_turn>
		t.Errorf("BOS %d EOS %v", tok.BOS(), tok.EOS())
	}
}

// byteLevelGGUFVocab writes the vocabulary of a byte-level tokenizer.json
// as convert_hf_to_gguf.py writes a "gpt2" GGUF vocabulary: tokens by id
// (gaps as [PADn], UNUSED), merges as "a b", added special tokens CONTROL
// and other added tokens USER_DEFINED, with tokenizer.ggml.pre pre.
func byteLevelGGUFVocab(t *testing.T, dir, pre string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj tokenizerJSON
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	pairs, err := parseMerges(tj.Model.Merges)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, id := range tj.Model.Vocab {
		n = max(n, int(id)+1)
	}
	for _, a := range tj.AddedTokens {
		n = max(n, int(a.ID)+1)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	for i := range tokens {
		tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), ggufUnused
	}
	for s, id := range tj.Model.Vocab {
		tokens[id], types[id] = s, ggufNormal
	}
	for _, a := range tj.AddedTokens {
		tokens[a.ID], types[a.ID] = a.Content, ggufUserDefined
		if a.Special {
			types[a.ID] = ggufControl
		}
	}
	merges := make([]string, len(pairs))
	for i, p := range pairs {
		merges[i] = p[0] + " " + p[1]
	}
	var w ggufKV
	w.String("general.architecture", "gpt-oss")
	w.String("tokenizer.ggml.model", "gpt2")
	w.String("tokenizer.ggml.pre", pre)
	w.Strings("tokenizer.ggml.tokens", tokens)
	w.Int32s("tokenizer.ggml.token_type", types)
	w.Strings("tokenizer.ggml.merges", merges)
	w.Uint32("tokenizer.ggml.eos_token_id", 199999)
	w.Bool("tokenizer.ggml.add_bos_token", false)
	return w.Bytes()
}

// TestRealO200kGGUF: GPT-4o's real vocabulary as a GGUF byte-level
// vocabulary with tokenizer.ggml.pre "gpt-4o" (llama.cpp's name for the
// o200k split, used by gpt-oss GGUFs) tokenizes texts_broad.txt as HF does
// with GPT-4o's tokenizer.json. (gpt-oss's own tokenizer.json sets
// ignore_merges, which llama.cpp does not apply to "gpt-4o"; GPT-4o's does
// not, so the two agree exactly.)
func TestRealO200kGGUF(t *testing.T) {
	root := os.Getenv("EXO_REAL_TOKENIZERS")
	if root == "" {
		testutil.Missing(t, "set EXO_REAL_TOKENIZERS (see TestRealTokenizersMatchHF)")
	}
	g, err := weights.ParseGGUF(byteLevelGGUFVocab(t, filepath.Join(root, "gpt4o"), "gpt-4o"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := fromGGUF(g)
	if err != nil {
		t.Fatal(err)
	}
	f := decodedFixture(t, "testdata/real_gpt4o_broad_ids.json")
	for i, s := range broadTexts(t) {
		if got := tok.Encode(s); !slices.Equal(got, f.IDs[i]) {
			t.Errorf("text %d %q:\n got %v\nwant %v", i, s, got, f.IDs[i])
		}
		if got := tok.Decode(f.IDs[i]); got != f.Decoded[i] {
			t.Errorf("text %d: Decode %q, HF %q", i, got, f.Decoded[i])
		}
	}
}

package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// FuzzTokenizerJSON feeds arbitrary tokenizer.json bytes to the loader: it
// must return an error or a tokenizer that encodes and decodes without
// panicking.
func FuzzTokenizerJSON(f *testing.F) {
	// Small seeds, one per kind of tokenizer: the coverage-guided fuzzer
	// slows to a few executions a minute on the 40 KB tokenizer.json files
	// of testdata (which the unit tests load as they are).
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel"},"added_tokens":[{"id":3,"content":"<x>","special":true}]}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3},"merges":[["a","b"]],"ignore_merges":true},"normalizer":{"type":"NFC"},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"` + strings.ReplaceAll(strings.ReplaceAll(patternLlama3, `\`, `\\`), `"`, `\"`) + `"},"behavior":"Isolated"},{"type":"Digits","individual_digits":true},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]}}`))
	f.Add([]byte(`{"model":{"vocab":{"a":-1}}}`))
	var bytes strings.Builder
	for b := range 256 {
		fmt.Fprintf(&bytes, `,"<0x%02X>":%d`, b, 10+b)
	}
	f.Add([]byte(`{"model":{"type":"BPE","byte_fallback":true,"fuse_unk":true,"unk_token":"u","vocab":{"u":0,"▁":1,"a":2,"▁a":3` + bytes.String() + `},"merges":["▁ a"]},"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},"added_tokens":[{"id":1,"content":"<s>","special":true}]}`))
	f.Add([]byte(`{"model":{"type":"BPE","byte_fallback":true,"unk_token":"u","vocab":{"u":0,"▁":1,"a":2,"▁a":3` + bytes.String() + `},"merges":["▁ a"]},"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true},"decoder":{"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Metaspace","replacement":"▁","prepend_scheme":"first"}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var tj tokenizerJSON
		if json.Unmarshal(b, &tj) != nil || hasForeignRegex(tj.PreTokenizer) {
			return
		}
		tok, err := fromHF(&tj, &tokenizerConfig{}, nil)
		if err != nil {
			return
		}
		exercise(tok, "Hello <x> wörld 123 <|im_start|>\n\t 😀")
	})
}

// hasForeignRegex reports a Split pattern other than the hand-written
// ones: those run on regexp2, whose backtracking a mutated pattern can make
// take its whole 10 s match timeout per call. regexp2 itself is not what
// this target tests.
func hasForeignRegex(c *component) bool {
	if c == nil {
		return false
	}
	if c.Type == "Split" && c.Pattern != nil && c.Pattern.Regex != nil {
		if sp, err := splitterForPattern(*c.Pattern.Regex); err == nil {
			if _, ok := sp.(lookaheadSplit); ok {
				return true
			}
		}
	}
	for _, p := range c.Pretokenizers {
		if hasForeignRegex(p) {
			return true
		}
	}
	return false
}

// FuzzGGUFTokenizer feeds mutated GGUF files (byte-level and SentencePiece
// vocabularies) to the GGUF tokenizer loader: an error or a tokenizer that
// encodes and decodes without panicking.
func FuzzGGUFTokenizer(f *testing.F) {
	for _, p := range []string{"testdata/spm_small.gguf", "testdata/spm_bytes.gguf"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := weights.ParseGGUF(b)
		if err != nil {
			return
		}
		tok, err := fromGGUF(g)
		if err != nil {
			return
		}
		exercise(tok, "Hello </s> wörld 123 <|im_start|>\n\t 😀 \xff")
	})
}

// exercise encodes text and decodes the ids (plus out-of-range ones) both
// ways: a fuzzed tokenizer must do all of it without panicking.
func exercise(tok *Tokenizer, text string) {
	ids := tok.Encode(text)
	_ = tok.Decode(append(ids, -1, 1<<30))
	d := tok.NewStreamDecoder()
	for _, id := range ids {
		d.Add(id)
	}
	d.Flush()
}

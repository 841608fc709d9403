package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

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
	// Split behaviors (Gemma 3's MergedWithPrevious on a literal, GPT-4o's
	// o200k regex as Removed with invert, and the others)
	f.Add([]byte(`{"model":{"type":"BPE","byte_fallback":true,"fuse_unk":true,"unk_token":"u","vocab":{"u":0,"▁":1,"a":2,"▁a":3,"▁▁":4` + bytes.String() + `},"merges":["▁ a","▁ ▁"]},"normalizer":{"type":"Replace","pattern":{"String":" "},"content":"▁"},"pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"MergedWithPrevious","invert":false},"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"}]},"added_tokens":[{"id":4,"content":"▁▁","special":false},{"id":5,"content":"<bos>","special":true}]}`))
	o200k := strings.ReplaceAll(strings.ReplaceAll(patternO200k, `\`, `\\`), `"`, `\"`)
	for _, beh := range []string{"Removed", "Isolated", "MergedWithNext", "Contiguous"} {
		f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3},"merges":[["a","b"]]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"` + o200k + `"},"behavior":"` + beh + `","invert":true},{"type":"Split","pattern":{"String":"b"},"behavior":"` + beh + `","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]}}`))
	}
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

// FuzzGGUFTokenizer feeds mutated GGUF files (SentencePiece vocabularies,
// and byte-level ones with the o200k and DeepSeek V3 splits) to the GGUF
// tokenizer loader: an error or a tokenizer that encodes and decodes
// without panicking.
func FuzzGGUFTokenizer(f *testing.F) {
	for _, p := range []string{"testdata/spm_small.gguf", "testdata/spm_bytes.gguf"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// small byte-level vocabularies with the o200k and DeepSeek V3 splits
	for _, pre := range []string{"gpt-4o", "deepseek-v3"} {
		var w ggufKV
		w.String("tokenizer.ggml.model", "gpt2")
		w.String("tokenizer.ggml.pre", pre)
		w.Strings("tokenizer.ggml.tokens", []string{"a", "b", "ab", "Ġ", "<|endoftext|>", "<unk>"})
		w.Int32s("tokenizer.ggml.token_type", []int32{1, 1, 1, 1, 3, 2})
		w.Strings("tokenizer.ggml.merges", []string{"a b"})
		w.Uint32("tokenizer.ggml.eos_token_id", 4)
		f.Add(w.Bytes())
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

// FuzzPatternSplit checks HF's Split behaviors on arbitrary text, with a
// literal and with the hand-written o200k matcher: pieces are non-empty,
// in order and without overlap; every behavior but Removed covers the text
// exactly; Removed keeps exactly the bytes that are not (with invert: that
// are) matches.
func FuzzPatternSplit(f *testing.F) {
	f.Add("a b  c", " ")
	f.Add("Hello, World's 123!\n\n  x", "l")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, s, lit string) {
		for _, m := range []matcher{stringSplit(lit), o200kSplit{}} {
			covered := make([]bool, len(s)) // match bytes
			m.find(s, func(a, b int) {
				for i := a; i < b; i++ {
					covered[i] = true
				}
			})
			for beh := isolated; beh <= contiguous; beh++ {
				for _, inv := range []bool{false, true} {
					var got strings.Builder
					pos := 0 // pieces are substrings in order: find each after the last
					patternSplit{m: m, behavior: beh, invert: inv}.split(s, func(p string) {
						if p == "" {
							t.Fatalf("%v/%v: empty piece", beh, inv)
						}
						i := strings.Index(s[pos:], p)
						if i < 0 {
							t.Fatalf("%v/%v: piece %q not after offset %d of %q", beh, inv, p, pos, s)
						}
						pos += i + len(p)
						got.WriteString(p)
					})
					want := s
					if beh == removed {
						var k strings.Builder
						for i := range len(s) {
							if covered[i] == inv {
								k.WriteByte(s[i])
							}
						}
						want = k.String()
					}
					if got.String() != want {
						t.Fatalf("%T %v invert %v on %q: pieces join to %q, want %q", m, beh, inv, s, got.String(), want)
					}
				}
			}
		}
	})
}

// FuzzLossyUTF8: appendLossy gives valid UTF-8, leaves valid input as it is,
// writes at most one U+FFFD per invalid byte, and a byte-level stream
// decode (which cuts the bytes at token boundaries) gives the same text.
func FuzzLossyUTF8(f *testing.F) {
	f.Add([]byte("a\xe2\x82\xac\xf0\x9f\x98"), uint8(2))
	f.Add([]byte("\xed\xa0\x80\xc0\xaf"), uint8(1))
	tok, err := Load("testdata/tiny_llama3")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		got := appendLossy(nil, b)
		if !utf8.Valid(got) {
			t.Fatalf("%x: %q not valid UTF-8", b, got)
		}
		if utf8.Valid(b) && string(got) != string(b) {
			t.Fatalf("%x: valid input changed to %q", b, got)
		}
		if n := strings.Count(string(got), "\uFFFD") - strings.Count(string(b), "\uFFFD"); n > len(b) {
			t.Fatalf("%x: %d replacements", b, n)
		}
		// byte tokens, grouped k at a time, through the stream decoder
		k := int(cut%4) + 1
		d := tok.NewStreamDecoder()
		var sb strings.Builder
		for i := 0; i < len(b); i += k {
			for _, x := range b[i:min(i+k, len(b))] {
				sb.WriteString(d.Add(tok.model.vocab[string(tok.model.b2r[x])]))
			}
		}
		sb.WriteString(d.Flush())
		if sb.String() != string(got) {
			t.Fatalf("%x: stream %q, whole %q", b, sb.String(), got)
		}
	})
}

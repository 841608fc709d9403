package tokenizer

import (
	"encoding/json"
	"os"
	"testing"
)

// FuzzTokenizerJSON feeds arbitrary tokenizer.json bytes to the loader: it
// must return an error or a tokenizer that encodes and decodes without
// panicking.
func FuzzTokenizerJSON(f *testing.F) {
	for _, p := range []string{"testdata/tiny_llama3/tokenizer.json", "testdata/tiny_qwen2/tokenizer.json", "testdata/tiny_spm/tokenizer.json"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel"},"added_tokens":[{"id":3,"content":"<x>","special":true}]}`))
	f.Add([]byte(`{"model":{"vocab":{"a":-1}}}`))
	f.Add([]byte(`{"model":{"type":"BPE","byte_fallback":true,"fuse_unk":true,"unk_token":"u","vocab":{"u":0,"▁":1,"a":2,"▁a":3},"merges":["▁ a"]},"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var tj tokenizerJSON
		if json.Unmarshal(b, &tj) != nil {
			return
		}
		tok, err := fromHF(&tj, &tokenizerConfig{}, nil)
		if err != nil {
			return
		}
		ids := tok.Encode("Hello <x> wörld 123 <|im_start|>\n\t 😀")
		_ = tok.Decode(append(ids, -1, 1<<30))
		d := tok.NewStreamDecoder()
		for _, id := range ids {
			d.Add(id)
		}
		d.Flush()
	})
}

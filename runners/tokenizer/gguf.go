package tokenizer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// GGUF token types (tokenizer.ggml.token_type).
const (
	ggufNormal      = 1
	ggufUnknown     = 2
	ggufControl     = 3
	ggufUserDefined = 4
	ggufUnused      = 5
	ggufByte        = 6
)

// ggufPre maps tokenizer.ggml.pre (llama.cpp's names) to our splitters.
func ggufPre(pre string) (steps []splitter, normalizeNFC, llama3 bool, err error) {
	switch pre {
	case "llama-bpe", "llama3", "smaug-bpe", "falcon3", "pixtral":
		return []splitter{regexSplit{llama3: true, maxDigits: 3}}, false, true, nil
	case "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez":
		return []splitter{regexSplit{llama3: true, maxDigits: 1}}, true, false, nil
	case "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b":
		return []splitter{digitSplit{individual: true}, regexSplit{}}, false, false, nil
	case "gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion", "default", "":
		return []splitter{regexSplit{}}, false, false, nil
	case "gpt-4o", "llama4": // o200k (gpt-oss, GPT-4o); llama.cpp does not ignore merges here
		return []splitter{o200kSplit{}}, false, false, nil
	case "deepseek-v3":
		for _, p := range deepSeekV3Patterns {
			sp, err := splitterForPattern(p)
			if err != nil {
				return nil, false, false, err
			}
			steps = append(steps, sp)
		}
		return steps, false, false, nil
	}
	return nil, false, false, fmt.Errorf("tokenizer.ggml.pre %q is not supported", pre)
}

// deepSeekV3Patterns are the Split patterns of DeepSeek V3's
// tokenizer.json, in order (llama.cpp's "deepseek-v3" pre-tokenizer).
var deepSeekV3Patterns = []string{
	`\p{N}{1,3}`,
	`[一-龥぀-ゟ゠-ヿ]+`,
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
}

func loadGGUF(path string) (*Tokenizer, error) {
	g, err := weights.OpenGGUF(path)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return fromGGUF(g)
}

// fromGGUF builds a tokenizer from GGUF metadata (tokenizer.ggml.*).
func fromGGUF(g *weights.GGUF) (*Tokenizer, error) {
	switch m, _ := g.String("tokenizer.ggml.model"); m {
	case "gpt2":
	case "llama":
		return fromGGUFSPM(g)
	default:
		return nil, fmt.Errorf("tokenizer.ggml.model %q: only byte-level BPE (\"gpt2\") and SentencePiece (\"llama\") vocabularies are supported", m)
	}
	tokens, ok := g.Strings("tokenizer.ggml.tokens")
	if !ok || len(tokens) == 0 {
		return nil, fmt.Errorf("tokenizer.ggml.tokens missing")
	}
	merges, ok := g.Strings("tokenizer.ggml.merges")
	if !ok {
		return nil, fmt.Errorf("tokenizer.ggml.merges missing")
	}
	types, ok := g.Int32s("tokenizer.ggml.token_type")
	if !ok {
		types = nil
	} else if len(types) != len(tokens) {
		return nil, fmt.Errorf("tokenizer.ggml.token_type has %d entries for %d tokens", len(types), len(tokens))
	}
	pre, _ := g.String("tokenizer.ggml.pre")
	steps, nfc, llama3, err := ggufPre(pre)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{bos: -1, pretok: steps}
	if nfc {
		f, _ := normalizerFunc("NFC")
		t.normalizers = append(t.normalizers, f)
	}
	t.model.ignoreMerges = llama3
	t.model.unk = -1
	t.model.vocab = make(map[string]int32, len(tokens))
	t.idToToken = make([]string, len(tokens))
	for i, s := range tokens {
		t.idToToken[i] = s
		typ := int32(ggufNormal)
		if types != nil {
			typ = types[i]
		}
		if typ == ggufControl || typ == ggufUserDefined || typ == ggufUnknown {
			t.added = append(t.added, addedToken{content: s, id: int32(i), special: typ != ggufUserDefined})
			continue
		}
		if _, dup := t.model.vocab[s]; !dup {
			t.model.vocab[s] = int32(i)
		}
	}
	t.model.merges = make(map[uint64]merge, len(merges))
	for rank, m := range merges {
		a, b, ok := strings.Cut(m, " ")
		if !ok {
			return nil, fmt.Errorf("tokenizer.ggml.merges[%d]: %q is not a pair", rank, m)
		}
		if err := t.addMerge(int32(rank), a, b); err != nil {
			return nil, fmt.Errorf("tokenizer.ggml.merges[%d]: %w", rank, err)
		}
	}
	t.setGGUFSpecials(g, len(tokens), llama3)
	return t, nil
}

// setGGUFSpecials reads the BOS and end-of-generation ids and
// add_bos_token (default addBOS) from GGUF metadata, then finishes t. (The
// unknown id matters only to SentencePiece vocabularies: in a byte-level
// one, a byte without a token is dropped, as llama.cpp and HF drop it;
// SmolLM2's unknown_token_id is <|endoftext|>.)
func (t *Tokenizer) setGGUFSpecials(g *weights.GGUF, n int, addBOS bool) {
	id := func(key string) (int32, bool) {
		u, ok := g.Uint(key)
		if !ok || u >= uint64(n) {
			return 0, false
		}
		return int32(u), true
	}
	if b, ok := id("tokenizer.ggml.bos_token_id"); ok {
		t.bos = b
	}
	t.addBOS = addBOS
	if b, ok := g.Bool("tokenizer.ggml.add_bos_token"); ok {
		t.addBOS = b
	}
	for _, k := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		if e, ok := id(k); ok {
			t.eos = append(t.eos, e)
		}
	}
	t.addEndOfTurnTokens()
}

// fromGGUFSPM builds a tokenizer from a SentencePiece GGUF vocabulary
// (tokenizer.ggml.model "llama": Llama 2, Mistral, TinyLlama), as llama.cpp
// tokenizes it: spaces become "▁", a "▁" starts the text and every section
// after a special token (add_space_prefix, default on), adjacent symbols
// merge into the vocabulary piece with the highest score first (leftmost
// on ties), and characters outside the vocabulary become <0xXX> byte
// tokens. Merges are derived from the pieces: every split of a piece into
// two pieces is a merge ranked by the whole piece's score.
func fromGGUFSPM(g *weights.GGUF) (*Tokenizer, error) {
	tokens, ok := g.Strings("tokenizer.ggml.tokens")
	if !ok || len(tokens) == 0 {
		return nil, fmt.Errorf("tokenizer.ggml.tokens missing")
	}
	scores, ok := g.Float32s("tokenizer.ggml.scores")
	if !ok || len(scores) != len(tokens) {
		return nil, fmt.Errorf("tokenizer.ggml.scores missing or not one per token")
	}
	types, ok := g.Int32s("tokenizer.ggml.token_type")
	if !ok || len(types) != len(tokens) {
		return nil, fmt.Errorf("tokenizer.ggml.token_type missing or not one per token")
	}
	t := &Tokenizer{bos: -1, spm: true}
	t.model.spm, t.model.unk = true, -1
	t.model.vocab = make(map[string]int32, len(tokens))
	t.idToToken = slices.Clone(tokens)
	t.model.byteOfID = make(map[int32]byte, 256)
	for i, s := range tokens {
		id := int32(i)
		switch types[i] {
		case ggufNormal:
			if _, dup := t.model.vocab[s]; !dup {
				t.model.vocab[s] = id
			}
		case ggufUnknown:
			// also matched when written in the text, as llama.cpp (its
			// special-token cache holds UNKNOWN tokens) and HF (<unk> is
			// an added special token) do
			t.model.unk = id
			t.added = append(t.added, addedToken{content: s, id: id, special: true})
		case ggufControl, ggufUserDefined:
			t.added = append(t.added, addedToken{content: s, id: id, special: types[i] == ggufControl})
		case ggufByte:
			var b byte
			if n, err := fmt.Sscanf(s, "<0x%02X>", &b); err != nil || n != 1 || len(s) != 6 {
				return nil, fmt.Errorf("byte token %d is %q, not <0xXX>", i, s)
			}
			t.model.byteIDs[b], t.model.byteOfID[id] = id, b
		}
	}
	t.model.byteFallback = len(t.model.byteOfID) == 256
	// Rank the pieces by score (highest first; ties: lower id), and make
	// every split of a piece into two pieces a merge of that rank.
	order := make([]int32, 0, len(t.model.vocab))
	for _, id := range t.model.vocab {
		order = append(order, id)
	}
	slices.SortFunc(order, func(a, b int32) int {
		if scores[a] != scores[b] {
			if scores[a] > scores[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	t.model.merges = make(map[uint64]merge)
	for rank, id := range order {
		s := tokens[id]
		for i := range s {
			if i == 0 {
				continue
			}
			a, okA := t.model.vocab[s[:i]]
			b, okB := t.model.vocab[s[i:]]
			if okA && okB {
				t.model.merges[pairKey(a, b)] = merge{rank: int32(rank), id: id}
			}
		}
	}
	addPrefix := true
	if v, ok := g.Bool("tokenizer.ggml.add_space_prefix"); ok {
		addPrefix = v
	}
	if addPrefix {
		t.normalizers = append(t.normalizers, func(s string) string { return " " + s })
		t.stripLeading = 1
	}
	t.normalizers = append(t.normalizers, func(s string) string { return strings.ReplaceAll(s, " ", spmSpace) })
	if u, ok := g.Uint("tokenizer.ggml.unknown_token_id"); ok && u < uint64(len(tokens)) {
		t.model.unk = int32(u)
	}
	t.setGGUFSpecials(g, len(tokens), true) // BOS: llama.cpp's default for SentencePiece
	return t, nil
}

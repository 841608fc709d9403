// Package tokenizer owns text ↔ token-id conversion for byte-level BPE
// models (Llama 3, Qwen2/3, SmolLM2, GPT-2 family): HF tokenizer.json (+
// tokenizer_config.json, generation_config.json) and GGUF vocabularies
// (tokenizer.ggml.model "gpt2"); and for SentencePiece-style BPE (Llama 2,
// Mistral, TinyLlama: "▁" for spaces, merges over characters, <0xXX> byte
// fallback) from tokenizer.json (Prepend/Replace normalizers or Metaspace)
// and from GGUF SentencePiece vocabularies (tokenizer.ggml.model "llama":
// pieces with scores, tokenized as llama.cpp does). It implements normalizers (NFC/NFD/NFKC/
// NFKD, lowercase), the pre-tokenizer split patterns by hand (GPT-2, Llama 3,
// Qwen2; Go's regexp lacks the lookahead they use; other patterns run on
// github.com/dlclark/regexp2), individual digits (SmolLM2), byte-level
// mapping, merges by rank (with Llama 3's ignore_merges), added/special
// tokens matched in the text before BPE, and a byte-level decoder with a
// streaming variant that never splits a UTF-8 rune.
//
// BOS: prepended when tokenizer_config.json's add_bos_token (or GGUF
// tokenizer.ggml.add_bos_token) says so, else when tokenizer.json's
// post-processor template starts with it (Llama 3), and never when the text
// already starts with it (chat templates write bos_token themselves). EOS:
// eos_token, generation_config.json's eos_token_id, GGUF eos/eot/eom ids,
// and the special end-of-turn tokens present (<|im_end|>, <|eot_id|>, …).
//
// It owns no model weights and must not import the engine's compute code;
// it reads GGUF metadata through runners/engine/weights.
package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/exo-pd/exo-pd/runners/engine/weights"
)

// Tokenizer encodes and decodes text. It is safe for concurrent use.
type Tokenizer struct {
	model     bpe
	idToToken []string // byte-level token strings (for added tokens: their content)
	r2b       map[rune]byte

	added    []addedToken       // matched in text before BPE
	addedIdx map[byte][]int     // first byte → indexes into added, longest first
	addedID  map[int32]struct{} // ids whose text is literal (decoded as is)
	special  map[int32]struct{} // IsSpecial

	normalizers []func(string) string
	pretok      []splitter
	prefixSpace bool // ByteLevel add_prefix_space

	// SentencePiece-style BPE (spm): token strings are text with "▁" for
	// spaces, bytes appear only as <0xXX> fallback tokens, and decoding
	// drops stripLeading leading spaces (the one the encoder prepended).
	spm          bool
	metaspace    *metaspace // Metaspace pre-tokenizer, if any
	stripLeading int

	bos    int32 // -1: none
	addBOS bool
	eos    []int32
}

// spmSpace is SentencePiece's visible space.
const spmSpace = "▁"

// metaspace is the Metaspace pre-tokenizer: spaces become "▁", a "▁" is
// prepended (always, only to the text's first segment, or never), and with
// split each "▁" starts a new piece.
type metaspace struct {
	prepend string // "always", "first" or "never"
	split   bool
}

type addedToken struct {
	content      string
	id           int32
	lstrip       bool
	rstrip       bool
	singleWord   bool
	special      bool
	isNormalized bool
}

// Load reads a tokenizer from a model directory (tokenizer.json +
// tokenizer_config.json [+ generation_config.json]), a tokenizer.json file, or
// a .gguf file.
func Load(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if !st.IsDir() {
		if strings.HasSuffix(strings.ToLower(path), ".gguf") || weights.IsGGUF(path) {
			t, err := loadGGUF(path)
			if err != nil {
				return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
			}
			return t, nil
		}
		path = filepath.Dir(path)
	}
	t, err := loadHFDir(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return t, nil
}

// newTokenizer fills the derived tables once vocab, merges and added tokens
// are known.
func (t *Tokenizer) finish() {
	t.model.b2r, t.r2b = byteLevelTables()
	t.model.cache = newLRU(1 << 15)
	t.addedIdx = make(map[byte][]int)
	t.addedID = make(map[int32]struct{})
	t.special = make(map[int32]struct{})
	for i, a := range t.added {
		if a.content == "" {
			continue
		}
		t.addedIdx[a.content[0]] = append(t.addedIdx[a.content[0]], i)
		t.addedID[a.id] = struct{}{}
		if a.special {
			t.special[a.id] = struct{}{}
		}
		for int(a.id) >= len(t.idToToken) {
			t.idToToken = append(t.idToToken, "")
		}
		t.idToToken[a.id] = a.content
	}
	for _, idx := range t.addedIdx {
		slices.SortStableFunc(idx, func(a, b int) int { return len(t.added[b].content) - len(t.added[a].content) })
	}
	slices.Sort(t.eos)
	t.eos = slices.Compact(t.eos)
}

// VocabSize is one more than the largest token id.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// EOS returns every id that ends generation (sorted).
func (t *Tokenizer) EOS() []int32 { return slices.Clone(t.eos) }

// BOS returns the beginning-of-sequence id, or -1.
func (t *Tokenizer) BOS() int32 { return t.bos }

// IsSpecial reports whether id is a special (control) token.
func (t *Tokenizer) IsSpecial(id int32) bool {
	_, ok := t.special[id]
	return ok
}

// Token returns the vocabulary string of id (byte-level form for ordinary
// tokens), or "" when out of range.
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.idToToken) {
		return ""
	}
	return t.idToToken[id]
}

// Encode tokenizes text. Added and special tokens written in the text
// ("<|im_start|>") become their ids. BOS is prepended only when the model's
// configuration asks for it and the text does not already start with it.
func (t *Tokenizer) Encode(text string) []int32 {
	ids := make([]int32, 0, len(text)/3+2)
	if t.addBOS && t.bos >= 0 && !strings.HasPrefix(text, t.Token(t.bos)) {
		ids = append(ids, t.bos)
	}
	start := 0 // start of the pending ordinary text
	for i := 0; i < len(text); {
		a, ok := t.matchAdded(text, i)
		if !ok {
			i++
			continue
		}
		end := i
		if a.lstrip {
			end = start + len(strings.TrimRightFunc(text[start:i], unicode.IsSpace))
		}
		ids = t.encodeOrdinary(ids, text[start:end], start == 0)
		ids = append(ids, a.id)
		i += len(a.content)
		if a.rstrip {
			i = len(text) - len(strings.TrimLeftFunc(text[i:], unicode.IsSpace))
		}
		start = i
	}
	return t.encodeOrdinary(ids, text[start:], start == 0)
}

// matchAdded returns the longest added token that starts at text[i].
func (t *Tokenizer) matchAdded(text string, i int) (addedToken, bool) {
	for _, k := range t.addedIdx[text[i]] {
		a := t.added[k]
		if !strings.HasPrefix(text[i:], a.content) {
			continue
		}
		if a.singleWord && (isWordBefore(text, i) || isWordAfter(text, i+len(a.content))) {
			continue
		}
		return a, true
	}
	return addedToken{}, false
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func isWordBefore(s string, i int) bool {
	if i == 0 {
		return false
	}
	r, _ := utf8.DecodeLastRuneInString(s[:i])
	return isWordRune(r)
}

func isWordAfter(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	r, _ := utf8.DecodeRuneInString(s[i:])
	return isWordRune(r)
}

// encodeOrdinary runs normalizers, pre-tokenizers and BPE on text without
// added tokens; first says the text begins the input.
func (t *Tokenizer) encodeOrdinary(dst []int32, text string, first bool) []int32 {
	if text == "" {
		return dst
	}
	for _, n := range t.normalizers {
		text = n(text)
	}
	if t.prefixSpace && !strings.HasPrefix(text, " ") {
		text = " " + text
	}
	pieces := []string{text}
	if ms := t.metaspace; ms != nil {
		text = strings.ReplaceAll(text, " ", spmSpace)
		if (ms.prepend == "always" || ms.prepend == "first" && first) && !strings.HasPrefix(text, spmSpace) {
			text = spmSpace + text
		}
		pieces = []string{text}
		if ms.split {
			pieces = pieces[:0]
			for len(text) > 0 {
				i := strings.Index(text[1:], spmSpace)
				if i < 0 {
					pieces = append(pieces, text)
					break
				}
				pieces = append(pieces, text[:i+1])
				text = text[i+1:]
			}
		}
	}
	var next []string
	for _, sp := range t.pretok {
		next = next[:0]
		for _, p := range pieces {
			sp.split(p, func(s string) { next = append(next, s) })
		}
		pieces, next = next, pieces
	}
	for _, p := range pieces {
		dst = t.model.appendWord(dst, p)
	}
	return dst
}

// Decode turns ids back into text: ordinary tokens through the byte-level
// map, added and special tokens as their literal text. Out-of-range ids are
// skipped. The bytes are returned as is (Decode(Encode(s)) == s for any
// valid UTF-8 s the normalizers leave unchanged).
func (t *Tokenizer) Decode(ids []int32) string {
	var b []byte
	for _, id := range ids {
		b = t.appendBytes(b, id)
	}
	for range t.stripLeading {
		if len(b) == 0 || b[0] != ' ' {
			break
		}
		b = b[1:]
	}
	return string(b)
}

func (t *Tokenizer) appendBytes(b []byte, id int32) []byte {
	if id < 0 || int(id) >= len(t.idToToken) {
		return b
	}
	s := t.idToToken[id]
	if _, ok := t.addedID[id]; ok {
		return append(b, s...)
	}
	if t.spm {
		if c, ok := t.model.byteOf(id); ok {
			return append(b, c)
		}
		return append(b, strings.ReplaceAll(s, spmSpace, " ")...)
	}
	for _, r := range s {
		if c, ok := t.r2b[r]; ok {
			b = append(b, c)
		} else {
			b = utf8.AppendRune(b, r)
		}
	}
	return b
}

// StreamDecoder turns ids into text incrementally; it holds back the bytes
// of a UTF-8 sequence that a later token completes.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte
	started bool // text has been returned (leading spaces are stripped once)
}

// NewStreamDecoder returns a decoder for one generation stream.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// Add appends one token and returns the text it completes (possibly "").
func (d *StreamDecoder) Add(id int32) string {
	d.pending = d.t.appendBytes(d.pending, id)
	n := completePrefix(d.pending)
	out := d.pending[:n]
	if !d.started && n > 0 {
		d.started = true
		for k := 0; k < d.t.stripLeading && len(out) > 0 && out[0] == ' '; k++ {
			out = out[1:]
		}
	}
	s := string(out)
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return s
}

// Flush returns whatever is held back (an incomplete sequence at the end
// of the stream) and resets the decoder.
func (d *StreamDecoder) Flush() string {
	out := d.pending
	if !d.started {
		for k := 0; k < d.t.stripLeading && len(out) > 0 && out[0] == ' '; k++ {
			out = out[1:]
		}
	}
	s := string(out)
	d.pending, d.started = d.pending[:0], false
	return s
}

// completePrefix returns the length of b without a trailing incomplete (but
// so far valid) UTF-8 sequence.
func completePrefix(b []byte) int {
	for k := 1; k <= 3 && k <= len(b); k++ {
		c := b[len(b)-k]
		if c < 0x80 {
			return len(b)
		}
		if c >= 0xC0 { // leading byte
			if !utf8.FullRune(b[len(b)-k:]) {
				return len(b) - k
			}
			return len(b)
		}
	}
	return len(b)
}

// normalizer functions by HF name.
func normalizerFunc(kind string) (func(string) string, bool) {
	switch kind {
	case "NFC":
		return norm.NFC.String, true
	case "NFD":
		return norm.NFD.String, true
	case "NFKC":
		return norm.NFKC.String, true
	case "NFKD":
		return norm.NFKD.String, true
	case "Lowercase":
		return strings.ToLower, true
	}
	return nil, false
}

// TokenBytes returns the bytes one token stands for (as Decode would give
// it within a text, without stripping a leading space); nil when out of
// range. A byte-level token may hold part of a UTF-8 sequence.
func (t *Tokenizer) TokenBytes(id int32) []byte { return t.appendBytes(nil, id) }

// Package tokenizer owns text ↔ token-id conversion for byte-level BPE
// models (Llama 3, Qwen2/3, SmolLM2, GPT-2 family, gpt-oss and GPT-4o's
// o200k): HF tokenizer.json (+ tokenizer_config.json,
// generation_config.json) and GGUF vocabularies (tokenizer.ggml.model
// "gpt2"); and for SentencePiece-style BPE (Llama 2, Mistral, TinyLlama,
// Gemma 3: "▁" for spaces, merges over characters, <0xXX> byte fallback)
// from tokenizer.json (Prepend/Replace normalizers or Metaspace) and from
// GGUF SentencePiece vocabularies (tokenizer.ggml.model "llama": pieces
// with scores, tokenized as llama.cpp does). It implements normalizers
// (NFC/NFD/NFKC/NFKD, lowercase), HF's Split pre-tokenizer with every
// behavior (Isolated, Removed, MergedWithPrevious/Next, Contiguous; invert),
// the common split patterns by hand (GPT-2, Llama 3, Qwen2, o200k; Go's
// regexp lacks the lookahead they use; other patterns run on
// github.com/dlclark/regexp2), all with Unicode 16 category tables (HF's
// regex engine's version; Go's are older: unicode_tables.go), individual
// digits (SmolLM2), byte-level mapping, merges by rank (with Llama 3's
// ignore_merges), added/special tokens matched in the text before BPE, and
// decoders (whole and streaming, never splitting a UTF-8 rune) that render
// invalid UTF-8 as HF's decode does.
//
// BOS: prepended by Encode when tokenizer_config.json's add_bos_token (or
// GGUF tokenizer.ggml.add_bos_token) says so, else when tokenizer.json's
// post-processor template starts with it (Llama 3), as HF does even when the
// text starts with it; never by EncodeChat (chat templates write bos_token
// themselves). EOS:
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

// Encode tokenizes text as HF's encode(text) does (add_special_tokens):
// added and special tokens written in the text ("<|im_start|>") become
// their ids, and BOS is prepended when the model's configuration asks for
// it, also before a text that starts with BOS itself (HF gives "<s>" two).
// A prompt rendered by a chat template goes through EncodeChat instead.
func (t *Tokenizer) Encode(text string) []int32 {
	return t.encode(text, t.addBOS)
}

// EncodeChat tokenizes a prompt rendered by the model's chat template as
// HF's apply_chat_template does (add_special_tokens=False): no BOS is
// added, since the template writes bos_token itself where the model wants
// it.
func (t *Tokenizer) EncodeChat(text string) []int32 {
	return t.encode(text, false)
}

func (t *Tokenizer) encode(text string, addBOS bool) []int32 {
	ids := make([]int32, 0, len(text)/3+2)
	if addBOS && t.bos >= 0 {
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

func isWordRune(r rune) bool { return r == '_' || unicode.Is(tableL, r) || unicode.Is(tableNd, r) }

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

// Decode turns ids back into text as HF's decode does: ordinary tokens
// through the byte-level map, added and special tokens as their literal
// text; out-of-range ids are skipped. Bytes that are not valid UTF-8 (a
// byte-level model can emit any bytes) become U+FFFD, one per maximal
// invalid subsequence as HF's ByteLevel decoder (Rust's from_utf8_lossy,
// Python's decode('utf-8', 'replace')) gives; in a SentencePiece-style
// tokenizer a run of <0xXX> tokens that is not valid UTF-8 as a whole
// becomes one U+FFFD per token, as HF's ByteFallback decoder gives. So
// Decode(Encode(s)) == s for any valid UTF-8 s the normalizers leave
// unchanged.
func (t *Tokenizer) Decode(ids []int32) string {
	var d decodeState
	for _, id := range ids {
		d.add(t, id)
	}
	d.endRun()
	return lossyString(t.strip(d.raw))
}

// lossyString is string(appendLossy(nil, b)), without the copy when b is
// valid UTF-8 (the usual case).
func lossyString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string(appendLossy(nil, b))
}

// decodeState accumulates the raw bytes of a decoding; run holds a
// SentencePiece byte-fallback run not yet resolved.
type decodeState struct {
	raw []byte
	run []byte
}

func (d *decodeState) add(t *Tokenizer, id int32) {
	if t.spm {
		if c, ok := t.model.byteOf(id); ok {
			d.run = append(d.run, c)
			return
		}
		d.endRun()
	}
	d.raw = t.appendBytes(d.raw, id)
}

// endRun resolves a byte-fallback run: its bytes when they are valid UTF-8,
// else U+FFFD for each.
func (d *decodeState) endRun() {
	if len(d.run) == 0 {
		return
	}
	if utf8.Valid(d.run) {
		d.raw = append(d.raw, d.run...)
	} else {
		for range d.run {
			d.raw = utf8.AppendRune(d.raw, utf8.RuneError)
		}
	}
	d.run = d.run[:0]
}

// strip drops the leading spaces the SentencePiece-style decoder drops.
func (t *Tokenizer) strip(b []byte) []byte {
	for k := 0; k < t.stripLeading && len(b) > 0 && b[0] == ' '; k++ {
		b = b[1:]
	}
	return b
}

func (t *Tokenizer) appendBytes(b []byte, id int32) []byte {
	if id < 0 || int(id) >= len(t.idToToken) {
		return b
	}
	s := t.idToToken[id]
	if _, ok := t.addedID[id]; ok {
		if t.spm { // SentencePiece-style decoders replace "▁" in added tokens too ("▁▁" in Gemma)
			return append(b, strings.ReplaceAll(s, spmSpace, " ")...)
		}
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

// appendLossy appends b to dst with each maximal invalid subsequence (the
// longest prefix of a well-formed sequence, or one byte) replaced by
// U+FFFD (the Unicode standard's recommended practice, which Rust's
// from_utf8_lossy and Python's 'replace' follow; Go's decoder instead
// gives one U+FFFD per byte).
func appendLossy(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		if c := b[i]; c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			dst = append(dst, b[i:i+n]...)
			i += n
			continue
		}
		dst = utf8.AppendRune(dst, utf8.RuneError)
		i += maximalSubpart(b[i:])
	}
	return dst
}

// maximalSubpart returns the length (≥ 1) of the maximal subpart at the
// start of b, which does not begin with a valid sequence: the lead byte and
// the continuation bytes that still fit a well-formed sequence (Unicode
// Table 3-7).
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF) // range of the second byte
	switch {
	case 0xC2 <= c && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case 0xE1 <= c && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case 0xF1 <= c && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if k == 0 && (x < lo || x > hi) || k > 0 && (x < 0x80 || x > 0xBF) {
			break
		}
		n++
	}
	return n
}

// StreamDecoder turns ids into text incrementally; it holds back the bytes
// of a UTF-8 sequence that a later token may complete (and, in a
// SentencePiece-style tokenizer, a run of <0xXX> tokens until it ends,
// since HF renders a run that is not valid UTF-8 as a whole differently).
// The concatenation of its outputs and Flush equals Decode of the same ids.
type StreamDecoder struct {
	t       *Tokenizer
	d       decodeState
	started bool // text has been returned (leading spaces are stripped once)
}

// NewStreamDecoder returns a decoder for one generation stream.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// Add appends one token and returns the text it completes (possibly "").
func (d *StreamDecoder) Add(id int32) string {
	d.d.add(d.t, id)
	n := completePrefix(d.d.raw)
	s := d.emit(d.d.raw[:n])
	d.d.raw = append(d.d.raw[:0], d.d.raw[n:]...)
	return s
}

func (d *StreamDecoder) emit(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if !d.started {
		d.started = true
		b = d.t.strip(b)
	}
	return lossyString(b)
}

// Flush returns whatever is held back at the end of the stream (an
// incomplete sequence becomes U+FFFD, as in Decode) and resets the decoder.
func (d *StreamDecoder) Flush() string {
	d.d.endRun()
	s := d.emit(d.d.raw)
	d.d.raw, d.started = d.d.raw[:0], false
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

package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// maxVocab bounds token ids read from files (the largest vocabularies in use
// are about 260k).
const maxVocab = 1 << 24

// tokenizerJSON is the subset of HF tokenizer.json that byte-level BPE uses.
type tokenizerJSON struct {
	AddedTokens []struct {
		ID         int32  `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    *component `json:"normalizer"`
	PreTokenizer  *component `json:"pre_tokenizer"`
	PostProcessor *component `json:"post_processor"`
	Decoder       *component `json:"decoder"`
	Model         struct {
		Type         string           `json:"type"`
		Vocab        map[string]int32 `json:"vocab"`
		Merges       json.RawMessage  `json:"merges"` // ["a b", …] or [["a", "b"], …]
		UnkToken     *string          `json:"unk_token"`
		IgnoreMerges bool             `json:"ignore_merges"`
		ByteFallback bool             `json:"byte_fallback"`
		FuseUnk      bool             `json:"fuse_unk"`
		Prefix       *string          `json:"continuing_subword_prefix"`
		Suffix       *string          `json:"end_of_word_suffix"`
	} `json:"model"`
}

// component is any normalizer / pre-tokenizer / processor / decoder node.
type component struct {
	Type          string       `json:"type"`
	Normalizers   []*component `json:"normalizers"`
	Pretokenizers []*component `json:"pretokenizers"`
	Processors    []*component `json:"processors"`
	Decoders      []*component `json:"decoders"`
	Pattern       *struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	// Prepend / Replace normalizers, Metaspace, Strip decoder.
	Prepend          string `json:"prepend"`
	Content          string `json:"content"`
	Replacement      string `json:"replacement"`
	PrependScheme    string `json:"prepend_scheme"`
	Split            *bool  `json:"split"`
	Start            int    `json:"start"`
	Invert           bool   `json:"invert"`
	AddPrefixSpace   bool   `json:"add_prefix_space"`
	UseRegex         *bool  `json:"use_regex"`
	IndividualDigits bool   `json:"individual_digits"`
	// TemplateProcessing
	Single []map[string]struct {
		ID string `json:"id"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
}

// tokenizerConfig is the subset of tokenizer_config.json used here.
type tokenizerConfig struct {
	AddBOSToken *bool       `json:"add_bos_token"`
	BOSToken    TokenString `json:"bos_token"`
	EOSToken    TokenString `json:"eos_token"`
}

// TokenString is a special token as tokenizer_config.json gives it: "text"
// or {"content": "text", …} (the chat template loader reads it too).
type TokenString string

func (s *TokenString) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case string:
		*s = TokenString(x)
	case map[string]any:
		c, _ := x["content"].(string)
		*s = TokenString(c)
	}
	return nil
}

// idList is an id given as a number or a list of numbers.
type idList []int32

func (l *idList) UnmarshalJSON(b []byte) error {
	var one int32
	if err := json.Unmarshal(b, &one); err == nil {
		*l = idList{one}
		return nil
	}
	var many []int32
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*l = many
	return nil
}

func loadHFDir(dir string) (*Tokenizer, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	var tj tokenizerJSON
	if err := json.Unmarshal(raw, &tj); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	var cfg tokenizerConfig
	if b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("parse tokenizer_config.json: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var gen struct {
		EOS idList `json:"eos_token_id"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "generation_config.json")); err == nil {
		if err := json.Unmarshal(b, &gen); err != nil {
			return nil, fmt.Errorf("parse generation_config.json: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return fromHF(&tj, &cfg, gen.EOS)
}

func fromHF(tj *tokenizerJSON, cfg *tokenizerConfig, genEOS []int32) (*Tokenizer, error) {
	m := &tj.Model
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("model type %q: only byte-level BPE is supported", m.Type)
	}
	if (m.Prefix != nil && *m.Prefix != "") || (m.Suffix != nil && *m.Suffix != "") {
		return nil, errors.New("model: subword prefix or suffix BPE is not supported")
	}
	t := &Tokenizer{bos: -1}
	// SentencePiece-style BPE (Llama 2, Mistral, TinyLlama): text with "▁"
	// for spaces, merges over characters, bytes only as <0xXX> fallback.
	t.spm = m.ByteFallback || hasComponent(tj.Decoder, "ByteFallback") || hasComponent(tj.Decoder, "Metaspace") ||
		hasComponent(tj.PreTokenizer, "Metaspace")
	t.model.vocab = m.Vocab
	t.model.ignoreMerges = m.IgnoreMerges
	t.model.unk = -1
	if m.UnkToken != nil {
		if id, ok := m.Vocab[*m.UnkToken]; ok {
			t.model.unk = id
		}
	}
	size := 0
	for s, id := range m.Vocab {
		if id < 0 || id >= maxVocab {
			return nil, fmt.Errorf("model.vocab: token %q has id %d outside [0, %d)", s, id, maxVocab)
		}
		size = max(size, int(id)+1)
	}
	for _, a := range tj.AddedTokens {
		if a.ID < 0 || a.ID >= maxVocab {
			return nil, fmt.Errorf("added_tokens: %q has id %d outside [0, %d)", a.Content, a.ID, maxVocab)
		}
		size = max(size, int(a.ID)+1)
	}
	if limit := 2*(len(m.Vocab)+len(tj.AddedTokens)) + 1024; size > limit {
		return nil, fmt.Errorf("token ids reach %d for %d tokens: too sparse", size, len(m.Vocab)+len(tj.AddedTokens))
	}
	t.idToToken = make([]string, size)
	for s, id := range m.Vocab {
		t.idToToken[id] = s
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return nil, fmt.Errorf("model.merges: %w", err)
	}
	t.model.merges = make(map[uint64]merge, len(pairs))
	for rank, p := range pairs {
		if err := t.addMerge(int32(rank), p[0], p[1]); err != nil {
			return nil, fmt.Errorf("model.merges[%d]: %w", rank, err)
		}
	}
	for _, a := range tj.AddedTokens {
		t.added = append(t.added, addedToken{content: a.Content, id: a.ID, lstrip: a.LStrip, rstrip: a.RStrip,
			singleWord: a.SingleWord, special: a.Special, isNormalized: a.Normalized})
	}
	if err := t.setNormalizer(tj.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	byteLevel, err := t.setPreTokenizer(tj.PreTokenizer)
	if err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch {
	case t.spm && byteLevel:
		return nil, errors.New("pre_tokenizer: ByteLevel in a byte-fallback (SentencePiece-style) tokenizer")
	case t.spm:
		t.model.spm, t.model.fuseUnk = true, m.FuseUnk
		if m.ByteFallback {
			t.model.byteFallback = true
			t.model.byteOfID = make(map[int32]byte, 256)
			for b := range 256 {
				id, ok := m.Vocab[fmt.Sprintf("<0x%02X>", b)]
				if !ok {
					return nil, fmt.Errorf("model: byte_fallback without the token <0x%02X>", b)
				}
				t.model.byteIDs[b], t.model.byteOfID[id] = id, byte(b)
			}
		}
		if err := t.setSPMDecoder(tj.Decoder); err != nil {
			return nil, fmt.Errorf("decoder: %w", err)
		}
	case !byteLevel:
		return nil, errors.New("pre_tokenizer: no ByteLevel step (only byte-level BPE and SentencePiece-style BPE with byte fallback are supported)")
	}
	// BOS: tokenizer_config's add_bos_token decides when present; else the
	// post-processor's template (Llama 3 prepends <|begin_of_text|> there).
	if cfg.BOSToken != "" {
		if id, ok := t.lookup(string(cfg.BOSToken)); ok {
			t.bos = id
		}
	}
	if tmplBOS, ok := templateBOS(tj.PostProcessor); ok {
		if t.bos < 0 {
			t.bos = tmplBOS
		}
		t.addBOS = tmplBOS == t.bos
	}
	if cfg.AddBOSToken != nil {
		t.addBOS = *cfg.AddBOSToken
	}
	if cfg.EOSToken != "" {
		if id, ok := t.lookup(string(cfg.EOSToken)); ok {
			t.eos = append(t.eos, id)
		}
	}
	t.eos = append(t.eos, genEOS...)
	t.addEndOfTurnTokens()
	return t, nil
}

func (t *Tokenizer) lookup(s string) (int32, bool) {
	for _, a := range t.added {
		if a.content == s {
			return a.id, true
		}
	}
	id, ok := t.model.vocab[s]
	return id, ok
}

func (t *Tokenizer) addMerge(rank int32, a, b string) error {
	ia, ok1 := t.model.vocab[a]
	ib, ok2 := t.model.vocab[b]
	im, ok3 := t.model.vocab[a+b]
	if !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("merge %q + %q: token not in vocabulary", a, b)
	}
	k := pairKey(ia, ib)
	if _, dup := t.model.merges[k]; !dup {
		t.model.merges[k] = merge{rank: rank, id: im}
	}
	return nil
}

// endOfTurn are the texts of special tokens that end an assistant turn in
// common chat formats; when present as special tokens they also stop
// generation (as llama.cpp does). gpt-oss's harmony format ends a reply
// with <|return|> or a tool call with <|call|> (its generation_config's
// eos_token_id); its <|end|> only closes a message (the analysis channel
// before the final one), so with those present <|end|> does not stop
// generation (llama.cpp's rule too).
var endOfTurn = []string{"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "</s>", "<eos>", "<|return|>", "<|call|>"}

func (t *Tokenizer) addEndOfTurnTokens() {
	harmony := false
	for _, a := range t.added {
		harmony = harmony || a.special && (a.content == "<|return|>" || a.content == "<|call|>")
	}
	for _, a := range t.added {
		if a.special && containsString(endOfTurn, a.content) && !(harmony && a.content == "<|end|>") {
			t.eos = append(t.eos, a.id)
		}
	}
	if harmony {
		t.eos = slices.DeleteFunc(t.eos, func(id int32) bool { return t.Token(id) == "<|end|>" })
	}
	t.finish()
}

func containsString(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func (t *Tokenizer) setNormalizer(c *component) error {
	if c == nil {
		return nil
	}
	if c.Type == "Sequence" {
		for _, n := range c.Normalizers {
			if err := t.setNormalizer(n); err != nil {
				return err
			}
		}
		return nil
	}
	switch c.Type {
	case "Prepend":
		p := c.Prepend
		t.normalizers = append(t.normalizers, func(s string) string { return p + s })
		return nil
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil {
			return errors.New("Replace normalizer: only a String pattern is supported")
		}
		old, repl := *c.Pattern.String, c.Content
		t.normalizers = append(t.normalizers, func(s string) string { return strings.ReplaceAll(s, old, repl) })
		return nil
	}
	f, ok := normalizerFunc(c.Type)
	if !ok {
		return fmt.Errorf("unsupported normalizer %q", c.Type)
	}
	t.normalizers = append(t.normalizers, f)
	return nil
}

// hasComponent reports whether c or a component of its sequence has type
// kind.
func hasComponent(c *component, kind string) bool {
	if c == nil {
		return false
	}
	if c.Type == kind {
		return true
	}
	for _, l := range [][]*component{c.Normalizers, c.Pretokenizers, c.Decoders, c.Processors} {
		for _, s := range l {
			if hasComponent(s, kind) {
				return true
			}
		}
	}
	return false
}

// setSPMDecoder checks a SentencePiece-style decoder: Replace("▁", " "),
// ByteFallback, Fuse and Strip(" ", start n) in a Sequence, or Metaspace
// (which drops the space it prepended). It records how many leading spaces
// decoding strips.
func (t *Tokenizer) setSPMDecoder(c *component) error {
	if c == nil {
		return nil
	}
	switch c.Type {
	case "Sequence":
		for _, d := range c.Decoders {
			if err := t.setSPMDecoder(d); err != nil {
				return err
			}
		}
		return nil
	case "Replace":
		if c.Pattern == nil || c.Pattern.String == nil || *c.Pattern.String != spmSpace || c.Content != " " {
			return errors.New("Replace decoder other than \"▁\" → \" \"")
		}
		return nil
	case "ByteFallback", "Fuse":
		return nil
	case "Strip":
		if c.Content != " " {
			return fmt.Errorf("Strip decoder of %q", c.Content)
		}
		t.stripLeading = c.Start
		return nil
	case "Metaspace":
		if c.Replacement != "" && c.Replacement != spmSpace {
			return fmt.Errorf("Metaspace decoder with replacement %q", c.Replacement)
		}
		if c.PrependScheme != "never" {
			t.stripLeading = 1
		}
		return nil
	}
	return fmt.Errorf("unsupported decoder %q in a SentencePiece-style tokenizer", c.Type)
}

// setPreTokenizer appends the splitters of c; it reports whether a
// ByteLevel step was seen.
func (t *Tokenizer) setPreTokenizer(c *component) (bool, error) {
	if c == nil {
		return false, nil
	}
	switch c.Type {
	case "Sequence":
		seen := false
		for _, p := range c.Pretokenizers {
			s, err := t.setPreTokenizer(p)
			if err != nil {
				return false, err
			}
			seen = seen || s
		}
		return seen, nil
	case "ByteLevel":
		t.prefixSpace = c.AddPrefixSpace
		if c.UseRegex == nil || *c.UseRegex {
			t.pretok = append(t.pretok, regexSplit{})
		}
		return true, nil
	case "Digits":
		t.pretok = append(t.pretok, digitSplit{individual: c.IndividualDigits})
		return false, nil
	case "Metaspace":
		if c.Replacement != "" && c.Replacement != spmSpace {
			return false, fmt.Errorf("Metaspace with replacement %q is not supported", c.Replacement)
		}
		scheme := c.PrependScheme
		if scheme == "" {
			scheme = "always"
			if !c.AddPrefixSpace {
				scheme = "never"
			}
		}
		t.metaspace = &metaspace{prepend: scheme, split: c.Split == nil || *c.Split}
		return false, nil
	case "Split":
		beh, ok := behaviors[c.Behavior]
		if !ok {
			return false, fmt.Errorf("Split with behavior %q is not supported", c.Behavior)
		}
		if c.Pattern == nil {
			return false, errors.New("Split without pattern")
		}
		var sp splitter
		switch {
		case c.Pattern.Regex != nil:
			var err error
			if sp, err = splitterForPattern(*c.Pattern.Regex); err != nil {
				return false, err
			}
		case c.Pattern.String != nil:
			sp = stringSplit(*c.Pattern.String)
		default:
			return false, errors.New("Split pattern is neither Regex nor String")
		}
		if beh != isolated || c.Invert {
			// Isolated ignores invert: matches and gaps are pieces either way.
			sp = patternSplit{m: sp.(matcher), behavior: beh, invert: c.Invert}
		}
		t.pretok = append(t.pretok, sp)
		return false, nil
	}
	return false, fmt.Errorf("unsupported pre-tokenizer %q", c.Type)
}

// stringSplit isolates each occurrence of a literal string.
type stringSplit string

func (d stringSplit) split(s string, emit func(string)) {
	if d == "" {
		emit(s)
		return
	}
	for {
		i := strings.Index(s, string(d))
		if i < 0 {
			break
		}
		if i > 0 {
			emit(s[:i])
		}
		emit(s[i : i+len(d)])
		s = s[i+len(d):]
	}
	if s != "" {
		emit(s)
	}
}

// templateBOS returns the special token a TemplateProcessing post-processor
// puts first in a single sequence.
func templateBOS(c *component) (int32, bool) {
	if c == nil {
		return 0, false
	}
	switch c.Type {
	case "Sequence":
		for _, p := range c.Processors {
			if id, ok := templateBOS(p); ok {
				return id, true
			}
		}
	case "TemplateProcessing":
		if len(c.Single) == 0 {
			return 0, false
		}
		st, ok := c.Single[0]["SpecialToken"]
		if !ok {
			return 0, false
		}
		if sp, ok := c.SpecialTokens[st.ID]; ok && len(sp.IDs) > 0 {
			return sp.IDs[0], true
		}
	}
	return 0, false
}

// parseMerges reads merges written as "a b" strings (older files) or as
// ["a", "b"] pairs (newer files, where tokens may contain spaces).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		out := make([][2]string, len(strs))
		for i, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("[%d] %q is not a pair", i, s)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, errors.New("neither a list of \"a b\" strings nor a list of pairs")
	}
	out := make([][2]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("[%d] has %d elements, want 2", i, len(p))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

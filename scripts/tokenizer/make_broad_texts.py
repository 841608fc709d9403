#!/usr/bin/env python3
"""Write runners/tokenizer/testdata/texts_broad.txt (run by hand, not in CI).

A broad set of texts for comparing our ids with HF tokenizers' on real
tokenizer.json files (make_fixtures.py), separated like texts.txt by a line
holding only "=====". Half of it is written here by hand (multilingual prose,
code, whitespace runs, numbers, emoji, every model's special tokens); the
rest is drawn at random (fixed seed) from the Unicode 16.0 character
database (PyPI unicodedata2==16.0.0, the Unicode version of HF tokenizers'
regex engine): words in every script the database names, runs of marks,
digits, punctuation, symbols, spaces and controls, and long texts made of
all of it, so that no one tuned the tokenizer to them.

    pip install unicodedata2==16.0.0 && python3 scripts/tokenizer/make_broad_texts.py
"""
import collections, os, random

import unicodedata2 as ud

assert ud.unidata_version == "16.0.0", ud.unidata_version

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "runners", "tokenizer", "testdata", "texts_broad.txt")
SEP = "\n=====\n"

HAND = [
    # prose in many languages
    "The committee met on Tuesday; nobody agreed, so they'll meet again. Isn't that typical? It's 5 o'clock.",
    "Der Ausschuss tagte am Dienstag. Größere Änderungen wären nötig, meinte Jürgen — aber niemand hörte zu.",
    "Le comité s'est réuni mardi ; personne n'était d'accord. « C'est la vie », a dit l'élève.",
    "El comité se reunió el martes. ¿Nadie estaba de acuerdo? ¡Qué sorpresa! Año, niño, pingüino.",
    "Комитет собрался во вторник; никто не согласился. Съешь же ещё этих мягких французских булок.",
    "Η επιτροπή συνεδρίασε την Τρίτη. Κανείς δεν συμφώνησε· θα ξανασυναντηθούν.",
    "委员会星期二开会了，但是没有人同意。我们明天再讨论这个问题吧！",
    "委員会は火曜日に開かれましたが、誰も賛成しませんでした。カタカナとひらがなと漢字。",
    "위원회는 화요일에 모였지만 아무도 동의하지 않았다. 다음 주에 다시 만날 것이다.",
    "اجتمعت اللجنة يوم الثلاثاء، لكن لم يوافق أحد. سنلتقي مرة أخرى غداً.",
    "הוועדה התכנסה ביום שלישי, אך איש לא הסכים. ניפגש שוב מחר.",
    "समिति मंगलवार को मिली, लेकिन कोई सहमत नहीं हुआ। हम कल फिर मिलेंगे।",
    "কমিটি মঙ্গলবার মিলিত হয়েছিল, কিন্তু কেউ একমত হয়নি।",
    "குழு செவ்வாய்க்கிழமை கூடியது, ஆனால் யாரும் ஒப்புக்கொள்ளவில்லை.",
    "คณะกรรมการประชุมเมื่อวันอังคาร แต่ไม่มีใครเห็นด้วย",
    "Ủy ban đã họp vào thứ Ba, nhưng không ai đồng ý. Tiếng Việt có nhiều dấu.",
    "Komite Salı günü toplandı; kimse aynı fikirde değildi. İstanbul, ığdır, şöyle.",
    "Komitet zebrał się we wtorek. Zażółć gęślą jaźń. Łódź, Kraków, Gdańsk.",
    "ኮሚቴው ማክሰኞ ተሰብስቧል። ሰላም ለዓለም።",
    "Կոմիտեն հավաքվեց երեքշաբթի։ ქართული ენა ლამაზია.",
    # code
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Printf(\"%d: %q\\n\", i, []byte{0x41})\n\t}\n}\n",
    "class Stack:\n    def __init__(self):\n        self._items: list[int] = []\n\n    def push(self, x: int) -> None:\n        self._items.append(x)  # O(1)\n\n    def pop(self) -> int:\n        return self._items.pop()\n",
    "{\"name\": \"exo\", \"version\": \"1.2.3\", \"tags\": [\"a\", \"b\"], \"nested\": {\"x\": null, \"y\": true, \"z\": -0.5e-3}}",
    "<!DOCTYPE html>\n<html><head><title>T&amp;C</title></head>\n<body><div class=\"x\"><table><tr><td>1</td></tr></table></div></body></html>",
    "#!/bin/sh\nset -eu\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> /tmp/out.log 2>&1\ndone\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total >= 100.00 GROUP BY u.id HAVING n > 3;",
    "fn main() { let v: Vec<u32> = (1..=10).map(|x| x * x).collect(); println!(\"{v:?}\"); } // rust",
    "\\begin{equation} \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2} \\end{equation} $a_{ij}^{(k)}$",
    "a/b/c//d///e https://x.org/a/b/?q=1 path/to/file.go:12:34 C:\\\\dir\\\\f.txt //comment /* block */",
    # whitespace
    "a  b   c    d     e      f       g        h",
    "\t\t\ttabs\t \t mixed \t\t\n\t\n\t\t\n",
    "line1\r\nline2\r\n\r\n\r\nline3\rline4\n\n\n\n\n\n\n\n\n\nline5",
    "        eight leading spaces and sixteen trailing                ",
    "\u00a0nbsp\u00a0\u00a0twice \u2000\u2001\u2002\u2003 em \u3000\u3000 ideographic \u2028\u2029 separators \u0085 nel \u000b\u000c",
    "\n",
    "   ",
    "\n\n \n \n\n  x",
    # numbers
    "0 00 000 0000 00000 1234567890123456789 3.141592653589793 -2.5e-10 1,234,567.89 1.000.000,00 0xDEADbeef 0b1011 1e100",
    "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳۴۵۶۷۸۹ ०१२३४५६७८९ ０１２３４５６７８９ ①②③ ⅰⅱⅲ ¹²³ ½¾ 𝟘𝟙𝟚 ᛮᛯᛰ 〇〡〢",
    "Call 555-0199 or +1 (800) 555-0100 ext. 42; order #12345/67 on 2024-02-29T13:45:07Z; v2.10.3-rc1.",
    # emoji and symbols
    "👩🏽‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🏴‍☠️ 🇯🇵🇺🇸🇩🇪 1️⃣ #️⃣ ❤️‍🔥 🫠🫡🪿 😀😃😄😁 ☺︎ ☺️",
    "→ ← ↑ ↓ ⇒ ∀x∈ℝ: x²≥0 ∑ ∏ √ ∞ ≠ ≤ ≥ ± × ÷ © ® ™ § ¶ † ‡ • … ‰ € £ ¥ ₹ ₿ ♠♣♥♦ ✓✗ ★☆",
    # special tokens of the models under test, and near misses
    "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn><eos>",
    "<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>yo<|return|>",
    "<|endoftext|>x<|endofprompt|> <|im_start|>user\nq<|im_end|> <s>[INST] q [/INST] a</s> <|begin_of_text|><|eot_id|>",
    "<unk> <mask> <pad> [multimodal] <start_of_image><image_soft_token><end_of_image> <unused0> <unused99>",
    "▁▁ ▁▁▁▁ a▁b \u2581\u2581\u2581\u2581\u2581\u2581\u2581\u2581x \n\n\n\n\n\n\t\t\t\t\t <table><tr><td>x</td></tr></table> <b>bold</b> <code>x</code>",
    "<|start <start_of_turn <|endoftext| <bos <eos> <<bos>> <|<|endoftext|>|>",
    # contractions and case
    "I'M YOU'RE WE'VE THEY'D SHE'LL IT'S DON'T won't y'all 'tis ’s 'S'T'M'D 'll've HELLOworld helloWORLD CamelCaseWord XMLHttpRequest iPhone",
    # odd code points
    "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffbom \u00ad soft\u00adhyphen e\u0301 a\u0308 \u0301\u0302lead",
    "variation\ufe0f\ufe0e selectors \U000e0100 tags \U000e0041\U000e0042 private \ue000\uf8ff \U000f0000 noncharacter \ufffe\uffff \ufffd",
    "Ǆǅǆ ǈ ǋ ᾈ ᾼ ﬁ ﬂ ﬀ ǲ ß ẞ İ ı ſ ĸ ŉ",
    "it'ſ x'ſ y 'ſa X'ſT X'ST x'\u212a I'\u0130 x'\ufb05 O'NEILL'S o'neill's",
]

TEXT_CATS = ("Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
             "Po", "Sm", "Sc", "Sk", "So", "Zs")


def tables():
    """Characters by category, and letters and digits by the first word of
    their names (a stand-in for the script)."""
    by_cat = collections.defaultdict(list)
    letters = collections.defaultdict(list)
    marks = collections.defaultdict(list)
    digits = collections.defaultdict(list)
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        cat = ud.category(c)
        by_cat[cat].append(c)
        name = ud.name(c, "")
        word = name.split(" ")[0] if name else ""
        if cat.startswith("L") and word:
            letters[word].append(c)
        elif cat.startswith("M") and word:
            marks[word].append(c)
        elif cat == "Nd" and word:
            digits[word].append(c)
    return by_cat, letters, marks, digits


def script_words(rnd, letters, marks, digits, script, n):
    out = []
    for _ in range(n):
        w = "".join(rnd.choice(letters[script]) for _ in range(rnd.randint(1, 9)))
        if marks.get(script) and rnd.random() < 0.4:
            i = rnd.randint(1, len(w))
            w = w[:i] + rnd.choice(marks[script]) + w[i:]
        if digits.get(script) and rnd.random() < 0.15:
            w = "".join(rnd.choice(digits[script]) for _ in range(rnd.randint(1, 6)))
        out.append(w)
    seps = [" ", " ", " ", ", ", ". ", "  ", "\n", "-", "'s ", "! "]
    return "".join(w + rnd.choice(seps) for w in out).rstrip(" ")


def random_mix(rnd, by_cat, n):
    cats = list(TEXT_CATS) + ["Cc", "Cf", "Co", "Cn", "Zl", "Zp"]
    weights = [8 if c.startswith("L") else 3 if c[0] in "NPZS" else 2 for c in TEXT_CATS] + [1, 1, 1, 1, 1, 1]
    out = []
    for _ in range(n):
        cat = rnd.choices(cats, weights)[0]
        pool = by_cat[cat]
        if cat == "Cc":
            pool = [c for c in pool if c not in "\x00"]
        k = rnd.randint(1, 4)
        out.append("".join(rnd.choice(pool) for _ in range(k)))
        if rnd.random() < 0.3:
            out.append(rnd.choice([" ", "  ", "\t", "\n", "\r\n", " \n ", "\u3000"]))
    return "".join(out)


def main():
    rnd = random.Random(20261203)
    by_cat, letters, marks, digits = tables()
    scripts = sorted(s for s, l in letters.items() if len(l) >= 8)
    generated = []
    # every script with a few words, eight scripts per text
    rnd.shuffle(scripts)
    for i in range(0, len(scripts), 8):
        generated.append(" ".join(script_words(rnd, letters, marks, digits, s, rnd.randint(2, 6))
                                  for s in scripts[i:i + 8]))
    # the scripts Unicode 15.1 and 16.0 added, always present
    for s in ("GARAY", "TULU-TIGALARI", "KIRAT", "OL", "SUNUWAR", "TODHRI", "GURUNG"):
        if s in letters:
            generated.append(script_words(rnd, letters, marks, digits, s, 12))
    for _ in range(30):
        generated.append(random_mix(rnd, by_cat, rnd.randint(5, 60)))
    # long texts: everything above shuffled together
    pool = HAND + generated
    for n in (40, 80):
        generated.append(" ".join(rnd.choice(pool) for _ in range(n)))
    ts = HAND + generated
    for t in ts:
        assert "=====" not in t
    with open(OUT, "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(ts))
    print("wrote %d texts, %d characters, to %s" % (len(ts), sum(map(len, ts)), os.path.normpath(OUT)))


if __name__ == "__main__":
    main()

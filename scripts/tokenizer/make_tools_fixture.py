#!/usr/bin/env python3
"""Make runners/chat/testdata/tools_render.json (run by hand, not in CI): a conversation rendered with
`tools` by Python jinja2 in HF's apply_chat_template environment, with the real Qwen3 and Llama 3.1
templates of runners/chat/testdata. The tool schema's keys are written in the order the Go renderer
uses (type first, the rest sorted), which is also the order a client's JSON usually has.
pip install jinja2."""
import json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_fixtures import OUT, tojson, raise_exception  # same environment as golden.json

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "description": "City name"},
         "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time"}},
]
conv = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
]


def render(src, agp):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(src).render(messages=conv, add_generation_prompt=agp, tools=tools, documents=None,
                                       bos_token="<s>", eos_token="</s>", date_string="26 Jul 2024")


cases = []
for fn in ["qwen3_real_chat_template.jinja", "llama31_chat_template.jinja"]:
    src = open(os.path.join(OUT, fn)).read()
    cases.append({"template": fn, "output": render(src, True)})
json.dump({"conversation": conv, "tools": tools, "cases": cases},
          open(os.path.join(OUT, "tools_render.json"), "w"), indent=1, ensure_ascii=False)

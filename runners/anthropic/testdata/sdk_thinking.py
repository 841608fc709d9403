"""The official anthropic client on thinking blocks and a cut-off tool_use.

Usage: sdk_thinking.py THINK_URL TOOL_URL MIXED_URL. Prints one JSON object: each
answer's content blocks and stop_reason as the SDK parsed them, from the
whole answer and from the stream (stream().get_final_message()).
"""
import json
import sys

import anthropic

think_url, tool_url, mixed_url = sys.argv[1:4]
out = {}


def both(name, url, **kw):
    c = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
    args = dict(model="tiny", max_tokens=50, messages=[{"role": "user", "content": "hi"}], **kw)
    m = c.messages.create(**args)
    with c.messages.stream(**args) as s:
        f = s.get_final_message()
    for form, msg in (("whole", m), ("stream", f)):
        out[name + "_" + form] = {"stop_reason": msg.stop_reason,
                                  "content": [b.model_dump(exclude_none=True) for b in msg.content]}


both("think", think_url, thinking={"type": "enabled", "budget_tokens": 20})
both("tool", tool_url, tools=[{"name": "get_weather", "input_schema": {"type": "object"}}])
both("mixed", mixed_url, tools=[{"name": "get_weather", "input_schema": {"type": "object"}}])
print(json.dumps(out))

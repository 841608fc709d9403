#!/usr/bin/env python3
"""Acceptance test of /v1/messages with the official anthropic Python SDK (pip install anthropic),
run by runners/e2e/clients_test.go against a real decode runner: python3 anthropic_sdk.py BASE_URL MODEL.
Prints one JSON object with what it saw; exits non-zero on any failure."""
import json, sys

import anthropic

base, model = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
out = {}

# create
msg = client.messages.create(model=model, max_tokens=12, extra_body={"temperature": 0},
                             system="Answer in one word.",
                             messages=[{"role": "user", "content": "What is the capital of France?"}])
assert msg.type == "message" and msg.role == "assistant", msg
assert msg.stop_reason in ("end_turn", "max_tokens"), msg.stop_reason
assert msg.content and msg.content[0].type == "text", msg.content
assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 0 and msg.usage.output_tokens > 0, msg.usage
out["create"] = msg.content[0].text
out["_create_prompt"] = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)

# stream: the SDK's event accumulator rebuilds the same message
with client.messages.stream(model=model, max_tokens=12, extra_body={"temperature": 0}, system="Answer in one word.",
                            messages=[{"role": "user", "content": "What is the capital of France?"}]) as stream:
    events = [e.type for e in stream]
    final = stream.get_final_message()
assert events[0] == "message_start" and events[-1] == "message_stop", events
assert "content_block_delta" in events or "text" in events, events
out["stream"] = final.content[0].text
out["stream_stop_reason"] = final.stop_reason
assert out["stream"] == out["create"], (out["stream"], out["create"])

# stop sequence
msg = client.messages.create(model=model, max_tokens=40, extra_body={"temperature": 0}, stop_sequences=["Paris"],
                             messages=[{"role": "user", "content": "What is the capital of France?"}])
out["stop"] = [msg.stop_reason, msg.stop_sequence, msg.content[0].text]

# assistant prefill: the reply continues the given text
msg = client.messages.create(model=model, max_tokens=8, extra_body={"temperature": 0},
                             messages=[{"role": "user", "content": "What is the capital of France?"},
                                       {"role": "assistant", "content": "The capital of France is"}])
out["prefill"] = msg.content[0].text

# count_tokens equals the prompt of the same request
ct = client.messages.count_tokens(model=model, system="Answer in one word.",
                                  messages=[{"role": "user", "content": "What is the capital of France?"}])
out["count_tokens"] = ct.input_tokens
out["create_prompt_tokens"] = out.pop("_create_prompt")

# a tool_use -> tool_result round trip (tool_choice any forces the call; the grammar makes its input valid)
tools = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
q = [{"role": "user", "content": "What is the weather in Paris?"}]
msg = client.messages.create(model=model, max_tokens=100, extra_body={"temperature": 0}, tools=tools,
                             tool_choice={"type": "any"}, messages=q)
assert msg.stop_reason == "tool_use", msg
use = [b for b in msg.content if b.type == "tool_use"][0]
assert use.name == "get_weather" and isinstance(use.input.get("city"), str), use
out["tool_use"] = {"name": use.name, "input": use.input}
with client.messages.stream(model=model, max_tokens=100, extra_body={"temperature": 0}, tools=tools,
                            tool_choice={"type": "any"}, messages=q) as stream:
    smsg = stream.get_final_message()
suse = [b for b in smsg.content if b.type == "tool_use"][0]
assert {"name": suse.name, "input": suse.input} == out["tool_use"], (suse, use)
# the streamed message has the created one's blocks: no empty text block before the tool_use (the Messages API
# refuses an empty text block when such a turn is sent back)
assert [b.type for b in smsg.content] == [b.type for b in msg.content], (smsg.content, msg.content)
assert not any(b.type == "text" and not b.text for b in smsg.content), smsg.content
final = client.messages.create(model=model, max_tokens=30, extra_body={"temperature": 0}, tools=tools, messages=q + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}]}])
assert final.stop_reason in ("end_turn", "max_tokens", "tool_use"), final
out["after_tool"] = final.stop_reason

print(json.dumps(out))

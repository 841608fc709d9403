#!/usr/bin/env python3
"""Acceptance test of tools and structured outputs with the official openai Python SDK (pip install openai
pydantic), run by runners/e2e/openai_sdk_test.go against the gateway of a real cluster:
python3 openai_tools_sdk.py BASE_URL MODEL. Prints one JSON object with what it saw; exits non-zero on any failure."""
import json, sys

import openai
from pydantic import BaseModel

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
out = {}


# 1. chat.completions.parse with a pydantic model: the SDK sends a strict json_schema and parses the reply.
class City(BaseModel):
    name: str
    country: str
    population_millions: int
    is_capital: bool


done = client.chat.completions.parse(
    model=model, temperature=0, max_tokens=200, response_format=City,
    messages=[{"role": "user", "content": "Describe Paris as JSON with name, country, population_millions and is_capital."}])
city = done.choices[0].message.parsed
assert isinstance(city, City), done
out["parsed"] = city.model_dump()

# 2. a two-step tool loop: a forced call, the tool's result, then the answer.
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
first = client.chat.completions.create(model=model, temperature=0, max_tokens=100, messages=messages,
                                       tools=tools, tool_choice="required")
choice = first.choices[0]
assert choice.finish_reason == "tool_calls", choice
calls = choice.message.tool_calls
assert calls and calls[0].function.name == "get_weather", calls
args = json.loads(calls[0].function.arguments)
assert isinstance(args.get("city"), str), args
out["call"] = {"name": calls[0].function.name, "arguments": args}
messages.append(choice.message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "18 degrees C and sunny"})
second = client.chat.completions.create(model=model, temperature=0, max_tokens=40, messages=messages, tools=tools)
answer = second.choices[0]
assert answer.finish_reason in ("stop", "length", "tool_calls"), answer
out["answer"] = {"finish_reason": answer.finish_reason, "content": answer.message.content,
                 "tool_calls": len(answer.message.tool_calls or [])}

# 3. the same forced call streamed: the SDK's accumulator rebuilds it from delta.tool_calls.
with client.chat.completions.stream(model=model, temperature=0, max_tokens=100,
                                    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                    tools=tools, tool_choice="required") as stream:
    final = stream.get_final_completion()
scalls = final.choices[0].message.tool_calls
assert final.choices[0].finish_reason == "tool_calls", final
out["stream_call"] = {"name": scalls[0].function.name, "arguments": json.loads(scalls[0].function.arguments)}
assert out["stream_call"] == out["call"], (out["stream_call"], out["call"])

# 4. an unsupported schema keyword is a 400 that names it.
try:
    client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                   response_format={"type": "json_schema", "json_schema": {
                                       "name": "x", "schema": {"type": "object", "patternProperties": {"^a": {"type": "string"}}}}})
    raise SystemExit("an unsupported keyword was not refused")
except openai.BadRequestError as e:
    out["schema_error"] = e.body["message"] if "message" in e.body else str(e.body)

# 5. a function without parameters takes none (OpenAI's definition): a forced call's arguments are {}.
ping = client.chat.completions.create(model=model, temperature=0, max_tokens=30, parallel_tool_calls=False,
                                      messages=[{"role": "user", "content": "Ping the server."}],
                                      tools=[{"type": "function", "function": {"name": "ping", "description": "Ping the server"}}],
                                      tool_choice="required")
assert json.loads(ping.choices[0].message.tool_calls[0].function.arguments) == {}, ping
out["no_parameters"] = "{}"

# 6. the Responses API: an answer that is only a call is only a function_call item, created or streamed.
rtools = [{"type": "function", "name": "get_weather", "parameters": tools[0]["function"]["parameters"]}]
r = client.responses.create(model=model, temperature=0, max_output_tokens=60, input="What is the weather in Paris?",
                            tools=rtools, tool_choice="required", parallel_tool_calls=False)
with client.responses.stream(model=model, temperature=0, max_output_tokens=60, input="What is the weather in Paris?",
                             tools=rtools, tool_choice="required", parallel_tool_calls=False) as st:
    rs = st.get_final_response()
out["responses_items"] = [[o.type for o in r.output], [o.type for o in rs.output]]
assert out["responses_items"] == [["function_call"], ["function_call"]], out["responses_items"]

# 7. Responses structured outputs: responses.parse sends text.format json_schema and parses the answer.
rp = client.responses.parse(model=model, temperature=0, max_output_tokens=120, text_format=City,
                            input="Describe Paris as JSON with name, country, population_millions and is_capital.")
assert isinstance(rp.output_parsed, City), rp
out["responses_parsed"] = rp.output_parsed.model_dump()

print(json.dumps(out))

"""The official openai client on a Responses answer of text, a call, text.

Usage: sdk_responses.py BASE_URL. Prints one JSON object: the output items
(type and, for messages, text) as the SDK parsed them from
responses.create and from responses.stream's final response.
"""
import json
import sys

import openai

c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=60)
args = dict(model="tiny", input="hi", tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])


def items(r):
    return [{"type": o.type, "text": o.content[0].text} if o.type == "message" else {"type": o.type, "name": o.name} for o in r.output]


whole = c.responses.create(**args)
with c.responses.stream(**args) as s:
    final = s.get_final_response()
print(json.dumps({"whole": items(whole), "stream": items(final)}))

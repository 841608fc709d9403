#!/usr/bin/env python3
"""Acceptance test of the OpenAI-compatible API with the official openai Python SDK (pip install openai),
run by runners/e2e/clients_test.go against a real decode runner: python3 openai_sdk.py BASE_URL MODEL.
Prints one JSON object with what it saw; exits non-zero on any failure."""
import json, math, sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
out = {}
q = [{"role": "user", "content": "Write one sentence about the sea."}]

# sampling: without a seed, fresh randomness; with one, reproducible
texts = [client.chat.completions.create(model=model, messages=q, temperature=1, max_tokens=16).choices[0].message.content
         for _ in range(5)]
out["unseeded_distinct"] = len(set(texts))
seeded = [client.chat.completions.create(model=model, messages=q, temperature=1, max_tokens=16, seed=7).choices[0].message.content
          for _ in range(3)]
out["seeded_distinct"] = len(set(seeded))

# logprobs: the greedy token is the most likely of its top_logprobs
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                   temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
lp = r.choices[0].logprobs.content
assert len(lp) == r.usage.completion_tokens, (len(lp), r.usage)
for t in lp:
    assert len(t.top_logprobs) == 3 and abs(t.logprob - t.top_logprobs[0].logprob) < 1e-9, t
    assert t.logprob <= 0 and bytes(t.bytes).decode("utf-8", "replace") is not None
out["logprobs_text"] = "".join(bytes(t.bytes).decode("utf-8", "replace") for t in lp)
out["content"] = r.choices[0].message.content

# streamed logprobs arrive with the deltas
s = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                   temperature=0, max_tokens=8, logprobs=True, top_logprobs=1, stream=True)
n = sum(len(c.choices[0].logprobs.content) for c in s if c.choices and c.choices[0].logprobs)
out["streamed_logprobs"] = n

# a field this server does not implement is refused by name
try:
    client.chat.completions.create(model=model, messages=q, max_tokens=4, n=2)
    raise SystemExit("n=2 was not refused")
except openai.BadRequestError as e:
    out["refused_param"] = e.body.get("param")

# Responses API: create and stream give the same text
r = client.responses.create(model=model, input="What is the capital of France?", instructions="Answer in one word.",
                            temperature=0, max_output_tokens=12)
out["responses_text"] = r.output_text
events = []
with client.responses.stream(model=model, input="What is the capital of France?", instructions="Answer in one word.",
                             temperature=0, max_output_tokens=12) as st:
    for e in st:
        events.append(e.type)
    final = st.get_final_response()
out["responses_stream_text"] = final.output_text
out["responses_events"] = [events[0], events[-1]]
print(json.dumps(out))

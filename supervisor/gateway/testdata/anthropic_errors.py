"""The official anthropic client against the gateway's own errors.

Usage: anthropic_errors.py BASE_URL KEY. Prints one JSON object: for each
case, the exception class the SDK raised, the status and the error's type.
"""
import json
import sys

import anthropic

base, key = sys.argv[1:3]
out = {}


def run(case, k, call):
    client = anthropic.Anthropic(base_url=base, api_key=k, max_retries=0, timeout=60)
    try:
        call(client)
        out[case] = {"class": "none"}
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        out[case] = {"class": type(e).__name__, "status": e.status_code,
                     "type": (body.get("error") or {}).get("type"), "message": (body.get("error") or {}).get("message")}


def create(model):
    return lambda c: c.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])


run("wrong_key", key + "x", create("m"))
run("unknown_model", key, create("gpt-5"))
run("no_runner", key, create("nobody"))
run("array_body", key, lambda c: c.post("/v1/messages", body=[{"model": "m"}], cast_to=object))
run("unknown_path", key, lambda c: c.post("/v1/messages/batches", body={"model": "m"}, cast_to=object))
run("wrong_method", key, lambda c: c.get("/v1/messages", cast_to=object))
print(json.dumps(out))

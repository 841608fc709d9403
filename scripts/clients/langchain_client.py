#!/usr/bin/env python3
"""Acceptance test with langchain-openai (pip install langchain-openai), run by runners/e2e/openai_sdk_test.go
against the gateway of a real cluster: python3 langchain_client.py BASE_URL MODEL.
with_structured_output (a pydantic model) and bind_tools (a forced tool). Prints one JSON object."""
import json, sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

base, model = sys.argv[1], sys.argv[2]
llm = ChatOpenAI(base_url=base + "/v1", api_key="unused", model=model, temperature=0, max_tokens=200, max_retries=0)
out = {}


class City(BaseModel):
    name: str
    country: str


city = llm.with_structured_output(City).invoke("Describe Paris as JSON with its name and country.")
assert isinstance(city, City), city
out["structured"] = city.model_dump()


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return "18 C and sunny"


msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather", msg
assert isinstance(msg.tool_calls[0]["args"].get("city"), str), msg.tool_calls
out["tool_call"] = {"name": msg.tool_calls[0]["name"], "args": msg.tool_calls[0]["args"]}
print(json.dumps(out))

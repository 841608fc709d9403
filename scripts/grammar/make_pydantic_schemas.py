#!/usr/bin/env python3
"""Make runners/grammar/testdata/pydantic_schemas.json (run by hand, not in CI): the JSON Schemas the
official openai Python SDK sends for chat.completions.parse(response_format=<pydantic model>) and
pydantic_function_tool(<model>) (openai.lib._pydantic.to_strict_json_schema), for models of the kinds
people write: nested models, lists, Optional, Literal, Enum, dict, recursion, field descriptions.
pip install openai pydantic."""
import enum, json, os
from typing import Literal, Optional

from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runners", "grammar", "testdata")


class Color(enum.Enum):
    red = "red"
    green = "green"


class Address(BaseModel):
    street: str
    city: str = Field(description="City name")
    zip: Optional[str] = None


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=40)
    age: int = Field(ge=0, le=150)
    height_m: float = Field(ge=0)
    emails: list[str]
    address: Address
    previous: list[Address] = Field(default_factory=list)
    role: Literal["admin", "user"]
    color: Color
    tags: dict[str, int]
    nickname: Optional[str] = None


class Step(BaseModel):
    explanation: str
    output: str


class Reasoning(BaseModel):
    steps: list[Step]
    final_answer: str


class Node(BaseModel):
    value: int
    children: list["Node"]


class GetWeather(BaseModel):
    """Current weather in a city."""
    city: str
    unit: Literal["c", "f"] = "c"


schemas = {name: to_strict_json_schema(m) for name, m in
           [("person", Person), ("reasoning", Reasoning), ("node", Node), ("get_weather", GetWeather)]}
os.makedirs(OUT, exist_ok=True)
json.dump(schemas, open(os.path.join(OUT, "pydantic_schemas.json"), "w"), indent=1)

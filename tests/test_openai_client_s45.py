"""The `openai` client against the server as application code uses it (session 45): OpenAI's
tool_choice {"type": "allowed_tools", ...} and its `custom` tools, through the client's own
types and stream helpers, on the shared plain_server."""
from __future__ import annotations

import json

import openai
import pytest

T = 60

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"],
    "additionalProperties": False}}}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server  # shared with other modules (conftest.py)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=T, max_retries=0)


def _allowed(mode: str, *names: str) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": mode, "tools": [{"type": "function", "function": {"name": n}} for n in names]}}


def test_allowed_tools_required_streams_calls_of_the_allowed_tool_only(client):
    # was a 400 ("tool_choice must be ...") for a tool_choice that OpenAI's API takes
    kw = dict(model="default", messages=MSGS, tools=[WEATHER, CLOCK], tool_choice=_allowed("required", "get_time"),
              parallel_tool_calls=False, max_tokens=24, temperature=0)
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        done = stream.get_final_completion()
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0].function.arguments)["zone"], str)


def test_allowed_tools_errors_name_the_field(client):
    bad = [(_allowed("sometimes", "get_time"), "mode"),
           (_allowed("auto", "nope"), "'nope', which is not in tools"),
           ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "non-empty list")]
    for choice, words in bad:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="default", messages=MSGS, tools=[WEATHER, CLOCK],
                                           tool_choice=choice, max_tokens=2)
        assert words in err.value.body["message"] and err.value.body["param"] == "tool_choice", err.value.body
    with pytest.raises(openai.BadRequestError) as err:  # refused by name: no free-form tools here
        client.chat.completions.create(model="default", messages=MSGS, max_tokens=2,
                                       tools=[{"type": "custom", "custom": {"name": "raw"}}])
    assert "custom tools are not supported" in err.value.body["message"], err.value.body


def test_json_schema_without_schema_and_empty_suffix_are_taken(client):
    # OpenAI's json_schema.schema is optional (any JSON then), and suffix "" is no suffix: both were a 400
    fmt = {"type": "json_schema", "json_schema": {"name": "anything"}}
    reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Give JSON."}],
                                           response_format=fmt, max_tokens=12, temperature=0).choices[0]
    if reply.finish_reason == "stop":
        json.loads(reply.message.content)
    assert reply.message.content
    done = client.completions.create(model="default", prompt="Hello", suffix="", max_tokens=2, temperature=0)
    assert done.choices[0].text
    with pytest.raises(openai.BadRequestError) as err:  # a suffix with text is still refused by name
        client.completions.create(model="default", prompt="Hello", suffix="x", max_tokens=2)
    assert err.value.body["param"] == "suffix"

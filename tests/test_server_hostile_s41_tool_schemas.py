"""Tools whose `parameters` no call can satisfy, or that do not compile, against a real server
(session 41): each is a 400 naming the tool, the keyword and the path in the client's terms.

Before: under tool_choice "required" the tools' schemas sit in a wrapper grammar (an array of
calls, each tool's parameters under $defs), and the grammar compiler leaves out a branch that
accepts nothing. So one such tool was refused as "keyword 'minItems' at $: no array of that
length is possible" (a keyword the client never wrote), and the same tool beside a good one was
silently left out of the grammar (200: the model could never call it). Paths inside a tool's
parameters read "$.$defs.tool_1...", and an "auto" strict tool's error "at $" named no tool."""
from __future__ import annotations

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

T = 120
GOOD = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# no value is valid: an object whose required member takes no value
NO_VALUE = {"type": "object", "properties": {"unit": {"enum": []}}, "required": ["unit"]}


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


def tool(name: str, parameters: dict, strict: bool | None = None) -> dict:
    fn = {"name": name, "parameters": parameters}
    if strict is not None:
        fn["strict"] = strict
    return {"type": "function", "function": fn}


def chat(srv, tools: list, tool_choice, **extra) -> requests.Response:
    body = {"model": "default", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
            "tool_choice": tool_choice, "max_tokens": 24, "temperature": 0, **extra}
    return requests.post(srv.url + "/v1/chat/completions", json=body, timeout=T)


def refusal(r: requests.Response) -> tuple[str, str]:
    assert r.status_code == 400, (r.status_code, r.text[:400])
    err = r.json()["error"]
    return err["message"], err["param"]


@pytest.mark.parametrize("tools, where, keyword", [
    # the only tool: was "keyword 'minItems' at $: no array of that length is possible"
    ([tool("get_weather", NO_VALUE)], "tools[0].function.parameters.properties.unit", "enum"),
    ([tool("get_weather", {"enum": []})], "tools[0].function.parameters", "enum"),
    # beside a good tool: was a 200 whose grammar had left get_unit out
    ([tool("get_weather", GOOD), tool("get_unit", NO_VALUE)], "tools[1].function.parameters.properties.unit", "enum"),
    # a schema that does not compile: was "at $.$defs.tool_1.properties.unit"
    ([tool("get_weather", GOOD), tool("get_unit", {"type": "object", "properties": {"unit": {"type": "kelvin"}}})],
     "tools[1].function.parameters.properties.unit", "type"),
], ids=["only-tool", "only-tool-root", "beside-a-good-tool", "does-not-compile"])
def test_required_tools_name_the_tool_whose_parameters_fail(srv, tools, where, keyword):
    for stream in (False, True):
        message, param = refusal(chat(srv, tools, "required", stream=stream))
        assert param == "tools" and f"keyword '{keyword}' at {where}" in message, message
        assert "minItems" not in message and "$defs" not in message, message
    wait_idle(srv.url)


def test_a_strict_auto_tool_and_a_named_tool_are_named_too(srv):
    # auto: a strict tool's schema is in a structural tag; its root error said "at $"
    message, param = refusal(chat(srv, [tool("get_weather", GOOD), tool("get_unit", {"type": "kelvin"}, True)],
                                  "auto"))
    assert param == "tools" and "keyword 'type' at tools[1].function.parameters:" in message, message
    # named: the function's own schema; its root error said "at $:"
    message, param = refusal(chat(srv, [tool("get_weather", GOOD), tool("get_unit", {"enum": []})],
                                  {"type": "function", "function": {"name": "get_unit"}}))
    assert param == "tools" and "keyword 'enum' at tools[1].function.parameters:" in message, message
    # the legacy functions name theirs
    r = requests.post(srv.url + "/v1/chat/completions", timeout=T, json={
        "model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "functions": [{"name": "get_weather", "parameters": GOOD}, {"name": "get_unit", "parameters": NO_VALUE}],
        "function_call": {"name": "get_unit"}})
    message, param = refusal(r)
    assert param == "functions" and "at functions[1].parameters.properties.unit" in message, message
    wait_idle(srv.url)


def test_good_tools_are_still_called_and_nothing_is_held(srv):
    r = chat(srv, [tool("get_weather", GOOD), tool("get_time", {"type": "object", "properties": {}})], "required")
    assert r.status_code == 200, r.text[:400]
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] in ("get_weather", "get_time") for c in calls), calls
    # a strict tool under auto, its schema compiled alone first: served
    r = chat(srv, [tool("get_weather", GOOD, True)], "auto")
    assert r.status_code == 200, r.text[:400]
    info = wait_idle(srv.url)
    assert info["protected_slots"] == 0 and info["free_slots"] + info["evictable_slots"] == info["total_slots"], info

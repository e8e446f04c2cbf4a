"""A grammar refused as it is read (empty, nested too deeply, half a character) on the OpenAI
routes names the field the client sent it in, against a real server (session 41): before, the
400 named treadle's own sampling field (`param` "json_schema", "regex", "choices": fields the
client never sent), where a grammar that failed to compile already named response_format,
guided_* or tools."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

T = 120


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


DEEP = nested(200)  # past the 128 levels a grammar may nest
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": DEEP}}}}


@pytest.mark.parametrize("route, fields, param, starts", [
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": DEEP}}},
     "response_format", "response_format.json_schema.schema nests more than 128 levels"),
    ("completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "string", "pattern": "\ud800"}}}}, "response_format", "response_format.json_schema.schema has a lone"),
    ("chat", {"response_format": {"type": "structural_tag", "structures": [
        {"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": []}}, "response_format",
     "response_format.triggers must be a non-empty list"),
    ("chat", {"guided_json": DEEP}, "guided_json", "guided_json nests more than 128 levels"),
    ("completions", {"guided_regex": "(" * 300 + ")" * 300}, "guided_regex", "guided_regex: its groups nest"),
    ("completions", {"guided_choice": ["a", ""]}, "guided_choice", "guided_choice must be a non-empty list"),
    ("chat", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools",
     "tools[0].function.parameters nests more than 128 levels"),
    ("chat", {"tools": [TOOL], "tool_choice": "required"}, "tools", "tools: the grammar of the calls"),
    # treadle's own field, sent as itself, keeps its name
    ("completions", {"regex": ""}, "regex", "regex must be a non-empty string"),
], ids=["response-format-deep", "response-format-surrogate", "structural-tag", "guided-json", "guided-regex",
        "guided-choice", "named-tool", "required-tools", "own-regex"])
def test_a_grammar_refused_as_read_names_the_field_sent(srv, route, fields, param, starts):
    body = {"model": "default", "max_tokens": 2, **fields}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Hi"
    r = requests.post(f"{srv.url}/v1/{route.replace('chat', 'chat/completions')}", data=json.dumps(body),
                      headers={"Content-Type": "application/json"}, timeout=T)
    assert r.status_code == 400, r.text[:400]
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(starts), err
    wait_idle(srv.url)

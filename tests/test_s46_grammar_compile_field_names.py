"""A schema that fails to compile (the scheduler's "grammar compilation failed: ...") on the
OpenAI routes names the field the client sent it in, not treadle's sampling field (session
46): the message read "grammar compilation failed: json_schema: keyword 'type' at $: ..."
under response_format, a guided_* alias or a tool's parameters, where only `param` was right.
/generate, where json_schema is the field sent, keeps that name."""
from __future__ import annotations

import openai
import pytest
import requests

from treadle.runtime.server.testing import wait_idle

T = 120
BAD = {"type": "nonsense"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": BAD}}}}


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


@pytest.mark.parametrize("fields, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD}}}, "response_format",
     "grammar compilation failed: response_format.json_schema.schema: keyword 'type' at $: unknown type 'nonsense'"),
    ({"extra_body": {"guided_json": BAD}}, "guided_json",
     "grammar compilation failed: guided_json: keyword 'type' at $: unknown type 'nonsense'"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tools",
     "grammar compilation failed: tools: keyword 'type' at tools[0].function.parameters.properties.a: "
     "unknown type 'nonsense'"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools",
     "grammar compilation failed: tools: keyword 'type' at tools[0].function.parameters.properties.a: "
     "unknown type 'nonsense'"),
], ids=["response-format", "guided-json", "required-tools", "named-tool"])
def test_a_compile_error_names_the_field_sent(srv, fields, param, message):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=T)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="default", max_tokens=2, messages=[{"role": "user", "content": "Hi"}],
                                       **fields)
    err = info.value.body
    assert err["param"] == param and err["message"] == message, err
    wait_idle(srv.url)


def test_generate_keeps_its_own_field_name(srv):
    r = requests.post(srv.url + "/generate", timeout=T, json={
        "text": "Hi", "sampling_params": {"max_new_tokens": 2, "json_schema": '{"type": "nonsense"}'}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "json_schema", err
    assert err["message"] == "grammar compilation failed: json_schema: keyword 'type' at $: unknown type 'nonsense'"
    wait_idle(srv.url)

"""Hostile and careless clients against a real server (session 47): numbers JSON has no
literal for (NaN, Infinity, 1e400) in a Responses body, whose reply echoes the request's
settings back."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import sse_events, wait_idle

T = 60


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle
    return plain_server


def _no_leaked_kv(url: str) -> None:
    info = wait_idle(url)
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"], info
    assert info["protected_slots"] == 0, info


_SCHEMA = '{"type": "object", "properties": {"a": {"type": "number", "maximum": %s}}, "required": ["a"]}'


@pytest.mark.parametrize("value", ["NaN", "1e400"])
@pytest.mark.parametrize("field,where,stream", [
    ('"top_p": %s', "top_p", False),
    ('"max_output_tokens": %s', "max_output_tokens", False),
    # tool_choice auto: the chat path takes the tool (its schema is only rendered into the
    # prompt), and the response echoes its parameters back
    ('"tools": [{"type": "function", "name": "f", "parameters": %s}]' % _SCHEMA, "tools", False),
    ('"tools": [{"type": "function", "name": "f", "parameters": %s}]' % _SCHEMA, "tools", True),
    ('"text": {"format": {"type": "json_schema", "name": "x", "schema": %s}}' % _SCHEMA, "text", False),
    # an input item's id is kept as it came, for GET .../input_items
    ('"input": [{"role": "user", "content": "Hi", "id": %s}]', "input", False),
])
def test_a_non_finite_number_in_a_responses_body_is_a_400_naming_it(srv, value, field, where, stream):
    """Python's JSON reader takes NaN, Infinity and 1e400 (as inf); the Responses reply echoes
    the request's settings as JSON, which has no such numbers: every one was a 500
    ("Out of range float values are not JSON compliant") from measuring the body for the
    store, before any check. Now a 400 naming the field, streamed or not."""
    body = json.loads('{"model": "default", "input": "Hi", "max_output_tokens": 2, "stream": %s, %s}' % (
        json.dumps(stream), field % value))
    r = requests.post(srv.url + "/v1/responses", data=json.dumps(body), headers={"Content-Type": "application/json"},
                      timeout=T)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == where and where in err["message"], err
    _no_leaked_kv(srv.url)

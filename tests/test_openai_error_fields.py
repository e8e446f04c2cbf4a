"""Odd OpenAI requests against a real server that were answered wrongly. Each test failed on the
code before its fix."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess

pytestmark = pytest.mark.slow
T = 60


@pytest.fixture(scope="module")
def srv():
    s = ServerProcess(["--max-total-tokens", "4096", "--log-level", "warning"])
    yield s
    s.close()


def post(srv, path: str, body: dict) -> requests.Response:
    return requests.post(srv.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"},
                         timeout=T)


@pytest.mark.parametrize("path,body,name", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "min_tokens": 3},
     "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2,
                              "min_tokens": 3}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 20}, "max_tokens"),  # OpenAI's default of 16
])
def test_min_tokens_over_max_tokens_names_the_fields_the_client_sent(srv, path, body, name):
    """The message said "min_tokens must be in [0, max_new_tokens=2]": a field (treadle's
    native name) the OpenAI request did not have."""
    r = post(srv, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "min_tokens" and "max_new_tokens" not in err["message"], err
    assert f"{name}=" in err["message"], err


def test_a_named_tool_choice_with_a_response_format_names_the_function(srv):
    """The 400 said "tool_choice 'named' constrains the reply itself": 'named' is treadle's word
    for the object the client sent, not a tool_choice value."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = post(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_object"}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tool_choice" and "'named'" not in err["message"], err
    assert "get_weather" in err["message"], err

"""Tools meeting the request limits: with `parallel_tool_calls: false` (and legacy `functions`)
the server ends the reply at its first call by adding `</tool_call>` to `stop`, and that string
counted against the client's 128 stop strings: a request with the 128 the docs allow was a 400
"stop has 129 entries"."""
from __future__ import annotations

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

pytestmark = pytest.mark.slow
T = 120
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
STOPS = [f"stop{i}" for i in range(128)]


@pytest.fixture(scope="module")
def srv(plain_server):
    return plain_server  # shared with other modules (conftest.py)


def chat(srv, **fields) -> requests.Response:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    return requests.post(srv.url + "/v1/chat/completions", json=body, timeout=T)


@pytest.mark.parametrize("tools", [
    {"tools": [TOOL], "parallel_tool_calls": False},
    {"tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False},
    {"functions": [{"name": "f", "parameters": {"type": "object"}}]},
], ids=["tools_no_parallel", "tools_auto_no_parallel", "legacy_functions"])
def test_the_128_stop_strings_allowed_are_allowed_beside_single_call_tools(srv, tools):
    r = chat(srv, stop=STOPS, **tools)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls", "function_call")


def test_the_stop_limit_counts_the_clients_strings_only_and_still_holds(srv):
    # the closing tag already among the client's 128: not added a second time
    r = chat(srv, stop=[*STOPS[:127], "</tool_call>"], tools=[TOOL], parallel_tool_calls=False)
    assert r.status_code == 200, r.text[:300]
    r = chat(srv, stop=[*STOPS, "one more"], tools=[TOOL], parallel_tool_calls=False)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == "stop"
    assert wait_idle(srv.url)["num_in_flight"] == 0

"""A chat reply with tools that nests past what Python's json reads (a thousand "["), against a
real server (session 41): the reply is parsed for tool calls, and json.loads raised a
RecursionError, a 500 (streamed: the body cut off mid-stream). It is content, as any reply
that is not a call of a listed tool."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from treadle.runtime.server.testing import sse_events, wait_idle

T = 300
TOOLS = [{"type": "function", "function": {"name": "get_w", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: this test leaves it idle
    return plain_server


def test_a_reply_nested_past_what_json_reads_is_content_not_a_500(srv):
    pair = requests.post(srv.url + "/tokenize", json={"prompt": "[["}, timeout=T).json()["tokens"]
    assert len(pair) == 1  # one token of two brackets: 520 steps write 1,040 nested arrays
    body = {"model": "default", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "max_tokens": 520,
            "temperature": 0, "logit_bias": {str(pair[0]): 100}}
    url = srv.url + "/v1/chat/completions"
    with ThreadPoolExecutor(2) as pool:  # both at once: one batch of decode steps
        plain = pool.submit(requests.post, url, json=body, timeout=T)
        streamed = pool.submit(requests.post, url, json={**body, "stream": True}, timeout=T, stream=True)
        r, s = plain.result(), streamed.result()
        assert r.status_code == 200, r.text[:300]  # was a 500: RecursionError
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == "[" * 1040 and not choice["message"].get("tool_calls"), choice
        assert choice["finish_reason"] == "length", choice
        events = sse_events(s)  # was cut off: "incomplete chunked read"
    assert events[-1] == "[DONE]", events[-2:]
    text = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
    assert text == "[" * 1040 and not any(c["delta"].get("tool_calls") for e in events[:-1] for c in e["choices"])
    wait_idle(srv.url)

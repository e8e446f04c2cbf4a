"""The server stays responsive to every client whatever one client sends. Here:
chat_template_kwargs naming the renderer's own arguments is a 400 naming the key (failed on
the code before its fix)."""
from __future__ import annotations

import json

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess

pytestmark = pytest.mark.slow
T = 300


@pytest.fixture(scope="module")
def srv():
    s = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"])
    yield s
    s.close()


def post(srv, path: str, body, **kw) -> requests.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(srv.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=T, **kw)


# ---------------------------------------------------------------- chat_template_kwargs


@pytest.mark.parametrize("key", ["self", "conversations", "conversation", "messages", "tokenize", "documents"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_chat_template_kwargs_naming_the_renderers_arguments_is_400(srv, path, key):
    """{"self": 1} (and "conversations") reached the renderer as a second value of its own
    argument: a 400 quoting transformers' TypeError ("apply_chat_template() got multiple
    values for argument 'self'") with param "messages". Now the 400 names the field and the
    key."""
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": 1, key: 1}}
    if path != "/tokenize":
        body["max_tokens"] = 2
    r = post(srv, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "chat_template_kwargs", err
    assert repr(key) in err["message"] and "multiple values" not in err["message"], err


def test_chat_template_kwargs_variables_still_reach_the_template(srv):
    msgs = [{"role": "user", "content": "hi"}]
    base = post(srv, "/tokenize", {"messages": msgs}).json()["tokens"]
    r = post(srv, "/tokenize", {"messages": msgs, "chat_template_kwargs": {"kwargs": 1, "args": 2,
                                                                           "enable_thinking": False}})
    assert r.status_code == 200 and r.json()["tokens"] == base, r.text
    r = post(srv, "/tokenize", {"messages": msgs, "chat_template_kwargs": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"

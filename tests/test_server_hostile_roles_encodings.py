"""Hostile clients, found by exploring a real server: chat messages with a role no OpenAI API
has, or a user message with no content (both were rendered silently into the prompt); bodies
sent compressed (a 400 "not valid JSON", where HTTP says 415); logit_bias keys written in other
scripts' digits ("٥" was read as token 5) or past int()'s digit limit (a 400 quoting Python's
conversion error); and n samples or a list of prompts with a grammar that does not compile
(their shared prompt was prefilled first, for nothing). Each test failed before its fix."""
from __future__ import annotations

import gzip
import json
import zlib

import openai
import pytest
import requests

from treadle.runtime.server.testing import wait_idle

pytestmark = pytest.mark.slow
T = 60
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


def post(srv, path: str, body, headers: dict | None = None) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return requests.post(srv.url + path, data=data, headers=headers or {"Content-Type": "application/json"},
                         timeout=T)


def chat(srv, messages: list, **kw) -> requests.Response:
    return post(srv, "/v1/chat/completions", {"model": "default", "messages": messages, "max_tokens": 2, **kw})


@pytest.mark.parametrize("role", ["foo", "User", "ipython", ""])
def test_an_unknown_chat_role_is_a_400_naming_it(srv, role):
    r = chat(srv, [{"role": "system", "content": "be brief"}, {"role": role, "content": "hi"}])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[1].role" and repr(role) in err["message"], err
    # through the openai client too
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="messages\\[0\\].role"):
        c.chat.completions.create(model="default", messages=[{"role": role, "content": "hi"}], max_tokens=2)


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
@pytest.mark.parametrize("content", ["missing", None])
def test_a_message_without_content_is_a_400(srv, role, content):
    m = {"role": role} if content == "missing" else {"role": role, "content": content}
    r = chat(srv, [*HI, {"role": "assistant", "content": "hello"}, m])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[2].content" and role in err["message"], err


def test_the_roles_openai_has_are_served(srv):
    msgs = [{"role": "developer", "content": "be brief"}, *HI, {"role": "assistant"},
            {"role": "function", "name": "f", "content": "1"}, {"role": "user", "content": ""}]
    r = chat(srv, msgs)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("coding,encode", [("gzip", gzip.compress), ("deflate", zlib.compress),
                                           ("br", lambda b: b), ("GZIP", gzip.compress)])
@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions", "/abort_request"])
def test_a_compressed_body_is_a_415(srv, coding, encode, path):
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}} if path == "/generate" else \
        {"rid": "x"} if path == "/abort_request" else {"model": "default", "messages": HI, "max_tokens": 1}
    r = post(srv, path, encode(json.dumps(body).encode()),
             {"Content-Type": "application/json", "Content-Encoding": coding})
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_content_encoding", r.text
    assert coding.lower() in r.json()["error"]["message"]
    assert r.headers.get("Accept-Encoding") == "identity"
    ok = post(srv, path, json.dumps(body).encode(), {"Content-Type": "application/json", "Content-Encoding": "identity"})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("key", ["٥", "５", "1" * 5000, "१२"])
def test_logit_bias_keys_are_ascii_token_ids(srv, key):
    for r in (chat(srv, HI, logit_bias={key: 5}),
              post(srv, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1, "logit_bias": {key: 5}}})):
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "logit_bias" and "token ids" in err["message"], err


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": HI, "n": 3, "regex": "(ab"}, "regex"),
    ("/v1/completions", {"prompt": ["One, two,", "Three, four,"], "regex": "(ab"}, "regex"),
    ("/v1/chat/completions", {"messages": HI, "n": 2, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "multipleOf": 7}}}},
     "response_format"),
    ("/v1/chat/completions", {"messages": HI, "n": 2, "guided_json": {"type": "integer", "multipleOf": 7}},
     "guided_json"),
    ("/v1/chat/completions", {"messages": HI, "n": 2, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "a"}}}]},
     "tools"),
])
def test_a_bad_grammar_shared_by_several_requests_runs_none_of_them(srv, path, body, param):
    """And the 400 names the field the client sent (response_format and guided_json were
    named json_schema), with one request as with several."""
    before = wait_idle(srv.url)
    r = post(srv, path, {"model": "default", "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    after = wait_idle(srv.url)
    assert (after["requests"], after["prompt_tokens"]) == (before["requests"], before["prompt_tokens"])
    one = post(srv, path, {"model": "default", "max_tokens": 2, **body, "n": 1})
    assert one.status_code == 400 and one.json()["error"]["param"] == param, one.text

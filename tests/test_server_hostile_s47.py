"""Hostile and careless clients against a real server (session 47): numbers JSON has no
literal for (NaN, Infinity, 1e400) in a Responses body, whose reply echoes the request's
settings back."""
from __future__ import annotations

import json
import socket

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


def _generated(url: str) -> int:
    return requests.get(url + "/get_server_info", timeout=T).json()["generated_tokens"]


_LONG_CALL = {"model": "default", "messages": [{"role": "user", "content": "Write a long note."}], "stream": True,
              "max_tokens": 1500, "tool_choice": "required",
              "tools": [{"type": "function", "function": {"name": "note", "parameters": {
                  "type": "object", "properties": {"text": {"type": "string", "minLength": 1200}},
                  "required": ["text"]}}}]}


def test_a_client_that_closes_a_stream_gone_silent_is_noticed(srv):
    """A tool_choice "required" stream holds its calls back until they parse whole, writing
    nothing meanwhile: a client that closed its socket then went unnoticed (a closed socket
    answers only what is written to it) and its request ran on to its end, here 1,200
    characters and more of a forced argument (~300 tokens and more). The half-close probe now
    writes an SSE comment to a started stream, the reset that answers it aborts the request. A
    client that only half-closed still reads the whole stream, the comments skipped as SSE
    readers skip them."""
    before = _generated(srv.url)
    r = requests.post(srv.url + "/v1/chat/completions", json=_LONG_CALL, stream=True, timeout=T)
    lines = r.iter_lines()
    assert next(lines).startswith(b"data: ")  # the role's chunk; then silence until the call is whole
    r.close()
    _no_leaked_kv(srv.url)
    assert _generated(srv.url) - before < 200  # aborted a second or so after it left, not at its end

    body = json.dumps({**_LONG_CALL, "max_tokens": 10}).encode()  # its prompt and grammar cached now
    with socket.create_connection(("127.0.0.1", srv.port), timeout=T) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    while reply.startswith(b"HTTP/1.1 100 "):  # interim probes while the stream had not started
        reply = reply.partition(b"\r\n\r\n")[2]
    head, _, raw = reply.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0] and b"chunked" in head.lower(), head
    text = b""
    while True:  # the chunked body, unframed
        size, _, raw = raw.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        text, raw = text + raw[:n], raw[n + 2:]
    blocks = [b for b in text.decode().split("\n\n") if b]
    events = [json.loads(b[len("data: "):]) for b in blocks if b.startswith("data: {")]
    assert blocks[-1] == "data: [DONE]" and events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(b.startswith("data: ") or b == ":" for b in blocks), blocks
    _no_leaked_kv(srv.url)


@pytest.mark.parametrize("route,base", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/completions", {"prompt": "Hi"}),
])
@pytest.mark.parametrize("field,value", [
    ("user", 5), ("service_tier", ["auto"]), ("prompt_cache_key", {"k": 1}), ("safety_identifier", 1.5),
    ("store", "yes"), ("metadata", "x"), ("metadata", {"k": 1}),
])
def test_a_label_of_the_wrong_type_is_a_400_naming_it(srv, route, base, field, value):
    """OpenAI's labels and hints (user, metadata, store, ...) change nothing here, but one of
    the wrong type is a client's mistake: taken at any type on the chat and completions routes
    (a 200), while /v1/responses refused the same fields by name. The openai client now gets a
    BadRequestError naming the field, on every route."""
    import openai

    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    create = client.chat.completions.create if "chat" in route else client.completions.create
    with pytest.raises(openai.BadRequestError) as e:
        create(model="default", max_tokens=1, extra_body={field: value}, **base)
    assert e.value.body["param"] == field and field in e.value.body["message"], e.value.body


def test_required_tool_calls_stream_each_as_it_closes(srv):
    """A tool_choice "required" stream held every call back until the reply ended: silent
    while the model wrote them (a client saw nothing, and a client gone was not noticed), all
    at once at the end. Each call now comes as soon as its array item is whole, the last one
    (cut by max_tokens or not) at the end; the calls add up to the unstreamed reply's."""
    body = {"model": "default", "messages": [{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}],
            "tool_choice": "required", "max_tokens": 30, "temperature": 0, "logprobs": True,
            # no "]" or "}]": the array goes on past its first call, until max_tokens cuts the next
            "logit_bias": {"77": -100, "31845": -100}}
    whole = requests.post(srv.url + "/v1/chat/completions", json=body, timeout=T).json()["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]]
    assert len(calls) == 2 and whole["finish_reason"] == "length", whole

    r = requests.post(srv.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=T)
    tokens, first_call_at, streamed = 0, None, {}
    for e in sse_events(r):
        if e == "[DONE]":
            break
        choice = e["choices"][0]
        tokens += len((choice.get("logprobs") or {}).get("content") or ())  # a token's logprob comes as it is made
        for c in choice["delta"].get("tool_calls") or ():
            first_call_at = tokens if first_call_at is None else first_call_at
            name, args = streamed.get(c["index"], ("", ""))
            streamed[c["index"]] = (name + c["function"].get("name", ""), args + c["function"].get("arguments", ""))
    assert [streamed[i] for i in sorted(streamed)] == calls
    assert first_call_at is not None and first_call_at < tokens, (first_call_at, tokens)
    _no_leaked_kv(srv.url)

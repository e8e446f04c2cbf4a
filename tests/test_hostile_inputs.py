"""Hostile inputs against a real server (issue 32): each numbered item of the issue has a test
here that failed on the code before its fix. No 5xx for anything a client sends, and no
request can hurt another one."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
import requests

from test_hostile_batch import GREEDY, PROMPTS, SAMPLED, run_concurrently
from treadle.runtime.server.testing import wait_idle

pytestmark = pytest.mark.slow
T = 120
PROMPT = "The capital of France is"
RUNNING, QUEUED = 4, 8  # conftest's limited_server: --max-running-requests / --max-queued-requests


@pytest.fixture(scope="module")
def srv(limited_server):  # conftest's shared server of 4 running / 8 queued: left idle
    return limited_server


def post(srv, path: str, body, status: int | None = None, **kw) -> requests.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    r = requests.post(srv.url + path, data=data, headers=headers, timeout=T, **kw)
    if status is not None:
        assert r.status_code == status, (r.status_code, r.text[:500])
    return r


def greedy(n: int = 4, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra}


def param_of(r: requests.Response) -> str | None:
    return r.json()["error"]["param"]


# ---------------------------------------------------------------- 1. poison parameters


@pytest.mark.parametrize("field,value", [("repetition_penalty", 1e-40), ("repetition_penalty", 1e-300),
                                         ("temperature", 1e300)])
def test_params_that_make_logits_non_finite_are_400(srv, field, value):
    r = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, **{field: value})}, 400)
    assert param_of(r) == field
    r = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, field: value}, 400)
    assert field in r.json()["error"]["message"]


# ---------------------------------------------------------------- 2. huge numbers


@pytest.mark.parametrize("field", ["temperature", "top_p", "frequency_penalty", "min_p"])
def test_401_digit_int_in_a_float_field_is_400(srv, field):
    body = '{"text": "hi", "sampling_params": {"%s": %s}}' % (field, "9" * 401)
    r = post(srv, "/generate", body, 400)
    assert param_of(r) == field, r.text


@pytest.mark.parametrize("path,template,field", [
    ("/generate", '{"text": "hi", "sampling_params": {"max_new_tokens": %s}}', "max_new_tokens"),
    ("/generate", '{"input_ids": [1, 2, %s]}', "input_ids"),
    ("/abort_request", '{"rid": %s}', "rid"),
    ("/detokenize", '{"tokens": [1, %s]}', "tokens"),
    ("/tokenize", '{"prompt": %s}', "prompt"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": %s}', "max_tokens"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "seed": %s}', "seed"),
])
def test_int_past_4300_digits_is_400_naming_the_field(srv, path, template, field):
    r = post(srv, path, template % ("7" * 5000), 400)
    assert param_of(r) == field, r.text


# ---------------------------------------------------------------- 3. deep nesting inside strings

DEEP = 100_000


@pytest.mark.parametrize("path,body,field", [
    ("/generate", {"text": "hi", "sampling_params": {"json_schema": "[" * DEEP}}, "json_schema"),
    ("/generate", {"text": "hi", "sampling_params": {"json_schema": '{"items":' * DEEP + "{}" + "}" * DEEP}},
     "json_schema"),
    ("/generate", {"text": "hi", "sampling_params": {"structural_tag": '{"a":' * DEEP + "1" + "}" * DEEP}},
     "structural_tag"),
    ("/generate", {"text": "hi", "sampling_params": {"ebnf": "root ::= " + "(" * DEEP + '"a"' + ")" * DEEP}},
     "ebnf"),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "(" * DEEP + "a" + ")" * DEEP}}, "regex"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "guided_json": "[" * DEEP}, "json_schema"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                              "guided_grammar": "root ::= " + "(" * DEEP + '"a"' + ")" * DEEP}, "ebnf"),
])
def test_deep_nesting_inside_a_grammar_string_is_400(srv, path, body, field):
    r = post(srv, path, body, 400)
    assert "nest" in r.json()["error"]["message"], r.text
    assert param_of(r) in (field, "guided_json", "guided_grammar"), r.text
    post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2)}, 200)  # the server lives on


# ---------------------------------------------------------------- 4. a batch that can never fit


def test_batch_larger_than_the_in_flight_limit_is_400(srv):
    r = post(srv, "/generate", {"text": ["a"] * (RUNNING + QUEUED + 1), "sampling_params": greedy(1)}, 400)
    assert "never" in r.json()["error"]["message"] or "at once" in r.json()["error"]["message"]
    r = post(srv, "/v1/completions", {"prompt": ["a"] * (RUNNING + QUEUED + 1), "max_tokens": 1}, 400)
    post(srv, "/generate", {"text": ["a"] * (RUNNING + QUEUED), "sampling_params": greedy(1)}, 200)


# ---------------------------------------------------------------- 5. keep-alive after a 5xx


def test_keep_alive_connection_survives_bad_requests(srv):
    """Requests that were 500s (and closed the connection without saying so) interleaved with
    good ones on one keep-alive connection: every good one is answered."""
    host, port = srv.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=T)
    bad = ['{"text": "hi", "sampling_params": {"temperature": %s}}' % ("9" * 401),
           '{"rid": %s}' % ("7" * 5000),
           json.dumps({"text": "hi", "sampling_params": {"json_schema": "[" * DEEP}})]
    for body in bad:
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status < 500 or resp.getheader("connection", "").lower() == "close"
        if resp.getheader("connection", "").lower() == "close":
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=T)
        conn.request("POST", "/generate", body=json.dumps({"text": "hi", "sampling_params": greedy(1)}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
    conn.close()


def test_gate_answers_an_unhandled_error_and_keeps_the_connection():
    """The server's Gate around a route that raises (no client request reaches one any more, so
    the failure is made here): a 500 in the error shape, and the same keep-alive connection
    then serves the next request (uvicorn used to drop it unannounced)."""
    import types

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from treadle.runtime.engine_args import EngineArgs
    from treadle.runtime.server.http_server import Gate
    from treadle.runtime.server.metrics import ServerMetrics
    from treadle.runtime.server.protocol import error_body
    from treadle.runtime.server.testing import free_port

    app = FastAPI()

    @app.exception_handler(Exception)  # as the server's app: renders the error, then re-raises it
    async def internal(_, e: Exception):
        return JSONResponse(error_body(f"internal server error: {type(e).__name__}: {e}", "server_error"), 500)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("a bug")

    @app.get("/fine")
    async def fine():
        return {"ok": True}

    state = types.SimpleNamespace(args=EngineArgs(), metrics=ServerMetrics(),
                                  tm=types.SimpleNamespace(draining=False, num_in_flight=0, max_in_flight=1))
    app.add_middleware(Gate, state=state)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=T)
        for _ in range(3):
            conn.request("GET", "/boom")
            resp = conn.getresponse()
            assert resp.status == 500 and "RuntimeError: a bug" in json.loads(resp.read())["error"]["message"]
            conn.request("GET", "/fine")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read()) == {"ok": True}
        conn.close()
    finally:
        server.should_exit = True
        thread.join(30)


# ---------------------------------------------------------------- 6. overload answers fast


def test_overload_is_refused_with_retry_after(srv):
    """Fill the server to its limit with slow requests: the next ones get a 503 with Retry-After
    (before their body is read), and a request fits again once the filling ones are aborted."""
    results: list[requests.Response] = []
    limit = RUNNING + QUEUED

    def fill(i):
        results.append(post(srv, "/generate", {"text": PROMPT, "rid": f"fill-{i}",
                                               "sampling_params": greedy(400)}))

    threads = [threading.Thread(target=fill, args=(i,)) for i in range(limit)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + T
    while requests.get(srv.url + "/get_server_info", timeout=T).json()["num_in_flight"] < limit:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        for body in ({"text": PROMPT, "sampling_params": greedy(1)}, b"{not even json"):
            r = post(srv, "/generate", body, 503)
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "server_overloaded"
        r = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 503)
        assert r.headers["retry-after"] == "1"
    finally:
        for i in range(limit):
            post(srv, "/abort_request", {"rid": f"fill-{i}"})
        for t in threads:
            t.join()
    assert [r.status_code for r in results] == [200] * limit
    wait_idle(srv.url)
    post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(1)}, 200)


# ---------------------------------------------------------------- 7. health probes


def test_health_generate_takes_no_slot_from_generate(srv):
    """Many probes at once hold at most one generation slot: the limit's slots stay for requests."""
    probes: list[int] = []
    gens: list[int] = []

    def probe():
        probes.append(requests.get(srv.url + "/health_generate", timeout=T).status_code)

    def gen():
        gens.append(post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(8)}).status_code)

    threads = [threading.Thread(target=probe) for _ in range(40)]
    threads += [threading.Thread(target=gen) for _ in range(RUNNING + QUEUED - 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gens == [200] * (RUNNING + QUEUED - 1)
    assert probes == [200] * 40
    wait_idle(srv.url)


# ---------------------------------------------------------------- 8. keyless server: browsers


def test_keyless_server_refuses_simple_cross_site_posts(srv):
    body = json.dumps({"text": PROMPT, "sampling_params": greedy(1)})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = requests.post(srv.url + "/generate", data=body, headers={"Content-Type": ctype}, timeout=T)
        assert r.status_code == 415, (ctype, r.status_code, r.text)
    r = requests.post(srv.url + "/flush_cache", headers={"Content-Type": "text/plain"}, timeout=T)
    assert r.status_code == 415
    # a page of another origin posting with no body (no content type at all)
    r = requests.post(srv.url + "/flush_cache", headers={"Origin": "https://evil.example"}, timeout=T)
    assert r.status_code == 403
    # JSON, with or without a charset, still works; so does a body with no content type
    post(srv, "/generate", body, 200, headers={"Content-Type": "application/json; charset=utf-8"})
    assert requests.post(srv.url + "/generate", data=body, timeout=T).status_code == 200


def test_keyless_server_checks_the_host_header(srv):
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 sends Host:
    evil.example; the server answers only to its own names and IP literals."""
    for host in ("evil.example", "evil.example:" + srv.url.rsplit(":", 1)[1]):
        r = requests.get(srv.url + "/get_model_info", headers={"Host": host}, timeout=T)
        assert r.status_code == 403, (host, r.status_code)
        r = requests.post(srv.url + "/generate", data=json.dumps({"text": "hi"}),
                          headers={"Host": host, "Content-Type": "application/json"}, timeout=T)
        assert r.status_code == 403
    port = srv.url.rsplit(":", 1)[1]
    for host in ("127.0.0.1:" + port, "localhost:" + port, "localhost", "[::1]:" + port):
        r = requests.get(srv.url + "/get_model_info", headers={"Host": host}, timeout=T)
        assert r.status_code == 200, (host, r.status_code)
    assert requests.get(srv.url + "/health", headers={"Host": "evil.example"}, timeout=T).status_code == 403


# ---------------------------------------------------------------- clients that go away


def _responses(srv, status: str) -> float:
    """treadle_http_responses_total summed over routes for one status, from /metrics."""
    text = requests.get(srv.url + "/metrics", timeout=T).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("treadle_http_responses_total{") and f'status="{status}"' in line)


def test_client_gone_mid_body_is_no_server_error(srv):
    """Slow clients that send part of a body and hang up (slowloris, a killed upload) are
    aborted requests, not internal errors: no 500 counted, no traceback logged (300 of them
    once filled the log with 'internal error on /generate'), and the server serves on."""
    host, port = srv.url.split("//")[1].split(":")
    before, logged = _responses(srv, "500"), srv.log_tail(1 << 24).count("internal error")
    for path in ("/generate", "/v1/chat/completions", "/tokenize"):
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=T) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             "Content-Length: 1000\r\n\r\n{\"text\": ".encode())
                time.sleep(0.2)
    post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(1)}, 200)
    time.sleep(0.5)
    assert _responses(srv, "500") == before
    assert srv.log_tail(1 << 24).count("internal error") == logged


# ---------------------------------------------------------------- 9. expensive grammars
# (the size cap's 400 for a 10,000-property schema and 5,000 alternatives with classes:
# tests/test_grammar_limits.py)


def test_regex_of_5000_literal_alternatives_compiles(srv):
    """5,000 word alternatives pass the size cap (a small automaton) and the lazy index reads
    them at once, but the dialect check ran interegular's DFA build first: a minute, then a
    400 "timed out" (the compile timeout). Now the request is served, its text one of them."""
    words = [f"w{i}" for i in range(5000)]
    r = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(4, regex="(" + "|".join(words) + ")")})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["text"] in words


# ---------------------------------------------------------------- lone surrogates ("\\ud800")
# JSON's "\\ud800" escape parses to half a character, which UTF-8 cannot write: a response
# that quoted it (an error naming the field, the rid in meta_info) failed to render, a 500; a
# grammar holding one failed to compile with a message about the token index

LONE = "\ud800"


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "hi", LONE: 1}),
    ("/generate", {"text": "hi", "sampling_params": {LONE: 1}}),
    ("/v1/completions", {"prompt": "hi", LONE: 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], LONE: 1}),
    ("/tokenize", {"prompt": "hi", LONE: 1}),
    ("/detokenize", {"tokens": [1], LONE: 1}),
])
def test_unknown_field_named_by_a_lone_surrogate_is_400(srv, path, body):
    r = post(srv, path, body, 400)
    assert "unknown" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "hi", "rid": "a" + LONE, "sampling_params": greedy(2)}),
    ("/generate", {"text": "hi", "rid": "a" + LONE, "stream": True, "sampling_params": greedy(2)}),
    ("/generate", {"text": ["hi", "yo"], "rid": ["a", "b" + LONE], "sampling_params": greedy(2)}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "rid": LONE, "max_tokens": 2}),
])
def test_rid_with_a_lone_surrogate_is_400(srv, path, body):
    r = post(srv, path, body, 400)
    assert param_of(r) == "rid" and "surrogate" in r.json()["error"]["message"], r.text


def test_empty_rid_is_no_rid(srv):
    # a batch's one rid names its items "<rid>-<i>"; an empty one named them "-0", "-1"
    for body in ({"text": ["hi", "yo"], "rid": "", "sampling_params": greedy(2)},
                 {"text": ["hi", "yo"], "rid": ["", ""], "sampling_params": greedy(2)},
                 {"text": "hi", "rid": "", "sampling_params": greedy(2)}):
        out = post(srv, "/generate", body, 200).json()
        ids = [o["meta_info"]["id"] for o in (out if isinstance(out, list) else [out])]
        assert all(i and not i.startswith("-") for i in ids) and len(set(ids)) == len(ids), ids


@pytest.mark.parametrize("field,value", [
    ("regex", "a" + LONE), ("ebnf", 'root ::= "' + LONE + '"'), ("choices", ["yes", LONE]), ("stop", [LONE]),
    ("json_schema", {"enum": ["a" + LONE]}), ("json_schema", '{"const": "\\ud800"}'),
    ("json_schema", {"type": "object", "properties": {LONE: {"type": "string"}}}),
    ("structural_tag", {"structures": [{"begin": "<" + LONE, "schema": {}, "end": ">"}], "triggers": ["<"]}),
])
def test_grammar_or_stop_with_a_lone_surrogate_is_400_naming_it(srv, field, value):
    r = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, **{field: value})}, 400)
    assert param_of(r) == field and "lone surrogate" in r.json()["error"]["message"], r.text
    # a whole character written as its surrogate pair is no lone one
    if field == "json_schema" and isinstance(value, str):
        pair = '{"const": "\\ud83d\\ude00"}'
        post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, json_schema=pair)}, 200)


def test_tool_call_arguments_with_a_lone_surrogate_escape_are_answered(srv):
    """A model may write "\\ud800" (valid JSON text) in a tool call's arguments: parsed and
    written out again, the reply held half a character and failed to encode, a 500 (streamed:
    a body cut short). Forced here by a regex beside tools (auto parses the reply as usual)."""
    import re

    from treadle.runtime.server.testing import sse_events

    tools = [{"type": "function", "function": {"name": "get_w", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    out = '<tool_call>{"name": "get_w", "arguments": {"city": "\\ud800"}}</tool_call>'
    body = {"messages": [{"role": "user", "content": "weather?"}], "tools": tools, "max_tokens": 60,
            "temperature": 0, "regex": re.escape(out)}
    r = post(srv, "/v1/chat/completions", body, 200)
    call = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_w" and json.loads(call["arguments"]) == {"city": LONE}
    r = post(srv, "/v1/chat/completions", {**body, "stream": True}, 200, stream=True)
    events = sse_events(r)
    assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict)), events[-3:]
    post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2)}, 200)


def test_logit_bias_and_renamed_fields_are_named_in_their_400(srv):
    # "\u00b2".isdigit() is true but int() refuses it: the message was int()'s, naming no field
    r = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, logit_bias={"\u00b2": 1})}, 400)
    assert param_of(r) == "logit_bias", r.text
    r = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "include_stop_str_in_output": "yes"}, 400)
    assert param_of(r) == "include_stop_str_in_output" and "no_stop_trim" not in r.text, r.text
    r = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, json_schema=5)}, 400)
    assert param_of(r) == "json_schema", r.text
    info = wait_idle(srv.url)
    assert info["protected_slots"] == 0 and info["failed_rows"] == 0
    post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2)}, 200)


def test_abort_request_with_an_unknown_field_is_400(srv):
    """/abort_request read rid and ignored the rest: a misspelt field was a 200 {"success":
    false} that stopped nothing. SGLang's abort_all is taken (tests/test_server_abort_all.py),
    as a boolean only."""
    for field in ("rid_", "abortAll"):
        r = post(srv, "/abort_request", {"rid": "x", field: True}, 400)
        assert param_of(r) == field and "unknown" in r.json()["error"]["message"], r.text
    r = post(srv, "/abort_request", {"rid": "x", "abort_all": "true"}, 400)
    assert param_of(r) == "abort_all", r.text
    assert post(srv, "/abort_request", {"rid": "x"}, 200).json() == {"success": False}


def test_more_stop_strings_than_the_cap_is_400(srv):
    """Each stop string is looked for after every token, in the detokenizer process and the
    scheduler step all requests share: 200,000 of them (a 1.6 MB body) took the detokenizer
    0.4 s a token, every other client's output waiting meanwhile. Now more than 128 stop
    strings (or more stop_token_ids than the vocabulary has) is a 400 naming the field."""
    stops = [f"QZX{i}" for i in range(129)]
    r = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, stop=stops)}, 400)
    assert param_of(r) == "stop" and "128" in r.json()["error"]["message"], r.text
    r = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                           "stop": stops}, 400)
    assert param_of(r) == "stop", r.text
    r = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, stop_token_ids=[5] * 49153)}, 400)
    assert param_of(r) == "stop_token_ids", r.text
    post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, stop=stops[:128])}, 200)
    post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(2, stop_token_ids=[5] * 49152)}, 200)


def test_many_tools_or_messages_are_refused_before_any_rendering(srv):
    """tools were checked for a second function of a name by a scan of the list per tool:
    40,000 tools (a 2 MB body) held a builder thread for 44 s before the 400 (a 64 MiB body,
    hours), four such requests stopping every other client's request from being built. Now
    more than 1,024 tools is a 400 naming the field at once, and more messages than the
    context holds tokens is a 400 before the template renders them; duplicate names are
    still found."""
    tool = lambda i: {"type": "function", "function": {"name": f"f{i}"}}  # noqa: E731
    msgs = [{"role": "user", "content": "hi"}]
    r = post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "tools": [tool(i) for i in range(1025)]},
             400)
    assert param_of(r) == "tools" and "1025" in r.json()["error"]["message"], r.text
    r = post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "tools": [tool(1), tool(2), tool(1)]},
             400)
    assert param_of(r) == "tools" and "tools[2]" in r.json()["error"]["message"], r.text
    for path in ("/v1/chat/completions", "/tokenize"):
        r = post(srv, path, {"messages": msgs * 8193}, 400)
        assert param_of(r) == "messages" and "8193 messages" in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------- bystanders of each poison
# (a non-finite logits row deep in a batch: test_hostile_batch.py, in the Engine)

def gen_http(srv, body: dict) -> requests.Response:
    return requests.post(srv.url + "/generate", json=body, timeout=T)


POISONS = {
    "repetition_penalty": {"text": PROMPTS[0], "sampling_params": {**SAMPLED, "repetition_penalty": 1e-40}},
    "deep-json_schema": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "json_schema": "[" * DEEP}},
    "deep-structural_tag": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "structural_tag":
                                                                    '{"a":' * DEEP + "1" + "}" * DEEP}},
    "deep-ebnf": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "ebnf": "root ::= " + "(" * DEEP + '"a"'
                                                          + ")" * DEEP}},
    # passes the HTTP checks, fails in the scheduler's compile worker
    "compile-fails": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "regex": "(?=a)b"}},
}


@pytest.fixture(scope="module")
def alone(srv):
    """Each bystander's output sent alone."""
    return [gen_http(srv, {"text": p, "sampling_params": sp}).json()["output_ids"]
            for p in PROMPTS for sp in (GREEDY, SAMPLED)]


def test_bystanders_unaffected_by_poison_requests(srv, alone):
    """Ordinary requests sent together with one of each poison: the same outputs as alone; each
    poison a 400 of its own; nothing failed in a batch step, nothing left in flight."""
    fns = [lambda p=p, sp=sp: gen_http(srv, {"text": p, "sampling_params": sp})
           for p in PROMPTS for sp in (GREEDY, SAMPLED)]
    fns += [lambda body=body: gen_http(srv, body) for body in POISONS.values()]
    res = run_concurrently(fns)
    together, poisons = res[:len(alone)], res[len(alone):]
    assert [r.status_code for r in together] == [200] * len(together)
    assert [r.json()["output_ids"] for r in together] == alone
    for kind, p in zip(POISONS, poisons):
        assert p.status_code == 400, (kind, p.status_code, p.text[:300])
        assert p.json()["error"]["message"]
    wait_idle(srv.url)
    info = requests.get(srv.url + "/get_server_info", timeout=T).json()
    assert info["failed_rows"] == 0


# ---------------------------------------------------------------- fuzz: every route


FUZZ_EXAMPLES = 150


def test_fuzz_every_route_no_5xx_no_hang(srv):
    """Hypothesis-generated hostile requests on every route (tests/hostile_requests.py), one at
    a time: never a 5xx, never a hang (a 60 s timeout each); afterwards the server is healthy,
    idle, and answers an ordinary request as before."""
    from hypothesis import HealthCheck, given, settings

    from hostile_requests import Hostile, requests_

    before = post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(4)}, 200).json()["output_ids"]
    seen: dict[int, int] = {}

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(requests_)
    def one(h: Hostile) -> None:
        headers = {"Content-Type": h.content_type} if h.content_type else {}
        r = requests.request(h.method, srv.url + h.path, data=h.body, headers=headers, timeout=60)
        body = r.content  # a stream is read to its end
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, (h.method, h.path, (h.body or b"")[:300], r.status_code, body[:300])
        if r.status_code >= 400 and r.status_code != 404:
            assert r.json()["error"]["message"], body[:300]

    one()
    assert requests.get(srv.url + "/health", timeout=T).status_code == 200
    assert requests.get(srv.url + "/health_generate", timeout=T).status_code == 200
    info = wait_idle(srv.url)
    assert info["failed_rows"] == 0 and info["protected_slots"] == 0
    assert post(srv, "/generate", {"text": PROMPT, "sampling_params": greedy(4)}, 200).json()["output_ids"] == before
    assert seen.get(200) and seen.get(400), seen  # the fuzz reached both the handlers and the checks

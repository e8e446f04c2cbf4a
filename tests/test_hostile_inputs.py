"""Hostile inputs against a real server (issue 32): each numbered item of the issue has a test
here that failed on the code before its fix. No 5xx for anything a client sends, and no
request can hurt another one."""
from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, wait_idle

pytestmark = pytest.mark.slow
T = 120
PROMPT = "The capital of France is"
RUNNING, QUEUED = 4, 8  # the server's --max-running-requests / --max-queued-requests


@pytest.fixture(scope="module")
def srv():
    s = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning", "--max-running-requests",
                       str(RUNNING), "--max-queued-requests", str(QUEUED)])
    yield s
    s.close()


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

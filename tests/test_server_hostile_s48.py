"""Hostile and careless clients against a real server and a router in front of it (session 48):
query strings a client types by hand, bodies nested right at the depth JSON still reads, and web
pages that reach a keyless replica through the router."""
from __future__ import annotations

import gzip
import json

import pytest
import requests

from test_router import RouterProcess
from treadle.runtime.server.testing import wait_idle

T = 60


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle
    return plain_server


@pytest.fixture(scope="module")
def router(plain_server):
    r = RouterProcess([plain_server.url], "cache_aware")
    yield r
    r.close()


def _no_leaked_kv(url: str) -> None:
    info = wait_idle(url)
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"], info
    assert info["protected_slots"] == 0, info


def _openai_400(r: requests.Response, param: str | None = None) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"], err
    if param is not None:
        assert err["param"] == param, err
    return err


def test_an_input_items_limit_int_cannot_read_is_a_400_naming_it(srv):
    """`limit` was checked with str.isdigit(), which passes '²' (and other digit signs int()
    refuses) and a 5,000-digit run (past int()'s limit): both answered a 500 with int()'s
    ValueError. Now they are the 400 of any other bad limit, quoting what was sent; '١' (an
    Arabic-Indic one, which int() read as 1) is no ASCII integer either."""
    r = requests.post(srv.url + "/v1/responses", json={"model": "default", "input": "hi", "max_output_tokens": 1},
                      timeout=T)
    assert r.status_code == 200, r.text
    url = f"{srv.url}/v1/responses/{r.json()['id']}/input_items"
    for limit in ("\u00b2", "9" * 5000, "\u0661", "0", "101", "-1", " 5"):
        err = _openai_400(requests.get(url, params={"limit": limit}, timeout=T), "limit")
        assert "limit must be an integer in [1, 100]" in err["message"], err
    for limit in ("1", "100", "007"):
        r = requests.get(url, params={"limit": limit}, timeout=T)
        assert r.status_code == 200 and r.json()["data"][0]["content"][0]["text"] == "hi", r.text
    _no_leaked_kv(srv.url)


def test_a_body_nested_to_the_depth_json_reads_is_a_400_through_the_router(router, srv):
    """The router reads a request's messages (or Responses input) back into text to place it by
    prefix. A message nested just short of the depth json.loads reads, written back by
    json.dumps a few frames deeper, raised RecursionError there: a plain-text 500 "Internal
    Server Error" for a body the replica itself answers with a 400. Every depth is now the
    replica's own 400 (relayed in the OpenAI error shape)."""
    with requests.Session() as s:
        for d in range(850, 1000):
            nested = "[" * d + "]" * d
            for path, body in (("/v1/chat/completions",
                                '{"max_tokens":1,"messages":[{"role":"user","content":%s}]}' % nested),
                               ("/v1/responses", '{"max_output_tokens":1,"input":[%s]}' % nested)):
                r = s.post(router.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=T)
                assert r.status_code == 400 and r.json()["error"]["message"], (path, d, r.status_code, r.text[:200])
    _no_leaked_kv(srv.url)


def test_a_keyless_replicas_host_and_origin_checks_hold_through_the_router(router, srv):
    """The router sent a replica only the client's Content-Type and Authorization, so a keyless
    replica's checks against web pages never saw the client's Host or Origin: a DNS-rebinding
    page (Host: its own name) read generations through the router, and a cross-site page's
    no-cors POST aborted every request (abort_all) or flushed the cache. A compressed body
    lost its Content-Encoding on the way: a 400 "not valid JSON" instead of the replica's 415.
    Now the Host is checked by the replica (its 403, relayed), an Origin the router's
    --allowed-origins does not list is the router's 403 (test_router: a listed one is served),
    and a compressed body is the replica's 415; a client of the router's address is served."""
    gen = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    for path, body in (("/generate", gen), ("/abort_request", {"abort_all": True}), ("/flush_cache", None)):
        r = requests.post(router.url + path, json=body, headers={"Origin": "http://evil.example"}, timeout=T)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", (path, r.text)
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/get_server_info")):
        r = requests.request(method, router.url + path, headers={"Host": "rebound.example"}, timeout=T,
                             json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
                             if method == "POST" else None)
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (path, r.text)
    r = requests.post(router.url + "/generate", data=gzip.compress(json.dumps(gen).encode()), timeout=T,
                      headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 415 and "Content-Encoding 'gzip'" in r.json()["error"]["message"], r.text
    for host in ("localhost", f"127.0.0.1:{router.port}", None):
        r = requests.post(router.url + "/generate", json=gen, headers={"Host": host} if host else {}, timeout=T)
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 1, (host, r.text)
    _no_leaked_kv(srv.url)


def test_sglangs_probe_and_newer_route_names_are_served_through_the_router(router, srv):
    """/health_generate (the probe SGLang's router serves, and a replica), /model_info and
    /server_info (SGLang's newer names, which a replica serves) and /version were 404s from the
    router: an orchestrator probing it as it probes a replica restarted a healthy router. Its
    /get_server_info lacked the internal_states sglang.bench_serving reads."""
    for path, key in (("/health_generate", None), ("/model_info", "model_path"), ("/server_info", "replicas"),
                      ("/version", "version")):
        r = requests.get(router.url + path, timeout=T)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
        assert key is None or key in r.json(), (path, r.text[:200])
    assert requests.get(router.url + "/model_info", timeout=T).json() == \
        requests.get(router.url + "/get_model_info", timeout=T).json()
    # what sglang.bench_serving reads of /get_server_info: internal_states[0] (a KeyError before)
    states = requests.get(router.url + "/get_server_info", timeout=T).json()["internal_states"]
    assert len(states) == 1 and states[0]["total_slots"] == requests.get(srv.url + "/get_server_info",
                                                                         timeout=T).json()["total_slots"], states
    _no_leaked_kv(srv.url)


def test_a_responses_input_of_reasoning_items_only_is_named_as_such(srv):
    """An input of reasoning items only (an earlier turn's, sent back alone) makes no prompt:
    its 400 said "input is required" to a client that sent an input. Beside instructions it is
    served."""
    body = {"model": "default", "input": [{"type": "reasoning", "summary": []}], "max_output_tokens": 1}
    err = _openai_400(requests.post(srv.url + "/v1/responses", json=body, timeout=T), "input")
    assert "reasoning items only" in err["message"], err
    r = requests.post(srv.url + "/v1/responses", json={**body, "instructions": "Be brief."}, timeout=T)
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 1, r.text
    _no_leaked_kv(srv.url)


def test_a_token_limit_the_kv_pool_can_never_hold_names_that_limit_as_param(srv):
    """prompt + max_tokens past the KV pool (4,096 slots here) says "lower max_tokens", but
    its `param` named the prompt; it names the limit the client sent, by the name it sent."""
    for path, body, param in (
            ("/v1/completions", {"prompt": "hi", "max_tokens": 5000}, "max_tokens"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5000},
             "max_completion_tokens"),
            ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 5000}}, "max_new_tokens")):
        r = requests.post(srv.url + path, json=body, timeout=T)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and f"lower {param}" in err["message"], (path, err)
    _no_leaked_kv(srv.url)


def test_the_router_reads_a_large_body_in_short_pieces(monkeypatch):
    """The router parsed every body with one json.loads on its event loop (json's C parser
    holds the GIL for the whole call) and wrote its routing text there too: a 48 MB body
    (/detokenize of 8M ids) held every other stream and /health of the router for 2 s
    (measured: /health's worst latency 2.0 s -> 0.47 s, as a replica's own 0.48 s). A body of
    PIECEWISE_PARSE_BYTES or more is now read as a replica reads it, in short C calls (off the
    loop): the same value and routing text."""
    import json as json_module

    from treadle.runtime import router as router_module
    from treadle.runtime.server import protocol

    spans: list[int] = []
    loads, scan = json_module.loads, protocol._scan_once

    def counted_loads(s, *a, **kw):
        spans.append(len(s))
        return loads(s, *a, **kw)

    def counted_scan(s, at):
        value, end = scan(s, at)
        spans.append(end - at)
        return value, end

    monkeypatch.setattr(json_module, "loads", counted_loads)
    monkeypatch.setattr(protocol, "_scan_once", counted_scan)
    ids = list(range(1000, 1100)) * 3000
    for path, obj in (("/v1/completions", {"prompt": ids, "max_tokens": 1}),
                      ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * (1 << 20)}]})):
        body = json.dumps(obj).encode()
        assert len(body) >= protocol.PIECEWISE_PARSE_BYTES
        spans.clear()
        got, text = router_module._read_for_routing(path, body)
        assert got == obj and text == router_module.routing_text(path, obj)
        if path == "/v1/completions":  # a run of numbers: pieces of at most ~70k characters (a string is one)
            assert max(spans) <= 70_000, f"one C call read {max(spans):,} characters"

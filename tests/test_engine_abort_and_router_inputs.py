"""The offline Engine, the router and the radix cache: each test a bug found, checked end to
end with the embedded model or on the tree alone."""
from __future__ import annotations

import threading
import time

import pytest

from treadle.runtime import Engine


@pytest.fixture(scope="module")
def engine():
    with Engine(max_total_tokens=4096, context_length=1024) as e:
        yield e


def _wait_running(engine, n: int, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while engine.get_server_info()["num_running"] != n:
        assert time.monotonic() < end, f"never {n} running"
        time.sleep(0.02)


def _all_free(engine) -> None:
    _wait_running(engine, 0, 10.0)
    engine.check_integrity()
    info = engine.get_server_info()
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"]
    assert info["num_waiting"] == 0


def test_abort_of_one_prompt_of_a_batch_with_n_samples(engine):
    """abort("<rid>-<i>") stops the samples "<rid>-<i>-<j>" of the batch's i-th prompt, as the
    server's /abort_request does (their aliases), and leaves the other prompt's samples alone.
    Before, the Engine looked only for a request named exactly "<rid>-1": nothing stopped."""
    out = []
    params = {"max_new_tokens": 48, "ignore_eos": True, "n": 2, "temperature": 1.0}
    t = threading.Thread(target=lambda: out.append(engine.generate(["Hello there", "Good morning"], params,
                                                                   rid="pairn")))
    t.start()
    _wait_running(engine, 4)
    engine.abort("pairn-1")
    t.join(60)
    assert not t.is_alive()
    res = out[0]
    assert [o["meta_info"]["id"] for o in res] == ["pairn-0-0", "pairn-0-1", "pairn-1-0", "pairn-1-1"]
    assert [o["meta_info"]["finish_reason"]["type"] for o in res] == ["length", "length", "abort", "abort"]
    assert all(o["meta_info"]["completion_tokens"] < 48 for o in res[2:])
    assert not engine._prompt_groups and not engine._groups
    _all_free(engine)


def test_abort_of_one_prompt_before_its_samples_are_sent(engine):
    """A prompt aborted while the batch still warms prompts up: its samples are never sent
    (they finish as aborted at once), the other prompt's run to the end."""
    words = " ".join(f"w{i}" for i in range(200))
    out = []
    params = {"max_new_tokens": 4, "ignore_eos": True, "n": 2, "temperature": 1.0}
    t = threading.Thread(target=lambda: out.append(engine.generate(["Hi " + words, "Yo " + words], params,
                                                                   rid="warmn")))
    t.start()
    deadline = time.time() + 30
    while "warmn" not in engine._groups and time.time() < deadline:
        time.sleep(0.001)
    engine.abort("warmn-1")
    t.join(60)
    assert not t.is_alive()
    res = out[0]
    assert [o["meta_info"]["finish_reason"]["type"] for o in res] == ["length", "length", "abort", "abort"]
    _all_free(engine)


def test_router_abort_request_refuses_an_unknown_field():
    """The router's /abort_request answered a typo'd field with a 200 {"success": false}: every
    replica refused it with a 400, and the router swallowed that. It is a 400 naming the field,
    as a replica's, before asking them all; SGLang's abort_all is one of its fields."""
    from fastapi.testclient import TestClient

    from treadle.runtime.router import RouterArgs, create_router_app

    app = create_router_app(RouterArgs(workers=("http://127.0.0.1:9",), health_interval_s=60.0))
    with TestClient(app) as client:
        r = client.post("/abort_request", json={"rid": "x", "abort_everything": True})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "abort_everything" in err["message"] and err["param"] == "abort_everything"
        assert client.post("/abort_request", json={"rid": 3}).status_code == 400
        assert client.post("/abort_request", json={"abort_all": "yes"}).status_code == 400
        # well-formed aborts with no replica up: nothing to stop
        for body in ({"rid": "x"}, {"abort_all": True}, {"rid": "", "abort_all": True}):
            r = client.post("/abort_request", json=body)
            assert r.status_code == 200 and r.json() == {"success": False}, (body, r.text)


def test_router_abort_request_relays_the_replicas_refusal():
    """An abort every replica refused (401: a wrong or missing API key) was a 200 {"success":
    false}, as if there were nothing to stop; the client now gets the replica's 401."""
    import httpx
    from fastapi.testclient import TestClient

    from treadle.runtime.router import RouterArgs, create_router_app

    seen = []

    def replica(req: httpx.Request) -> httpx.Response:
        seen.append(req.url.path)
        if req.url.path == "/health":
            return httpx.Response(200)
        if req.headers.get("authorization") != "Bearer good":
            return httpx.Response(401, json={"error": {"message": "invalid API key", "type": "invalid_request_error",
                                                       "param": None, "code": "invalid_api_key"}})
        return httpx.Response(200, json={"success": True})

    app = create_router_app(RouterArgs(workers=("http://replica-a", "http://replica-b"), health_interval_s=60.0))
    app.state.router.client = httpx.AsyncClient(transport=httpx.MockTransport(replica))
    with TestClient(app) as client:
        r = client.post("/abort_request", json={"rid": "x"}, headers={"Authorization": "Bearer bad"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        r = client.post("/abort_request", json={"rid": "x"}, headers={"Authorization": "Bearer good"})
        assert r.status_code == 200 and r.json() == {"success": True}, r.text
    assert seen.count("/abort_request") == 4


def test_router_tree_keeps_what_it_holds_when_a_prompt_exceeds_its_bound():
    """A prompt longer than --max-tree-chars was inserted whole, then evicted with everything
    else (every older leaf first, then itself): one over-long request (a replica may well
    refuse it) left the router knowing nothing of that replica's cache. A prompt the tree can
    never hold now leaves it as it is, only refreshing the prefix of it the tree shares."""
    from treadle.runtime.router_policy import CacheAwarePolicy, CacheAwareConfig, TextPrefixTree

    t = TextPrefixTree(max_chars=100)
    t.insert("system A: " + "a" * 30)
    t.insert("system B: " + "b" * 30)
    t.insert("system A: " + "z" * 300)
    assert t.size == 73 and t.match("system A: " + "a" * 30) == 40 and t.match("system B: " + "b" * 30) == 40
    p = CacheAwarePolicy(2, CacheAwareConfig(max_tree_chars=100))
    p.on_routed(1, "shared prefix " * 5)
    p.on_routed(1, "x" * 500)
    assert p.choose("shared prefix " * 5 + "?", [0, 1], [0, 0])[0] == 1


# (a list of strings, one per prompt, is SGLang's and is taken: test_engine_chaos_s45.py)
@pytest.mark.parametrize("rid", [["a", 5], 5, ("a", b"b"), b"x", {"a": 1}])
@pytest.mark.parametrize("stream", [False, True])
def test_a_rid_that_is_not_a_string_is_a_value_error(engine, rid, stream):
    """A rid of another type was a TypeError (unhashable, or "<rid>-<i>" failing to
    concatenate) for a batch, and for one prompt ran under a non-string id that the server's
    ids never are. It is a ValueError naming rid, nothing queued."""
    for prompts in ("Hi", ["Hi", "Yo"]):
        with pytest.raises(ValueError, match="rid must be a string"):
            engine.generate(prompts, {"max_new_tokens": 2}, rid=rid, stream=stream)
    assert not engine._outboxes and not engine._groups and not engine._group_of

"""Many requests at once against a real server (session 46): what one request's probe or
abort sees while others hold the server's capacity."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

T = 60


@pytest.fixture(scope="module")
def srv(limited_server):  # conftest's shared server (4 running, 8 queued): left idle
    return limited_server


def _no_leaked_kv(url: str) -> dict:
    info = wait_idle(url)
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"], info
    assert info["protected_slots"] == 0, info
    return info


def test_health_generate_is_200_while_long_unstreamed_requests_fill_the_batch(srv):
    """Four requests that are not streamed fill the batch (--max-running-requests 4), so the
    probe's own token waits in the queue, and they send nothing until they end. The server is
    decoding: /health_generate answers 200 while all four still run (their finish reason is the
    abort sent after the probe answered). Before, the probe waited for another request's output,
    so it answered only once one of them ended (or, behind requests of minutes, 503 "no token
    within 30 s", for an orchestrator to restart a healthy server)."""
    rids = [f"s46-busy-{i}-{time.monotonic_ns()}" for i in range(4)]
    results: dict[str, dict] = {}

    def run(rid: str) -> None:
        r = requests.post(srv.url + "/generate", json={
            "text": f"Write a very long story, part {rid}:", "rid": rid,
            "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 0}}, timeout=T)
        results[rid] = r.json()

    threads = [threading.Thread(target=run, args=(rid,)) for rid in rids]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + T
        while True:  # all four admitted and decoding: the probe cannot join the batch
            info = requests.get(srv.url + "/get_server_info", timeout=T).json()
            if info["num_running"] == 4:
                break
            assert time.monotonic() < deadline, info
            time.sleep(0.05)
        probe = requests.get(srv.url + "/health_generate", timeout=T)
        assert probe.status_code == 200, probe.text
    finally:
        for rid in rids:
            requests.post(srv.url + "/abort_request", json={"rid": rid}, timeout=T)
        for t in threads:
            t.join(T)
    reasons = [results[rid]["meta_info"]["finish_reason"]["type"] for rid in rids]
    assert reasons == ["abort"] * 4, reasons
    _no_leaked_kv(srv.url)


def test_a_503_for_a_request_of_several_parts_says_it_needs_more_than_is_left(srv):
    """With 11 of the 12 places taken (4 running, 7 queued), a request of n=2 samples is a 503
    below the limit: the message says the request makes 2 and 1 is left. Before, it read "too
    many requests in flight (11, limit 12)", a refusal with room left; n=1 still fits."""
    info = requests.get(srv.url + "/get_server_info", timeout=T).json()
    limit = info["max_running_requests"] + info["max_queued_requests"]
    rids = [f"s46-fill-{i}-{time.monotonic_ns()}" for i in range(limit - 1)]
    results: dict[str, int] = {}

    def run(rid: str) -> None:
        r = requests.post(srv.url + "/generate", json={
            "text": f"Fill {rid}:", "rid": rid,
            "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}, timeout=T)
        results[rid] = r.status_code

    threads = [threading.Thread(target=run, args=(rid,)) for rid in rids]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + T
        while requests.get(srv.url + "/get_server_info", timeout=T).json()["num_in_flight"] < limit - 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = requests.post(srv.url + "/generate", json={"text": "two", "sampling_params": {"max_new_tokens": 1, "n": 2}},
                          timeout=T)
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert f"({limit - 1}, limit {limit}; this request makes 2 (prompts times n), more than the 1 left)" in message, message
        assert "Retry-After" in r.headers
    finally:
        for rid in rids:
            requests.post(srv.url + "/abort_request", json={"rid": rid}, timeout=T)
        for t in threads:
            t.join(T)
    assert sorted(results.values()) == [200] * len(rids)
    _no_leaked_kv(srv.url)

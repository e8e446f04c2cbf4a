"""SGLang's /abort_request {"abort_all": true} against a real server: every running request
stops (a stream ends with finish_reason abort), the KV pool is free again and the server
serves the next request as before; a typo'd field is still a 400 naming it. It was a 400
("unknown field(s) abort_all"), so SGLang clients that stop everything could not."""
from __future__ import annotations

import json
import threading

import pytest
import requests

from treadle.runtime.server.testing import wait_idle

T = 120


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: this test leaves it idle
    return plain_server


def _stream(url: str, out: dict, key: str, started: threading.Event) -> None:
    with requests.post(url + "/generate", stream=True, timeout=T, json={
            "text": "Count slowly:", "stream": True,
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 0}}) as r:
        last = None
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                last = json.loads(line[6:])
                started.set()
        out[key] = last


def test_abort_all_stops_every_running_request(srv):
    greedy = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    before = requests.post(srv.url + "/generate", json=greedy, timeout=T).json()["text"]
    out: dict = {}
    started = [threading.Event(), threading.Event()]
    threads = [threading.Thread(target=_stream, args=(srv.url, out, k, e)) for k, e in zip("ab", started)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(60)
    r = requests.post(srv.url + "/abort_request", json={"abort_all": True}, timeout=T)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    for k in "ab":
        meta = out[k]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort", meta
        assert meta["completion_tokens"] < 4000
    info = wait_idle(srv.url)
    # no KV slot leaked: each is free or in the prefix cache, none held by a request
    assert info["protected_slots"] == 0 and info["free_slots"] + info["cached_slots"] == info["total_slots"], info
    assert requests.post(srv.url + "/generate", json=greedy, timeout=T).json()["text"] == before
    for body, field in (({"abort_everything": True}, "abort_everything"), ({"abort_all": 1}, "abort_all"),
                        ({}, "rid")):
        r = requests.post(srv.url + "/abort_request", json=body, timeout=T)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text

"""A request that makes every batch step it is in fail, against the real server (the embedded
SmolLM2, the real scheduler process): the requests batched beside it finish with exactly the
greedy text they get alone, it alone gets a 400 naming the failure, and poisoned requests
spaced out over idle time never take the server down. The poison is test-only fault injection
(runtime/fault_injection.py, TREADLE_FAULT_POISON_MARKER): a prompt holding the marker fails
the steps that compute its tokens (``marker@k``: once it has k output tokens). Before, every
request of the failed step got a 500, and the fourth failed step in a row (idle time between
them included) stopped the scheduler and the server with it."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from treadle.runtime.server.testing import ServerProcess, sse_events, wait_idle

T = 180
MARKER = "zq-poison-marker"
PROMPTS = ["The capital of France is", "One, two, three, four,", "def add(a, b):", "Once upon a time",
           "The weather today", "My favourite colour is"]
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def srv():
    with ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"],
                       env={"TREADLE_FAULT_POISON_MARKER": MARKER}) as s:
        yield s


def generate(url: str, text: str, stream: bool = False) -> tuple[int, object]:
    body = {"text": text, "sampling_params": GREEDY, "stream": stream}
    r = requests.post(url + "/generate", json=body, timeout=T, stream=stream)
    if not stream or r.status_code != 200:
        return r.status_code, r.json()
    events = sse_events(r)
    assert events[-1] == "[DONE]", events
    return r.status_code, events[:-1]


def assert_poison_error(status: int, body: dict) -> None:
    assert status == 400, (status, body)
    err = body["error"]
    assert err["type"] == "invalid_request_error" and "made its batch step fail" in err["message"], err
    assert "injected fault" in err["message"] and "poisons its step" in err["message"], err


def assert_no_leaked_kv(url: str) -> None:
    info = wait_idle(url)
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"], info
    assert info["protected_slots"] == 0, info


def test_a_poisoned_request_fails_alone_and_its_batch_gives_the_text_it_gives_alone(srv):
    alone = [generate(srv.url, p)[1]["text"] for p in PROMPTS]
    requests.post(srv.url + "/flush_cache", timeout=T)
    calls = [lambda p=p: generate(srv.url, p) for p in PROMPTS[:4]]
    calls += [lambda p=p: generate(srv.url, p, stream=True) for p in PROMPTS[4:]]
    # one poisoned from its prefill on, one once it has 3 tokens (mid-decode, beside the others),
    # one over the OpenAI API
    calls.append(lambda: generate(srv.url, f"Tell me about {MARKER} please"))
    calls.append(lambda: generate(srv.url, f"Tell me about {MARKER}@3 please", stream=True))
    calls.append(lambda: (lambda r: (r.status_code, r.json()))(requests.post(
        srv.url + "/v1/completions", timeout=T,
        json={"model": "default", "prompt": f"Say {MARKER}@2", "max_tokens": 16, "temperature": 0})))
    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(lambda f: f(), calls))
    for i, (status, body) in enumerate(results[:4]):
        assert status == 200 and body["text"] == alone[i] and "error" not in body, (i, body)
    for i, (status, events) in enumerate(results[4:6], start=4):
        assert status == 200 and not any("error" in e for e in events), events
        assert events[-1]["text"] == alone[i], (i, events)  # each event holds the text so far
    assert_poison_error(*results[6])
    status, events = results[7]
    assert status == 200 and "error" in events[-1], events  # the stream had begun: its last event
    assert events[-1]["error"]["code"] != "internal_error" and "made its batch step fail" in \
        events[-1]["error"]["message"], events[-1]
    assert_poison_error(*results[8])
    assert_no_leaked_kv(srv.url)


def test_poisoned_requests_spaced_out_never_take_the_server_down(srv):
    for i in range(10):
        assert_poison_error(*generate(srv.url, f"{MARKER} number {i}"))
        wait_idle(srv.url)  # idle between them: each poisoned request arrives on its own
    status, body = generate(srv.url, PROMPTS[0])
    assert status == 200 and body["meta_info"]["completion_tokens"] == 16, body
    assert srv.proc.poll() is None
    assert_no_leaked_kv(srv.url)
    info = wait_idle(srv.url)  # the scheduler's counts: the failed steps, the requests stopped for them
    assert info["failed_step_requests"] >= 10 and info["failed_steps"] >= 2 * info["failed_step_requests"], info
    r = requests.post(srv.url + "/v1/chat/completions", timeout=T, json={
        "model": "default", "messages": [{"role": "user", "content": MARKER}], "max_tokens": 4})
    assert r.status_code == 400 and "made its batch step fail" in r.json()["error"]["message"], r.text
    assert srv.proc.poll() is None and requests.get(srv.url + "/health", timeout=T).status_code == 200

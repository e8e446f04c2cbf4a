"""Exploratory tests of the offline Engine, the router and the radix cache (session 36): each
one a bug found, checked end to end with the embedded model or on the tree alone."""
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

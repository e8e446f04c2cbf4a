"""Streams of n samples (or several prompts) merge the chunks that queued while the client's
stream was busy, one per sample, as one request's stream merges its own (session 42). Every
token's chunk was rendered: /generate's cumulative chunks (every logprob so far in each) came
to 3,201 chunks and 520 MB of JSON on the event loop for 8 samples of 400 tokens with top 20
(228 MB merged), the stream four times slower (2x merged) and other clients waiting behind it."""
from __future__ import annotations

import asyncio

import pytest
import requests

from treadle.runtime.server.streaming import merge_streams
from treadle.runtime.server.testing import sse_events, wait_idle
from treadle.runtime.server.tokenizer_manager import Chunk, merge_chunks

T = 120


def test_a_backlog_of_each_source_comes_merged_in_its_order():
    async def run() -> list:
        backlog = asyncio.Event()  # set once every source has queued all its items

        async def source(k: int, n: int, fail: bool = False):
            for j in range(n):
                yield f"{k}.{j}"
                await asyncio.sleep(0)
            if fail:
                raise ValueError(f"source {k} failed")

        async def until_all_queued():
            for _ in range(200):
                await asyncio.sleep(0)
            backlog.set()

        got = []
        watcher = asyncio.ensure_future(until_all_queued())
        async for i, item in merge_streams([source(0, 30), source(1, 5), source(2, 40)], lambda a, b: a + "+" + b):
            got.append((i, item))
            await backlog.wait()  # the consumer is busy while the sources run ahead
        await watcher
        return got

    got = asyncio.run(run())
    # what is queued at a time comes one item per source: 3 first, then each backlog as one, not 75
    assert len(got) <= 6, got
    for k, n in ((0, 30), (1, 5), (2, 40)):
        mine = "+".join(item for i, item in got if i == k)
        assert mine == "+".join(f"{k}.{j}" for j in range(n)), (k, mine)


def test_without_a_merge_every_item_comes_alone_and_a_failure_comes_after_its_sources_items():
    async def run(merge) -> tuple[list, Exception | None]:
        async def source(k: int, fail: bool):
            for j in range(3):
                yield (k, j)
            if fail:
                raise ValueError("bad")

        got, err = [], None
        try:
            async for _, item in merge_streams([source(0, False), source(1, True)], merge):
                got.append(item)
                await asyncio.sleep(0.01)
        except ValueError as e:
            err = e
        return got, err

    got, err = asyncio.run(run(None))
    assert str(err) == "bad" and [x for x in got if x[0] == 1] == [(1, 0), (1, 1), (1, 2)], got
    got, err = asyncio.run(run(lambda a, b: a + b))  # tuples concatenate: one source's items in order
    assert str(err) == "bad" and sum((x for x in got if x[0] == 1), ()) == (1, 0, 1, 1, 1, 2), got


def test_merged_chunks_add_up_to_both():
    a = Chunk("ab", [1, 2], [-0.1, -0.2], [[(-0.1, 1)], [(-0.2, 2)]], "acc-a", False)
    b = Chunk("c", [3], [-0.3], [[(-0.3, 3)]], "acc-b", True)
    m = merge_chunks(a, b)
    assert (m.text, m.ids, m.logprobs, m.top_logprobs, m.acc, m.finished, m.error) == (
        "abc", [1, 2, 3], [-0.1, -0.2, -0.3], [[(-0.1, 1)], [(-0.2, 2)], [(-0.3, 3)]], "acc-b", True, None)
    assert a.ids == [1, 2] and b.ids == [3]  # neither is changed


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle
    return plain_server


def test_n_streamed_samples_add_up_to_the_unstreamed_ones(srv):
    body = {"model": "default", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 3, "n": 4,
            "logprobs": 2, "ignore_eos": True}
    full = requests.post(srv.url + "/v1/completions", json=body, timeout=T).json()["choices"]
    with requests.post(srv.url + "/v1/completions", json={**body, "stream": True}, stream=True, timeout=T) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    for c in full:
        parts = [ch for e in events[:-1] for ch in e["choices"] if ch["index"] == c["index"]]
        assert "".join(p["text"] for p in parts) == c["text"]
        assert [t for p in parts if p["logprobs"] for t in p["logprobs"]["tokens"]] == c["logprobs"]["tokens"]
        assert [x for p in parts if p["logprobs"] for x in p["logprobs"]["token_logprobs"]] == \
            pytest.approx(c["logprobs"]["token_logprobs"], abs=1e-3)
    native = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 1.0, "seed": 3,
                                                              "n": 3, "ignore_eos": True},
              "return_logprob": True, "top_logprobs_num": 2}
    full = requests.post(srv.url + "/generate", json=native, timeout=T).json()
    with requests.post(srv.url + "/generate", json={**native, "stream": True}, stream=True, timeout=T) as r:
        events = sse_events(r)
    last = {e["index"]: e for e in events[:-1]}
    assert [last[i]["output_ids"] for i in range(3)] == [o["output_ids"] for o in full]
    for i, o in enumerate(full):  # the same tokens scored (values to float noise: batches differ in shape)
        got, want = last[i]["meta_info"]["output_token_logprobs"], o["meta_info"]["output_token_logprobs"]
        assert [e[1] for e in got] == [e[1] for e in want]
        assert [e[0] for e in got] == pytest.approx([e[0] for e in want], abs=1e-3)
    wait_idle(srv.url)

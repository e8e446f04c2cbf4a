"""The n samples of a seeded request draw with seeds of their own (session 42): sample j of
{seed: s, n} used seed s + j, so it was the first sample of {seed: s + j} (two requests a
client sent with seeds 1 and 2 shared a sample). Sample 0 keeps the seed (n=1 and the first
of n agree), the others a hash of (seed, j); the same request still gives the same samples."""
from __future__ import annotations

import pytest
import requests

from treadle.runtime.sampling_params import sample_seed
from treadle.runtime.server.testing import wait_idle

T = 120
# a prompt whose next tokens are far from certain, sampled hot: seeds that differ draw apart
BODY = {"text": "Here is a random list of words:", "sampling_params": {"max_new_tokens": 8, "temperature": 1.5,
                                                                        "ignore_eos": True}}


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: left idle
    return plain_server


def _samples(srv, seed: int, n: int) -> list[list[int]]:
    r = requests.post(srv.url + "/generate", timeout=T,
                      json={**BODY, "sampling_params": {**BODY["sampling_params"], "seed": seed, "n": n}})
    assert r.status_code == 200, r.text[:300]
    out = r.json()
    return [o["output_ids"] for o in (out if isinstance(out, list) else [out])]


def test_a_seeded_requests_later_samples_are_not_another_seeds_first(srv):
    two = _samples(srv, 1, 3)
    assert _samples(srv, 1, 3) == two  # deterministic
    assert _samples(srv, 1, 1) == two[:1]  # the first sample is the seed's own
    assert len({tuple(s) for s in two}) == 3, two
    # sample j of {seed: 1, n} was the first sample of {seed: 1 + j}
    assert two[1] != _samples(srv, 2, 1)[0], two
    assert two[2] != _samples(srv, 3, 1)[0], two
    # the OpenAI route splits its n the same way
    r = requests.post(srv.url + "/v1/completions", timeout=T, json={
        "model": "default", "prompt": BODY["text"], "max_tokens": 8, "temperature": 1.5, "ignore_eos": True,
        "seed": 1, "n": 2, "logprobs": 0})
    assert r.status_code == 200, r.text[:300]
    toks = [c["logprobs"]["tokens"] for c in r.json()["choices"]]
    r = requests.post(srv.url + "/v1/completions", timeout=T, json={
        "model": "default", "prompt": BODY["text"], "max_tokens": 8, "temperature": 1.5, "ignore_eos": True,
        "seed": 2, "logprobs": 0})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["logprobs"]["tokens"] != toks[1], toks
    wait_idle(srv.url)


def test_sample_seeds_are_the_seed_then_hashes_that_do_not_collide():
    assert [sample_seed(7, 0), sample_seed(-1, 0), sample_seed((1 << 63) + 5, 0)] == [7, (1 << 63) - 1, 5]
    seeds = {sample_seed(s, j) for s in range(-50, 50) for j in range(16)}
    assert len(seeds) == 100 * 16 and all(0 <= x < 1 << 63 for x in seeds)
    # any integer (JSON has no bound): folded as the scheduler folds a request's seed
    assert sample_seed(10**400, 3) == sample_seed(10**400 % (1 << 63), 3)
    assert sample_seed(1, 1) == sample_seed(1, 1) != sample_seed(2, 0)

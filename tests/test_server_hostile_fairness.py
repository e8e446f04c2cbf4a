"""Hostile clients that used to slow every other request down: prompt logprobs over a long
prompt (one CPU step of tens of seconds) and a full-vocabulary logit_bias (rebuilt from the
dict at every step of the batch it ran in). Each test failed on the code before its fix."""
from __future__ import annotations

import json
import math
import threading
import time

import pytest
import requests
import torch

from treadle.runtime.server.testing import wait_idle

pytestmark = pytest.mark.slow
T = 300
VOCAB = 49152  # the embedded SmolLM2's
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server: these tests leave it idle
    return plain_server


def long_prompt(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] + str(i % 7) for i in range(words))


def decode_steps_mid_prefill(srv) -> int:
    """The server's count of decode steps taken while a prompt was part way through its prefill."""
    r = requests.get(srv.url + "/get_server_info", timeout=T)
    assert r.status_code == 200, r.text
    return r.json()["decode_steps_mid_prefill"]


class Bystander:
    """A greedy streamed /generate, running (it has streamed) once made, until closed."""

    def __init__(self, srv, max_new_tokens: int = 400) -> None:
        self.chunks = 0
        self.stop = False
        body = {"text": "Once upon a time", "stream": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}
        self.resp = requests.post(srv.url + "/generate", json=body, stream=True, timeout=T)
        assert self.resp.status_code == 200, self.resp.text
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + T  # a liveness bound only: the wait for its first tokens
        while self.chunks < 2:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the bystander never streamed"
            time.sleep(0.05)

    def _read(self) -> None:
        try:
            for line in self.resp.iter_lines():
                if line.startswith(b"data: {"):
                    self.chunks += 1
                if self.stop:
                    break
        except requests.RequestException:
            pass  # closed by close()
        finally:
            self.resp.close()

    def close(self) -> None:
        self.stop = True
        self.thread.join(T)


def test_prompt_logprobs_of_a_long_prompt_let_others_run(srv):
    """A ~1,500-token prompt with logprob_start_len 0 was one prefill step scoring every
    position (a [1500, vocab] log-softmax and top-k): no other request made a token until it
    was done (tens of seconds on a CPU). Now each step scores at most 256 positions and the
    running requests decode between its chunks; the values are unchanged. Counted in scheduler
    steps, not seconds: the server's decode steps taken while a prompt was part way through its
    prefill (the bystander, running throughout: 400 tokens, closed after, is the only request
    that decodes, and the long prompt the only one prefilled in parts)."""
    text = long_prompt(700)
    by = Bystander(srv)
    try:
        before = decode_steps_mid_prefill(srv)
        r = requests.post(srv.url + "/generate", timeout=T, json={
            "text": text, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        between = decode_steps_mid_prefill(srv) - before
    finally:
        by.close()
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    n = meta["prompt_tokens"]
    assert n > 1200, n
    lps = meta["input_token_logprobs"]
    assert len(lps) == n and lps[0][0] is None
    assert all(math.isfinite(v) and v <= 0 for v, _, _ in lps[1:])
    assert len(meta["input_top_logprobs"]) == n and all(len(t) == 2 for t in meta["input_top_logprobs"][1:])
    # 1,300+ scored positions are 5+ chunks: the bystander decodes between them (before: one step, 0)
    assert between >= 4, between

    # the last positions scored alone (the prefix from the cache) give the same values
    tail = 20
    r2 = requests.post(srv.url + "/generate", timeout=T, json={
        "text": text, "return_logprob": True, "logprob_start_len": n - tail,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    assert r2.status_code == 200, r2.text
    again = r2.json()["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in again] == [t for _, t, _ in lps[-tail:]]
    assert max(abs(a[0] - b[0]) for a, b in zip(again, lps[-tail:])) < 1e-3
    info = wait_idle(srv.url)
    assert info["protected_slots"] == 0 and info["free_slots"] + info["evictable_slots"] == info["total_slots"]


def test_echo_logprobs_on_completions_are_chunked_too(srv):
    """/v1/completions echo + logprobs is the same path: all prompt positions come back."""
    text = long_prompt(300)
    r = requests.post(srv.url + "/v1/completions", timeout=T, json={
        "prompt": text, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    n = r.json()["usage"]["prompt_tokens"]
    assert n > 500
    lp = c["logprobs"]["token_logprobs"]
    assert len(lp) == n + 1 and lp[0] is None and all(v is not None for v in lp[1:])
    wait_idle(srv.url)


def test_full_vocabulary_logit_bias_is_indexed_once():
    """A logit_bias over the whole vocabulary was turned from its dict into index tensors at
    every step (two 49k-element lists made tensors: ~45 ms on a CPU per step, for every
    request in its batch). Now it is made tensors at its first step only."""
    import treadle.runtime.sampler as sampler_mod
    from treadle.runtime.request import Req
    from treadle.runtime.sampling_params import SamplingParams

    s = sampler_mod.Sampler(VOCAB, torch.device("cpu"), (0,))
    bias = {i: (1.0 if i % 2 else -1.0) for i in range(VOCAB)}
    biased = Req("a", [1, 2], SamplingParams(logit_bias=bias, max_new_tokens=4), 0)
    plain = Req("b", [1, 2], SamplingParams(max_new_tokens=4), 0)
    logits = torch.randn(2, VOCAB)
    converted: list[int] = []
    real = sampler_mod.to_device

    def counting(values, *a, **kw):
        if isinstance(values, list):
            converted.append(len(values))
        return real(values, *a, **kw)

    sampler_mod.to_device = counting
    try:
        out = [s._biased(logits, [plain, biased], True) for _ in range(3)]
    finally:
        sampler_mod.to_device = real
    want = logits.clone()
    want[1] += torch.tensor([bias[i] for i in range(VOCAB)])
    assert all(torch.equal(o, want) for o in out)
    assert sum(converted) <= 2 * VOCAB, converted  # the first step only


def test_full_vocabulary_logit_bias_over_http(srv):
    """A 49k-entry logit_bias forces its token, and a request beside it is unchanged."""
    target = 1000
    bias = {str(i): -100 for i in range(VOCAB)}
    bias[str(target)] = 100
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                                    "ignore_eos": True}}
    alone = requests.post(srv.url + "/generate", json=body, timeout=T).json()["output_ids"]
    out: dict = {}

    def forced():
        out["forced"] = requests.post(srv.url + "/generate", timeout=T, data=json.dumps(
            {"text": "Hello", "sampling_params": {"max_new_tokens": 6, "temperature": 0.7, "logit_bias": bias}}),
            headers={"Content-Type": "application/json"})

    th = threading.Thread(target=forced)
    th.start()
    beside = requests.post(srv.url + "/generate", json=body, timeout=T)
    th.join(T)
    assert out["forced"].status_code == 200, out["forced"].text
    assert out["forced"].json()["output_ids"] == [target] * 6
    assert beside.status_code == 200 and beside.json()["output_ids"] == alone
    info = wait_idle(srv.url)
    assert info["protected_slots"] == 0

"""Output logprobs are budgeted per request (session 42), as prompt logprobs were: n samples x
max tokens x (1 + top logprobs) values over MAX_OUTPUT_LOGPROB_ENTRIES is a 400 naming the
fields with the numbers, before anything runs, on /generate, /v1/completions and
/v1/chat/completions, streamed or not. Before, any such request was taken: each value is kept
as Python objects in the scheduler and the HTTP process until the reply is sent (about 1 KB a
value measured), so n=4,096 x 8,000 tokens x top 20 wanted hundreds of GB."""
from __future__ import annotations

import types

import pytest
import requests

from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.server.testing import wait_idle
from treadle.runtime.server.tokenizer_manager import (MAX_OUTPUT_LOGPROB_ENTRIES, TokenizerManager,
                                                      output_logprob_entries)
from treadle.runtime.server.protocol import APIError

# short: on the old code a refused request ran (and this read timed out, failing the test)
T = 20
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def srv(plain_server):  # conftest's shared server (--max-total-tokens 4096): left idle
    return plain_server


def _refused(r: requests.Response, param: str, *words: str) -> str:
    if r.status_code != 400:  # a stream that was taken is not read to its end
        r.close()
        pytest.fail(f"status {r.status_code}, not a 400")
    err = r.json()["error"]
    assert err["param"] == param and "output logprob values" in err["message"], err
    assert f"{MAX_OUTPUT_LOGPROB_ENTRIES:,}" in err["message"], err
    for w in words:
        assert w in err["message"], (w, err)
    return err["message"]


def test_output_logprobs_over_the_budget_are_a_400_naming_the_fields(srv):
    # streamed first: on the old code these answered 200 at once (and closing them aborted them)
    for stream in (True, False):
        r = requests.post(srv.url + "/v1/chat/completions", timeout=T, stream=stream, json={
            "model": "default", "messages": CHAT, "n": 100, "max_tokens": 2000, "logprobs": True,
            "top_logprobs": 20, "stream": stream})
        _refused(r, "top_logprobs", "4,200,000", "100 samples", "2,000 tokens (max_tokens)",
                       "1 + 20 top_logprobs", "lower n, max_tokens or top_logprobs")
        r.close()
        r = requests.post(srv.url + "/generate", timeout=T, stream=stream, json={
            "input_ids": [[1, 2, 3], [4, 5, 6]], "sampling_params": {"n": 50, "max_new_tokens": 2000},
            "return_logprob": True, "top_logprobs_num": [20, 20], "stream": stream})
        _refused(r, "top_logprobs_num", "4,200,000", "100 samples", "(max_new_tokens)", "1 + 20 top_logprobs_num")
        r.close()
    # the chat default max_tokens fills the context: n=64 of it with top 20 is over too
    r = requests.post(srv.url + "/v1/chat/completions", timeout=T, json={
        "model": "default", "messages": CHAT, "n": 64, "logprobs": True, "top_logprobs": 20})
    _refused(r, "top_logprobs", "64 samples", "(max_tokens)")
    r = requests.post(srv.url + "/v1/chat/completions", timeout=T, json={
        "model": "default", "messages": CHAT, "n": 100, "max_completion_tokens": 2000, "logprobs": True,
        "top_logprobs": 20})
    _refused(r, "top_logprobs", "4,200,000", "(max_completion_tokens)", "lower n, max_completion_tokens or")
    # completions: two prompts x n=50 x 2,000 tokens x (1 + 20)
    r = requests.post(srv.url + "/v1/completions", timeout=T, json={
        "model": "default", "prompt": ["Hi", "Yo"], "n": 50, "max_tokens": 2000, "logprobs": 20})
    _refused(r, "logprobs", "4,200,000", "100 samples", "1 + 20 logprobs")
    # logprobs alone count one value a token: 11 prompts x n=100 x 4,000 = 4.4M
    r = requests.post(srv.url + "/generate", timeout=T, json={
        "input_ids": [[7]] * 11, "sampling_params": {"n": 100, "max_new_tokens": 4000}, "return_logprob": True})
    _refused(r, "return_logprob", "4,400,000", "1,100 samples", "1 + 0 top_logprobs_num")
    # prompts with options of their own: the total, each by its own numbers
    r = requests.post(srv.url + "/generate", timeout=T, json={
        "text": ["Hi", "Yo"], "sampling_params": [{"n": 60, "max_new_tokens": 2000}, {"n": 60, "max_new_tokens": 1500}],
        "return_logprob": True, "top_logprobs_num": 20})
    _refused(r, "top_logprobs_num", "4,410,000", "over 120 samples")
    # under the budget: served as before, every token scored
    r = requests.post(srv.url + "/v1/chat/completions", timeout=T, json={
        "model": "default", "messages": CHAT, "n": 2, "max_tokens": 2, "logprobs": True, "top_logprobs": 20,
        "ignore_eos": True})
    assert r.status_code == 200, r.text[:300]
    for c in r.json()["choices"]:
        assert len(c["logprobs"]["content"]) == 2 and all(len(e["top_logprobs"]) == 20 for e in c["logprobs"]["content"])
    wait_idle(srv.url)


def test_the_budget_counts_the_tokens_the_context_leaves_and_holds_at_its_bound():
    def req(max_new: int, top: int = 0, prompt: int = 10, logprob: bool = True) -> TokenizedGenerateReq:
        return TokenizedGenerateReq("r", list(range(prompt)), SamplingParams(max_new_tokens=max_new),
                                    return_logprob=logprob, top_logprobs_num=top)

    # max_new_tokens past the context counts what the context leaves; no logprobs count nothing
    assert output_logprob_entries([req(10**9, 1, prompt=10)], context_len=1000) == 990 * 2
    assert output_logprob_entries([req(10**9, 20, logprob=False)], context_len=1000) == 0
    tm = types.SimpleNamespace(context_len=1 << 23)
    TokenizerManager.check_output_logprobs(tm, [req(MAX_OUTPUT_LOGPROB_ENTRIES)], "top_logprobs_num",
                                           "max_new_tokens", "return_logprob")
    with pytest.raises(APIError, match=f"up to {MAX_OUTPUT_LOGPROB_ENTRIES + 1:,} output logprob values"):
        TokenizerManager.check_output_logprobs(tm, [req(MAX_OUTPUT_LOGPROB_ENTRIES + 1)], "top_logprobs_num",
                                               "max_new_tokens", "return_logprob")

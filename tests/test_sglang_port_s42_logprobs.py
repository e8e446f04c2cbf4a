"""`return_logprob` without `logprob_start_len` (or with SGLang's -1) returns the last prompt
token's logprob as `input_token_logprobs`, as SGLang's scheduler does (it reads -1 as
len(prompt) - 1): a ported client that reads `input_token_logprobs[-1]` or zips it with the
prompt's tail found an empty list. Native /generate (plain and streamed), a DSL gen over
HTTP, and the OpenAI shapes unchanged. The shared plain_server."""
from __future__ import annotations

import json

import openai
import pytest
import requests

import treadle as sgl

T = 60
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def url(plain_server):
    return plain_server.url


def gen(url: str, body: dict) -> dict:
    r = requests.post(url + "/generate", json=body, timeout=T)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_default_scores_the_last_prompt_token(url):
    base = {"text": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "return_logprob": True}
    plain, minus_one = gen(url, base), gen(url, {**base, "logprob_start_len": -1})
    n = plain["meta_info"]["prompt_tokens"]
    explicit = gen(url, {**base, "logprob_start_len": n - 1})
    ids = gen(url, {**base, "logprob_start_len": 0})["meta_info"]["input_token_logprobs"]
    want = explicit["meta_info"]["input_token_logprobs"]
    assert len(want) == 1 and want[0][1] == ids[-1][1] and want[0][0] <= 0
    for got in (plain, minus_one):  # the same entry (its logprob computed with other cache hits: to rounding)
        (lp, tid, text), = got["meta_info"]["input_token_logprobs"]
        assert (tid, text) == (want[0][1], None) and lp == pytest.approx(want[0][0], abs=1e-4)
    assert plain["output_ids"] == explicit["output_ids"]
    # a one-token prompt: its only token, which nothing scores
    one = gen(url, {"input_ids": [ids[0][1]], "sampling_params": {"max_new_tokens": 1}, "return_logprob": True})
    assert one["meta_info"]["input_token_logprobs"] == [[None, ids[0][1], None]]
    # streamed: in the chunks, as unstreamed
    with requests.post(url + "/generate", json={**base, "stream": True}, stream=True, timeout=T) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: {")]
    assert [e[1] for e in chunks[-1]["meta_info"]["input_token_logprobs"]] == [want[0][1]]
    # asked for nothing: nothing
    assert "input_token_logprobs" not in gen(url, {**base, "return_logprob": False})["meta_info"]


def test_a_dsl_gen_with_return_logprob_has_it(url):
    @sgl.function
    def qa(s):
        s += "Q: What is the capital of France?\nA:" + sgl.gen("answer", max_tokens=2, return_logprob=True)

    meta = qa.run(temperature=0, backend=sgl.RuntimeEndpoint(url)).get_meta_info("answer")
    assert len(meta["input_token_logprobs"]) == 1 and len(meta["output_token_logprobs"]) == 2


def test_openai_logprobs_are_the_replys_only(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                       temperature=0, logprobs=True)
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    c = client.completions.create(model="default", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1)
    assert len(c.choices[0].logprobs.tokens) == c.usage.completion_tokens
    assert "".join(c.choices[0].logprobs.tokens) == c.choices[0].text

"""A poison request never hurts the requests batched beside it (issue 32): a row whose logits
go non-finite fails alone, in the offline Engine and over HTTP, and grammars that nest too
deeply or fail at compile time leave ordinary requests' outputs exactly as they are alone."""
from __future__ import annotations

import json
import threading

import pytest
import requests

from treadle.runtime import Engine
from treadle.runtime.server.testing import ServerProcess, wait_idle

pytestmark = pytest.mark.slow
T = 120
PROMPTS = ["The capital of France is", "One, two, three,", "def add(a, b):"]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
SAMPLED = {"max_new_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 7, "ignore_eos": True}
POISON_TOKENS = 7  # the poisoned request's max_new_tokens: how the injected fault finds its rows


def poison_rows(sched, after: int = 2) -> None:
    """Make the logits rows of requests with max_new_tokens == POISON_TOKENS NaN once they have
    `after` output tokens, at the sampler's input: a row gone non-finite mid-batch, as a model
    overflow would make (the 400 for poison parameters leaves no other way to reach it)."""
    launch = sched.sampler.launch

    def poisoned(logits, reqs, *args, **kwargs):
        rows = [i for i, r in enumerate(reqs) if r.params.max_new_tokens == POISON_TOKENS
                and len(r.output_ids) >= after]
        if rows:
            logits = logits.clone()
            logits[rows] = float("nan")
        return launch(logits, reqs, *args, **kwargs)

    sched.sampler.launch = poisoned


def run_concurrently(fns) -> list:
    out: list = [None] * len(fns)

    def go(i, fn):
        try:
            out[i] = fn()
        except Exception as e:  # noqa: BLE001 - the poison's error is an outcome to check
            out[i] = e

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    return out


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_non_finite_row_fails_alone_in_the_engine(overlap):
    with Engine(max_total_tokens=4096, overlap_schedule=overlap) as e:
        alone = [e.generate(p, sp)["output_ids"] for p in PROMPTS for sp in (GREEDY, SAMPLED)]
        e._call(poison_rows)
        poison = {**SAMPLED, "max_new_tokens": POISON_TOKENS, "repetition_penalty": 1.2}
        fns = [lambda p=p, sp=sp: e.generate(p, sp)["output_ids"] for p in PROMPTS for sp in (GREEDY, SAMPLED)]
        fns.append(lambda: e.generate(PROMPTS[0], poison))
        fns.append(lambda: e.generate(PROMPTS[1], {**GREEDY, "max_new_tokens": POISON_TOKENS}))
        *together, bad_sampled, bad_greedy = run_concurrently(fns)
        assert together == alone
        for bad in (bad_sampled, bad_greedy):
            assert isinstance(bad, RuntimeError) and "not finite" in str(bad), bad
        info = e.get_server_info()
        assert info["failed_rows"] == 2
        # nothing was rebuilt: the prompts are still cached, and no slot leaked
        assert e.generate(PROMPTS[2], GREEDY)["meta_info"]["cached_tokens"] > 0
        e._call(lambda s: s.check_integrity())


@pytest.fixture(scope="module")
def srv():
    s = ServerProcess(["--max-total-tokens", "8192", "--log-level", "warning"])
    yield s
    s.close()


def generate(srv, body: dict) -> requests.Response:
    return requests.post(srv.url + "/generate", json=body, timeout=T)


DEEP = 100_000
POISONS = {
    "repetition_penalty": {"text": PROMPTS[0], "sampling_params": {**SAMPLED, "repetition_penalty": 1e-40}},
    "deep-json_schema": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "json_schema": "[" * DEEP}},
    "deep-structural_tag": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "structural_tag":
                                                                    '{"a":' * DEEP + "1" + "}" * DEEP}},
    "deep-ebnf": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "ebnf": "root ::= " + "(" * DEEP + '"a"'
                                                          + ")" * DEEP}},
    # passes the HTTP checks, fails in the scheduler's compile worker
    "compile-fails": {"text": PROMPTS[0], "sampling_params": {**GREEDY, "regex": "(?=a)b"}},
}


@pytest.fixture(scope="module")
def alone(srv):
    return [generate(srv, {"text": p, "sampling_params": sp}).json()["output_ids"]
            for p in PROMPTS for sp in (GREEDY, SAMPLED)]


def test_bystanders_unaffected_by_poison_requests(srv, alone):
    """Ordinary requests sent together with one of each poison: the same outputs as alone; each
    poison a 400 of its own; nothing failed in a batch step, nothing left in flight."""
    fns = [lambda p=p, sp=sp: generate(srv, {"text": p, "sampling_params": sp})
           for p in PROMPTS for sp in (GREEDY, SAMPLED)]
    fns += [lambda body=body: generate(srv, body) for body in POISONS.values()]
    res = run_concurrently(fns)
    together, poisons = res[:len(alone)], res[len(alone):]
    assert [r.status_code for r in together] == [200] * len(together)
    assert [r.json()["output_ids"] for r in together] == alone
    for kind, p in zip(POISONS, poisons):
        assert p.status_code == 400, (kind, p.status_code, p.text[:300])
        assert p.json()["error"]["message"]
    wait_idle(srv.url)
    info = requests.get(srv.url + "/get_server_info", timeout=T).json()
    assert info["failed_rows"] == 0 and info["retractions"] == 0

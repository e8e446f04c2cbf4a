"""A poison request never hurts the requests batched beside it (issue 32): a row whose logits
go non-finite fails alone, its own error, while the rest of its batch samples as it would
alone (the HTTP bystander test, with each poison a client can send, is in
test_hostile_inputs.py, beside its server)."""
from __future__ import annotations

import threading

import pytest

from treadle.runtime import Engine

pytestmark = pytest.mark.slow
T = 120
PROMPTS = ["The capital of France is", "One, two, three,", "def add(a, b):"]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
SAMPLED = {"max_new_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 7, "ignore_eos": True}
POISON_TOKENS = 7  # the poisoned request's max_new_tokens: how the injected fault finds its rows


def poison_rows(sched, after: int = 2) -> None:
    """Spoil the logits rows of requests with max_new_tokens == POISON_TOKENS once they have
    `after` output tokens, at the sampler's input: a row gone non-finite mid-batch, as a model
    or penalty overflow makes (the 400 for poison parameters leaves no other way to reach it):
    +inf in a few columns of a sampled row (what repetition_penalty 1e-40 made, and what
    failed the whole batch in multinomial), NaN in all of a greedy one."""
    launch = sched.sampler.launch

    def poisoned(logits, reqs, *args, **kwargs):
        rows = [i for i, r in enumerate(reqs) if r.params.max_new_tokens == POISON_TOKENS
                and len(r.output_ids) >= after]
        if rows:
            logits = logits.clone()
            for i in rows:
                if reqs[i].params.is_greedy:
                    logits[i] = float("nan")
                else:
                    logits[i, :50] = float("inf")
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

"""Admission and retraction under KV pressure (session 47), on the dummy model's real
forward: a short request is not held behind a long generation the pool cannot take yet, the
request retracted when decode runs out of slots is the one with the most left to write (not
a short one about to finish), no request is retracted more than WHOLE_RESERVE_AFTER times,
and greedy outputs and KV accounting are as without pressure. Counted in scheduler steps."""
from __future__ import annotations

import pytest
import torch

from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.model_runner import ModelRunner
from treadle.runtime.sampling_params import SamplingParams
from treadle.runtime.scheduler import WHOLE_RESERVE_AFTER, Scheduler


def ids(first: int, n: int, mod: int) -> list[int]:
    return [100 + (first + i) % mod for i in range(n)]


LONG_A, LONG_B = ids(3, 8, 50), ids(5, 11, 40)  # two long generations (ignore_eos)
SHORT_S, SHORT_T = ids(7, 6, 30), ids(9, 7, 20)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The dummy model's matrices are tiny: one thread computes them in a fraction of the time
    that threads contending for a loaded CI box's cores take (0.6 s against 8 s here)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def run(pool: int, work: list[tuple[int, str, list[int], int]]) -> dict:
    """Step a scheduler over `work` ((arrival step, rid, prompt, max_new_tokens)) until idle;
    returns per request its output ids, the step of its first token and of its end, its
    retractions, and the scheduler's stats. Checks the KV accounting at every step."""
    # the starvation bound is wall-clock: out of reach here, so that the steps counted do not
    # depend on how loaded the machine is
    args = EngineArgs(model_path="dummy:tiny-llama", max_total_tokens=pool, device="cpu", starvation_bound_s=3600.0)
    sched = Scheduler(args, ModelRunner(args), None)
    pending, reqs, out = sorted(work, key=lambda w: w[0]), {}, {}
    step = 0
    while pending or sched.has_work():
        while pending and pending[0][0] <= step:
            _, rid, prompt, n = pending.pop(0)
            sched.add_request(TokenizedGenerateReq(rid, prompt, SamplingParams(
                max_new_tokens=n, temperature=0, ignore_eos=True), stream=True))
            reqs[rid] = sched._live[rid]
            out[rid] = {"ids": [], "arrival": step}
        for o in sched.step():
            r = out[o.rid]
            assert o.error is None, (o.rid, o.error)
            if o.new_ids and "first" not in r:
                r["first"] = step
            r["ids"] += list(o.new_ids)
            if o.finished is not None:
                assert o.finished["type"] == "length", o.finished
                r["done"] = step
        sched.check_integrity()
        step += 1
        assert step < 2000, "no progress"
    sched.step()
    info = sched.info()
    assert info["free_slots"] + info["evictable_slots"] == info["total_slots"], "a KV slot leaked"
    assert info["protected_slots"] == 0
    for rid, r in out.items():
        r["retractions"] = reqs[rid].num_retractions
        assert len(r["ids"]) == next(w[3] for w in work if w[1] == rid), rid
    return {"reqs": out, "stats": info, "steps": step}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """Every request of the tests below at once in a pool that holds them all: no pressure."""
    work = [(0, "longA", LONG_A, 60), (0, "longB", LONG_B, 60), (0, "shortS", SHORT_S, 12),
            (0, "shortT", SHORT_T, 12)]
    res = run(1024, work)
    assert res["stats"]["retractions"] == 0 and res["stats"]["bypass_admissions"] == 0
    assert all(r["first"] == 0 for r in res["reqs"].values())  # all admitted at once
    return {rid: r["ids"] for rid, r in res["reqs"].items()}


def test_short_requests_pass_a_long_one_the_pool_cannot_hold_yet(reference):
    """Two 60-token generations in a 100-slot pool: the second waits until the first is done
    (its reserve does not fit). Two 8-token requests queued behind it fit the pool whole; they
    waited for it, 60 steps, and now run at once."""
    work = [(0, "longA", LONG_A, 60), (0, "longB", LONG_B, 60), (0, "shortS", SHORT_S, 8),
            (0, "shortT", SHORT_T, 8)]
    res = run(100, work)
    reqs = res["reqs"]
    assert reqs["longB"]["first"] > 40, "the pool was meant to be too small for both long ones"
    for rid in ("shortS", "shortT"):
        assert reqs[rid]["first"] - reqs[rid]["arrival"] <= 2, (rid, reqs[rid])
        assert reqs[rid]["done"] <= 10, (rid, reqs[rid])
        assert reqs[rid]["ids"] == reference[rid][:8]
    assert res["stats"]["bypass_admissions"] == 2
    for rid in ("longA", "longB"):
        assert reqs[rid]["ids"] == reference[rid]
    assert res["stats"]["retractions"] == 0


def test_retraction_takes_the_request_with_the_most_left_not_a_short_one(reference):
    """Two long generations admitted on the optimistic reserve outgrow a 140-slot pool while
    a 12-token request that came later is running: the one retracted is a long one (it has
    the most left to write), and the short one finishes without a re-prefill. Each request
    is retracted at most WHOLE_RESERVE_AFTER times; outputs are those without pressure."""
    work = [(0, "longA", LONG_A, 60), (0, "longB", LONG_B, 60), (46, "shortS", SHORT_S, 12)]
    res = run(140, work)
    reqs = res["reqs"]
    assert res["stats"]["retractions"] >= 1, "the pool was meant to run out"
    assert reqs["shortS"]["retractions"] == 0, reqs["shortS"]
    assert reqs["shortS"]["done"] - reqs["shortS"]["arrival"] <= 12, reqs["shortS"]
    assert all(r["retractions"] <= WHOLE_RESERVE_AFTER for r in reqs.values())
    for rid, r in reqs.items():
        assert r["ids"] == reference[rid], rid

"""A batch step that raises, on the fake runner (tests/fake_runner.py): only the request that
makes steps fail gets an error; the others of its batch finish as they would alone (their
output so far kept, their KV rebuilt), and requests that make steps fail now and then, however
spaced out, never stop the scheduler. What a broken model (every forward failing) does is in
tests/test_scheduler.py (test_steps_that_keep_failing_raise); the same over a real server, in
tests/test_server_s40_server_poisoned_step.py."""
from __future__ import annotations

import random

import pytest

from fake_runner import VOCAB, FakeRunner, collect, drain, greedy, make_scheduler, reference_greedy, req
from treadle.runtime.scheduler import MAX_FAILED_STEPS


class PoisonRunner(FakeRunner):
    """Raises in every forward computing tokens for a request named in `poison` (rid -> the
    output tokens it must have first): a request whose steps fail wherever it runs, the way a
    request that trips a bug does. Counts the forwards that raised."""

    def __init__(self, poison: dict[str, int], **kw) -> None:
        super().__init__(**kw)
        self.poison, self.sched, self.raised = poison, None, 0

    def forward(self, fb):
        rows = set(fb.req_pool_indices.tolist())
        for r in self.sched._live.values():
            if r.req_pool_idx in rows and r.rid in self.poison and len(r.output_ids) >= self.poison[r.rid]:
                self.raised += 1
                raise RuntimeError(f"poisoned by {r.rid}")
        return super().forward(fb)


def poisoned_scheduler(poison: dict[str, int], runner_kw: dict | None = None, **args):
    runner = PoisonRunner(poison, **(runner_kw or {}))
    sched, _ = make_scheduler(runner, recover=True, **args)
    runner.sched = sched
    return sched, runner


def assert_clean(sched, runner) -> None:
    sched.check_integrity()
    assert not sched.has_work() and not sched._live
    assert not getattr(sched, "_suspects", None) and not getattr(sched, "_strikes", None)
    assert sched.tree.protected_size() == 0
    assert runner.allocator.available_size() + sched.tree.evictable_size() == runner.allocator.num_slots


CONFIGS = [{}, {"chunked_prefill_size": 4}, {"enable_mixed_chunk": True, "chunked_prefill_size": 6},
           {"overlap_schedule": "on"}, {"disable_radix_cache": True}]


@pytest.mark.parametrize("args", CONFIGS, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "default")
@pytest.mark.parametrize("after", [0, 3])
def test_a_poisoned_request_fails_alone_and_its_batch_finishes_as_alone(args, after):
    """Six requests (two streamed) and a poisoned one whose steps fail from its prefill on
    (after=0) or once it has 3 tokens (mid-decode, beside the others): each of the six gives
    what it gives alone, token for token, streamed chunks included; the poisoned one ends
    with an error of its own (not an internal one) after the tokens it made; no KV leaks."""
    rng = random.Random(7)
    prompts = {f"r{i}": [rng.randrange(3, VOCAB) for _ in range(5 + 3 * i)] for i in range(6)}
    sched, runner = poisoned_scheduler({"bad": after}, **args)
    outs = []
    for i, (rid, p) in enumerate(prompts.items()):
        sched.add_request(req(rid, p, greedy(12), stream=i % 3 == 0))
        if i == 2:
            outs += sched.step()  # the first three run before the rest arrive
    sched.add_request(req("bad", [5, 6, 7, 8], greedy(12), stream=True))
    outs += drain(sched, check_each_step=True)
    res = collect(outs)
    for rid, p in prompts.items():
        got, fin = res[rid]
        assert not fin.error and got == reference_greedy(p, 12), rid
    got, fin = res["bad"]
    assert fin.error and not fin.internal and "made its batch step fail" in fin.error and "poisoned by bad" in fin.error
    assert fin.finished["type"] == "abort" and got == reference_greedy([5, 6, 7, 8], 12)[:after]
    assert runner.raised >= 2  # once beside the others (or alone), then alone again
    assert_clean(sched, runner)


def test_poisoned_requests_spaced_out_never_stop_the_scheduler():
    """Ten poisoned requests, each alone on an idle scheduler: each gets its own error, and
    the scheduler serves the next request. Before, their failed steps counted as failures in
    a row across the idle time between them, and the fourth raised out of step() (in the
    server: the scheduler process, and with it the server, died)."""
    sched, runner = poisoned_scheduler({f"bad{i}": 0 for i in range(10)})
    for i in range(10):
        sched.add_request(req(f"bad{i}", [9, 10 + i, 11], greedy(4)))
        res = collect(drain(sched, check_each_step=True))
        assert res[f"bad{i}"][1].error and not res[f"bad{i}"][1].internal
        sched.add_request(req(f"ok{i}", [12, 13 + i], greedy(4)))
        res = collect(drain(sched, check_each_step=True))
        assert res[f"ok{i}"][0] == reference_greedy([12, 13 + i], 4) and not res[f"ok{i}"][1].error
    assert runner.raised == 20  # twice alone each
    assert sched.stats["failed_steps"] == 20 and sched.stats["failed_step_requests"] == 10
    assert_clean(sched, runner)


def test_poisoned_requests_back_to_back_never_stop_the_scheduler():
    """More than MAX_FAILED_STEPS poisoned requests queued together, nothing else: every
    failed step has a single request in it, and each is that request's (the canary after it
    passes): no failure counts against the server."""
    n = MAX_FAILED_STEPS + 3
    sched, runner = poisoned_scheduler({f"bad{i}": 0 for i in range(n)}, runner_kw={"max_running": 1})
    for i in range(n):
        sched.add_request(req(f"bad{i}", [9, 10 + i, 11], greedy(4)))
    res = collect(drain(sched, check_each_step=True))
    assert all(res[f"bad{i}"][1].error and not res[f"bad{i}"][1].internal for i in range(n))
    assert_clean(sched, runner)


def test_a_fault_that_does_not_recur_costs_no_request():
    """A forward that raises once, mid-decode of a batch of three (a transient fault): the
    three run again alone, then batched, and each gives its output alone, no error."""
    from test_scheduler import FailingRunner

    rng = random.Random(3)
    prompts = {k: [rng.randrange(3, VOCAB) for _ in range(n)] for k, n in (("A", 6), ("B", 9), ("C", 4))}
    runner = FailingRunner(fail_at={3})
    sched, _ = make_scheduler(runner, recover=True)
    for rid, p in prompts.items():
        sched.add_request(req(rid, p, greedy(10)))
    res = collect(drain(sched, check_each_step=True))
    for rid, p in prompts.items():
        assert res[rid][0] == reference_greedy(p, 10) and not res[rid][1].error, rid
    assert sched.stats["forward_steps"] >= 10
    assert_clean(sched, runner)


def test_an_aborted_suspect_leaves_no_trace():
    """A request of a failed step, waiting to run alone again, is aborted: it ends at once;
    the others finish and nothing is left behind."""
    sched, runner = poisoned_scheduler({"bad": 2})
    sched.add_request(req("a", [3, 4, 5], greedy(8)))
    sched.add_request(req("bad", [6, 7, 8], greedy(8)))
    outs = []
    while not sched._suspects:
        outs += sched.step()
    assert sched.abort("a")
    outs += drain(sched, check_each_step=True)
    res = collect(outs)
    assert res["a"][1].finished["type"] == "abort" and res["bad"][1].error
    assert_clean(sched, runner)

"""Property test: random workloads through the scheduler on the fake runner.

Prompts share a few prefixes, requests arrive at random steps, some are aborted at random
steps, and the pool / chunk size / policy / cache switch vary. Every request must finish
exactly once, every request that was not aborted must equal its isolated greedy reference,
KV accounting must hold after every step, and nothing may stay allocated at the end."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_runner import FakeRunner, collect, greedy, make_scheduler, reference_greedy, req

TOKEN = st.integers(min_value=3, max_value=63)


@st.composite
def workloads(draw):
    prefixes = draw(st.lists(st.lists(TOKEN, min_size=0, max_size=12), min_size=1, max_size=3))
    n = draw(st.integers(1, 7))
    reqs = []
    for i in range(n):
        p = draw(st.sampled_from(prefixes)) + draw(st.lists(TOKEN, min_size=1, max_size=8))
        if reqs and draw(st.booleans()) and draw(st.booleans()):
            p = list(draw(st.sampled_from(reqs))[1])  # an exact repeat of an earlier prompt
        reqs.append((f"r{i}", p, draw(st.integers(0, 10)), draw(st.integers(0, 6))))  # rid, prompt, max_new, arrival
    longest = max(len(p) + m for _, p, m, _ in reqs)
    cfg = dict(
        num_slots=longest + draw(st.sampled_from([0, 1, 3, 8, 20, 60])),
        max_running=draw(st.integers(1, 5)),
        context_len=draw(st.integers(max(len(p) for _, p, _, _ in reqs) + 1, 48)),
        eos_at_len=set(draw(st.lists(st.integers(5, 30), max_size=2))),
    )
    args = dict(
        chunked_prefill_size=draw(st.sampled_from([0, 1, 3, 5, 8, 16])),
        max_prefill_tokens=draw(st.sampled_from([1, 4, 9, 64])),
        schedule_policy=draw(st.sampled_from(["lpm", "fcfs"])),
        disable_radix_cache=draw(st.booleans()),
        overlap_schedule=draw(st.sampled_from(["off", "on"])),
        enable_mixed_chunk=draw(st.booleans()),
    )
    aborts = draw(st.lists(st.tuples(st.integers(0, 25), st.integers(0, n - 1)), max_size=3))
    return reqs, cfg, args, aborts


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads(w):
    check_workload(w)


def test_overlap_workload_chains_steps():
    # a fixed workload with overlap on: decode steps do chain (the property test's "on"
    # examples then exercise the same path), with an abort and EOS mid-flight
    reqs = [("a", [3, 4, 5], 10, 0), ("b", [3, 4, 6, 7], 8, 0), ("c", [9] * 5, 6, 2), ("d", [3, 4], 10, 4)]
    cfg = dict(num_slots=64, max_running=4, context_len=40, eos_at_len={12})
    args = dict(chunked_prefill_size=0, max_prefill_tokens=64, schedule_policy="lpm",
                disable_radix_cache=False, overlap_schedule="on")
    sched = check_workload((reqs, cfg, args, [(7, 1)]))
    assert sched.stats["overlap_steps"] > 3


def check_workload(w):
    reqs, cfg, args, aborts = w
    runner = FakeRunner(**cfg)
    sched, _ = make_scheduler(runner, **args)
    outs, aborted = [], set()
    pending = sorted(reqs, key=lambda r: r[3])
    step = 0
    while pending or sched.has_work():
        while pending and pending[0][3] <= step:
            rid, p, m, _ = pending.pop(0)
            sched.add_request(req(rid, p, greedy(m)))
        for at, i in aborts:
            if at == step and sched.abort(reqs[i][0]):
                aborted.add(reqs[i][0])
        outs += sched.step()
        sched.check_integrity()
        step += 1
        assert step < 2000, "no progress"
    outs += sched.step()
    res = collect(outs)
    assert set(res) == {rid for rid, _, _, _ in reqs}
    for rid, p, m, _ in reqs:
        got, fin = res[rid]
        want = reference_greedy(p, m, context_len=cfg["context_len"], eos_at_len=cfg["eos_at_len"])
        if rid in aborted:
            assert fin.finished["type"] == "abort"
            assert got == want[: len(got)], rid
        else:
            assert fin.error is None and fin.finished["type"] in ("stop", "length"), fin.finished
            assert got == want, rid
    sched.check_integrity()
    assert sched.tree.protected_size() == 0
    assert runner.allocator.available_size() + sched.tree.evictable_size() == runner.allocator.num_slots
    assert runner.req_to_token_pool.available_size() == runner.req_to_token_pool.max_requests
    return sched

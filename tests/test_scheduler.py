"""Scheduler tests on a fake model runner (tests/fake_runner.py): batching, chunked prefill,
the radix cache, retraction, admission order, aborts, rejections and stop conditions.

The fake checks on every forward that the KV slots the scheduler hands it hold the right
tokens, and its greedy output is a pure function of the sequence, so every output can be
compared to `reference_greedy` (what the request yields run alone, with no scheduler)."""
from __future__ import annotations

import random

import pytest
import torch

from fake_runner import (EOS, VOCAB, FakeRunner, collect, drain, greedy, logits_row, make_scheduler,
                         next_token, reference_greedy, req)
from fake_runner import _SEED, chain  # prompt-logprob expectations
from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.forward_batch import ForwardMode
from treadle.runtime.scheduler import Scheduler
from treadle.runtime.sampling_params import SamplingParams


def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def assert_idle_clean(sched, runner: FakeRunner) -> None:
    sched.check_integrity()
    assert not sched.has_work()
    assert sched.tree.protected_size() == 0, "a finished request left its prefix locked"
    assert runner.allocator.available_size() + sched.tree.evictable_size() == runner.allocator.num_slots
    pool = runner.req_to_token_pool
    assert pool.available_size() == pool.max_requests - len(pool.reserved_rows())


def workload(seed: int = 0):
    """Prompts over two shared prefixes, a duplicate, and a long one; mixed lengths."""
    rng = random.Random(seed)
    pa, pb = toks(rng, 12), toks(rng, 20)
    prompts = [pa + toks(rng, 3), pb + toks(rng, 6), pa + toks(rng, 9), toks(rng, 5), pb + toks(rng, 1),
               toks(rng, 40), pa + toks(rng, 3)]
    prompts.append(list(prompts[0]))  # exact duplicate
    prompts.append(pb[:10])  # a prefix of another prompt
    return [(f"r{i}", p, rng.randint(1, 12)) for i, p in enumerate(prompts)]


EOS_AT = {30}  # requests reaching 30 tokens emit EOS: a stop condition mid-batch


def run_workload(runner: FakeRunner, **args) -> dict:
    sched, _ = make_scheduler(runner, **args)
    work = workload()
    outs = []
    for rid, p, m in work[:5]:
        sched.add_request(req(rid, p, greedy(m)))
    for _ in range(3):  # let some decode before the second wave arrives
        outs += sched.step()
        sched.check_integrity()
    for rid, p, m in work[5:]:
        sched.add_request(req(rid, p, greedy(m)))
    outs += drain(sched, check_each_step=True)
    assert_idle_clean(sched, runner)
    return collect(outs)


CONFIGS = [
    {},
    {"disable_radix_cache": True},
    {"chunked_prefill_size": 4},
    {"chunked_prefill_size": 7},
    {"chunked_prefill_size": 0},
    {"chunked_prefill_size": 4, "disable_radix_cache": True},
    {"max_prefill_tokens": 5, "chunked_prefill_size": 0},
    {"max_prefill_tokens": 5, "chunked_prefill_size": 7},
    {"schedule_policy": "fcfs"},
    {"schedule_policy": "fcfs", "chunked_prefill_size": 7},
    {"enable_mixed_chunk": True},
    {"enable_mixed_chunk": True, "chunked_prefill_size": 7},
    {"enable_mixed_chunk": True, "chunked_prefill_size": 4, "disable_radix_cache": True},
]


@pytest.mark.parametrize("args", CONFIGS, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_outputs_equal_reference(args):
    res = run_workload(FakeRunner(eos_at_len=EOS_AT), **args)
    for rid, p, m in workload():
        want = reference_greedy(p, m, eos_at_len=EOS_AT)
        got, fin = res[rid]
        assert got == want, rid
        assert fin.new_ids is not None and fin.error is None
        if want and want[-1] == EOS:
            assert fin.finished == {"type": "stop", "matched": EOS}
        else:
            assert fin.finished["type"] == "length" and len(got) == m


def test_reference_matches_a_request_run_alone():
    """The pure reference is what one request yields on its own in a scheduler."""
    for rid, p, m in workload():
        sched, runner = make_scheduler(FakeRunner(eos_at_len=EOS_AT))
        sched.add_request(req(rid, p, greedy(m)))
        got, _ = collect(drain(sched))[rid]
        assert got == reference_greedy(p, m, eos_at_len=EOS_AT)


def test_fake_detects_wrong_kv_slots():
    """The fake must notice a request reading KV written for another sequence."""
    runner = FakeRunner()
    sched, _ = make_scheduler(runner)
    sched.add_request(req("a", [5, 6, 7, 8], greedy(3)))
    drain(sched)
    # corrupt: make the cached slot of position 1 claim another token
    slot = next(s for s, (pos, _, _) in runner.kv.items() if pos == 1)
    pos, tok, h = runner.kv[slot]
    runner.kv[slot] = (pos, tok + 1, h)
    sched.add_request(req("b", [5, 6, 7, 8], greedy(3)))
    with pytest.raises(AssertionError, match="another prefix"):
        drain(sched)


# ------------------------------------------------------------------ chunked prefill


def test_chunked_prefill_splits_long_prompt_and_decode_resumes():
    rng = random.Random(1)
    short, long = toks(rng, 5), toks(rng, 50)
    runner = FakeRunner()
    sched, _ = make_scheduler(runner, chunked_prefill_size=8)
    sched.add_request(req("short", short, greedy(30)))
    outs = sched.step() + sched.step() + sched.step()  # short is decoding
    short_row = runner.steps[0].rows[0]
    n_before = len(runner.steps)
    sched.add_request(req("long", long, greedy(6)))
    outs += drain(sched, check_each_step=True)
    res = collect(outs)
    assert res["short"][0] == reference_greedy(short, 30)
    assert res["long"][0] == reference_greedy(long, 6)
    extends = [s for s in runner.steps if s.mode == ForwardMode.EXTEND]
    assert all(sum(s.extend_lens) <= 8 for s in extends), [s.extend_lens for s in extends]
    long_chunks = [n for s in runner.steps[n_before:] if s.mode == ForwardMode.EXTEND
                   for r, n in zip(s.rows, s.extend_lens) if r != short_row]
    assert sum(long_chunks) == 50 and len(long_chunks) == 7  # 6 chunks of 8, then 2
    # the short request was never re-prefilled: it computed its prompt once, then 1 token a step
    short_tokens = sum(n for s in runner.steps for r, n in zip(s.rows, s.extend_lens) if r == short_row)
    assert short_tokens == 5 + 30 - 1
    # once the long prompt is in, both decode in the same batch
    assert any(s.mode == ForwardMode.DECODE and len(s.rows) == 2 for s in runner.steps[n_before:])


def test_chunks_are_shared_through_the_cache():
    """A prefill chunk is cached at once: an identical prompt arriving while the first is still
    mid-prefill reuses the chunks computed so far."""
    rng = random.Random(2)
    long = toks(rng, 33)
    runner = FakeRunner()
    sched, _ = make_scheduler(runner, chunked_prefill_size=8)
    sched.add_request(req("a", long, greedy(2)))
    outs = sched.step() + sched.step()  # 16 of 33 prompt tokens computed
    assert sched.chunked is not None and runner.computed_tokens == 16
    sched.add_request(req("b", long, greedy(2)))
    outs += drain(sched, check_each_step=True)
    res = collect(outs)
    # b was admitted behind a's chunks: it reuses all of a's prompt but the last token
    assert res["b"][1].cached_tokens == 32
    assert runner.computed_tokens == 33 + 1 + 2  # a's prompt, b's last token, one decode each
    assert res["b"][0] == res["a"][0] == reference_greedy(long, 2)
    assert_idle_clean(sched, runner)


# ------------------------------------------------------------------ radix cache


def test_repeated_prompt_hits_cache():
    rng = random.Random(3)
    p = toks(rng, 20)
    runner = FakeRunner()
    sched, _ = make_scheduler(runner)
    sched.add_request(req("a", p, greedy(5)))
    ra = collect(drain(sched))["a"]
    assert ra[1].cached_tokens == 0
    n = len(runner.steps)
    sched.add_request(req("b", p, greedy(5)))
    rb = collect(drain(sched))["b"]
    assert rb[1].cached_tokens == len(p) - 1
    assert runner.steps[n].mode == ForwardMode.EXTEND and runner.steps[n].extend_lens == [1]
    assert rb[0] == ra[0] == reference_greedy(p, 5)
    assert sched.stats["cached_tokens"] == len(p) - 1
    assert_idle_clean(sched, runner)


def test_repeated_prompt_without_cache_recomputes():
    rng = random.Random(3)
    p = toks(rng, 20)
    runner = FakeRunner()
    sched, _ = make_scheduler(runner, disable_radix_cache=True)
    for rid in ("a", "b"):
        sched.add_request(req(rid, p, greedy(5)))
        n = len(runner.steps)
        res = collect(drain(sched))[rid]
        assert res[1].cached_tokens == 0 and runner.steps[n].extend_lens == [20]
        assert res[0] == reference_greedy(p, 5)
    assert_idle_clean(sched, runner)
    assert sched.tree.total_size() == 0


def test_shared_prefix_and_generated_tokens_are_reused():
    rng = random.Random(4)
    prefix = toks(rng, 16)
    a = prefix + [10, 11, 12, 13]
    runner = FakeRunner()
    sched, _ = make_scheduler(runner)
    sched.add_request(req("a", a, greedy(6)))
    out_a = collect(drain(sched))["a"][0]
    # b shares only the prefix
    n = len(runner.steps)
    b = prefix + [20, 21, 22, 23, 24]
    sched.add_request(req("b", b, greedy(4)))
    rb = collect(drain(sched))["b"]
    assert rb[1].cached_tokens == 16 and runner.steps[n].extend_lens == [5]
    assert rb[0] == reference_greedy(b, 4)
    # c continues a's conversation: a's prompt + its first 5 outputs (all have KV) + new text
    c = a + out_a[:5] + [30, 31]
    n = len(runner.steps)
    sched.add_request(req("c", c, greedy(3)))
    rc = collect(drain(sched))["c"]
    assert rc[1].cached_tokens == len(a) + 5 and runner.steps[n].extend_lens == [2]
    assert rc[0] == reference_greedy(c, 3)
    assert_idle_clean(sched, runner)


def expected_prompt_logprobs(prompt: list[int], start: int) -> list[float]:
    """logprob of prompt[p] under the logits at p - 1, for p in [max(start, 1), len)."""
    vals, h = [], _SEED
    for p, t in enumerate(prompt):
        if p >= max(start, 1):
            lp = torch.log_softmax(logits_row(next_token(h, p)), dim=-1)
            vals.append(float(lp[t]))
        h = chain(h, t)
    return vals


@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("start", [0, 1, 10, 19])
def test_prompt_logprobs_limit_cache_reuse(start, chunk):
    rng = random.Random(5)
    p = toks(rng, 20)
    runner = FakeRunner()
    sched, _ = make_scheduler(runner, chunked_prefill_size=chunk)
    sched.add_request(req("warm", p, greedy(3)))
    drain(sched)
    before = runner.computed_tokens
    sched.add_request(req("lp", p, greedy(3), return_logprob=True, logprob_start_len=start))
    got, fin = collect(drain(sched))["lp"]
    cached = max(0, start - 1)
    assert fin.cached_tokens == cached
    assert runner.computed_tokens - before == (len(p) - cached) + 2  # prompt rest + 2 decodes
    assert got == reference_greedy(p, 3)
    want = expected_prompt_logprobs(p, start)
    lps = fin.input_logprobs
    assert len(lps) == len(p) - start
    if start == 0:
        assert lps[0] is None
        lps = lps[1:]
    assert lps == pytest.approx(want, abs=1e-5)
    assert len(fin.output_logprobs) == 3
    assert_idle_clean(sched, runner)


# ------------------------------------------------------------------ retraction


@pytest.mark.parametrize("args", [{}, {"disable_radix_cache": True}, {"chunked_prefill_size": 8}],
                         ids=["cache", "nocache", "chunk8"])
def test_retraction_under_tiny_pool(args):
    rng = random.Random(6)
    work = [(f"r{i}", [3 + i] + toks(rng, 9), 30) for i in range(6)]  # each needs 40 of 64 slots
    runner = FakeRunner(num_slots=64)
    sched, _ = make_scheduler(runner, **args)
    for rid, p, m in work:
        sched.add_request(req(rid, p, greedy(m)))
    res = collect(drain(sched, check_each_step=True))
    for rid, p, m in work:
        assert res[rid][0] == reference_greedy(p, m), rid
        assert res[rid][1].finished["type"] == "length"
    assert sched.stats["retractions"] > 0
    assert_idle_clean(sched, runner)


def test_retraction_with_a_chunked_prefill_in_flight():
    """A long prompt mid-chunked-prefill holds locked KV while a running request decodes into a
    pool too small for both. The scheduler must make room (retract or pause) instead of crashing:
    each request fits the pool on its own, so both must finish."""
    rng = random.Random(7)
    a, b = [3] + toks(rng, 4), [4] + toks(rng, 29)
    runner = FakeRunner(num_slots=40)
    sched, _ = make_scheduler(runner, chunked_prefill_size=8)
    sched.add_request(req("a", a, greedy(30)))  # 35 slots
    outs = sched.step()
    sched.add_request(req("b", b, greedy(5)))  # 35 slots
    outs += drain(sched, check_each_step=True)
    res = collect(outs)
    assert res["a"][0] == reference_greedy(a, 30)
    assert res["b"][0] == reference_greedy(b, 5)
    assert_idle_clean(sched, runner)


# ------------------------------------------------------------------ admission order


def order_of_admission(policy: str, **args) -> list[str]:
    rng = random.Random(8)
    shared = toks(rng, 15)
    runner = FakeRunner(max_running=1)
    sched, _ = make_scheduler(runner, schedule_policy=policy, **args)
    sched.add_request(req("warm", shared + [7], greedy(2)))
    drain(sched)
    sched.add_request(req("A", [3] + toks(rng, 6), greedy(2)))
    sched.add_request(req("B", [4] + toks(rng, 6), greedy(2)))
    sched.add_request(req("C", shared + [9, 9], greedy(2)))
    return sched, runner


def finish_order(sched) -> list[str]:
    outs = drain(sched)
    return [o.rid for o in outs if o.finished is not None]


def test_lpm_admits_cached_prefix_first():
    sched, _ = order_of_admission("lpm")
    assert finish_order(sched) == ["C", "A", "B"]


def test_fcfs_admits_in_arrival_order():
    sched, _ = order_of_admission("fcfs")
    assert finish_order(sched) == ["A", "B", "C"]


def test_starvation_bound_zero_means_arrival_order_under_lpm():
    sched, _ = order_of_admission("lpm", starvation_bound_s=0.0)
    assert finish_order(sched) == ["A", "B", "C"]


def test_starved_request_admitted_first_under_lpm():
    sched, _ = order_of_admission("lpm", starvation_bound_s=10.0)
    b = next(r for r in sched.waiting if r.rid == "B")
    b.arrival -= 100.0  # B has been waiting far past the bound
    assert finish_order(sched) == ["B", "C", "A"]


# ------------------------------------------------------------------ abort


@pytest.mark.parametrize("target", ["waiting", "running", "chunked"])
def test_abort_frees_everything(target):
    rng = random.Random(9)
    prompts = {"O": [3] + toks(rng, 4), "R": [4] + toks(rng, 5), "L": [5] + toks(rng, 59), "W": [6] + toks(rng, 5)}
    news = {"O": 12, "R": 12, "L": 4, "W": 4}
    runner = FakeRunner(max_running=3)
    sched, _ = make_scheduler(runner, chunked_prefill_size=16)
    outs = []
    for rid in ("O", "R"):
        sched.add_request(req(rid, prompts[rid], greedy(news[rid])))
    outs += sched.step()  # O and R prefilled together (11 <= 16)
    sched.add_request(req("L", prompts["L"], greedy(news["L"])))
    outs += sched.step()  # L: first chunk of 16
    sched.add_request(req("W", prompts["W"], greedy(news["W"])))
    outs += sched.step()  # L: second chunk; W waits (running 2 + chunk 1 = max_running)
    assert sched.chunked is not None and sched.chunked.rid == "L"
    assert [r.rid for r in sched.waiting] == ["W"]
    assert sorted(r.rid for r in sched.running) == ["O", "R"]
    victim = {"waiting": "W", "running": "R", "chunked": "L"}[target]
    assert sched.abort(victim)
    assert not sched.abort(victim)  # already gone
    sched.check_integrity()
    outs += drain(sched, check_each_step=True)
    res = collect(outs)
    got, fin = res[victim]
    assert fin.finished["type"] == "abort"
    assert got == reference_greedy(prompts[victim], news[victim])[: len(got)]
    for rid in set(prompts) - {victim}:
        assert res[rid][0] == reference_greedy(prompts[rid], news[rid]), rid
    assert_idle_clean(sched, runner)


def test_abort_unknown_rid_is_false():
    sched, _ = make_scheduler()
    assert not sched.abort("nope")


# ------------------------------------------------------------------ rejections


BAD = {
    "too_long": ([5] * 64, SamplingParams(max_new_tokens=1, temperature=0.0), {}),
    "empty": ([], greedy(4), {}),
    "exceeds_pool": ([5] * 30, greedy(21), {}),  # on a 50-slot pool, the context 64 holding 34 new tokens
    "token_too_big": ([5, VOCAB, 6], greedy(4), {}),
    "token_negative": ([5, -1, 6], greedy(4), {}),
    "negative_temperature": ([5, 6], SamplingParams(max_new_tokens=4, temperature=-1.0), {}),
    "top_p_zero": ([5, 6], SamplingParams(max_new_tokens=4, top_p=0.0), {}),
    "top_k_zero": ([5, 6], SamplingParams(max_new_tokens=4, top_k=0), {}),
    "min_over_max": ([5, 6], greedy(4, min_new_tokens=5), {}),
    "negative_max_new": ([5, 6], greedy(-1), {}),
    "stop_id_out_of_vocab": ([5, 6], greedy(4, stop_token_ids=[VOCAB]), {}),
    "logprob_start_past_prompt": ([5, 6], greedy(4), {"return_logprob": True, "logprob_start_len": 2}),
    "negative_top_logprobs": ([5, 6], greedy(4), {"return_logprob": True, "top_logprobs_num": -1}),
    "too_many_top_logprobs": ([5, 6], greedy(4), {"return_logprob": True, "top_logprobs_num": VOCAB + 1}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_rejections(case):
    ids, params, kw = BAD[case]
    slots = 50 if case == "exceeds_pool" else 100
    runner = FakeRunner(num_slots=slots, context_len=64)
    sched, _ = make_scheduler(runner)
    sched.add_request(req("good", [7, 8, 9], greedy(3)))
    sched.add_request(req("bad", ids, params, **kw))
    assert runner.allocator.available_size() == slots  # nothing allocated for it
    assert [r.rid for r in sched.waiting] == ["good"]
    res = collect(drain(sched))
    got, fin = res["bad"]
    assert got == [] and fin.error and fin.finished["type"] == "abort"
    assert fin.completion_tokens == 0
    assert res["good"][0] == reference_greedy([7, 8, 9], 3)
    assert sched.stats["requests"] == 1
    assert_idle_clean(sched, runner)


def test_a_bug_preparing_one_request_stops_it_alone(monkeypatch):
    """A non-ValueError raised while preparing a request (a converter bug, say) ends that
    request with an internal error; the scheduler and the other requests go on."""
    from treadle.constrained import GrammarSpec

    def broken(**kw):
        raise IndexError("list index out of range")

    monkeypatch.setattr(GrammarSpec, "from_params", staticmethod(broken))
    runner = FakeRunner(num_slots=100, context_len=64)
    sched, _ = make_scheduler(runner)
    sched.add_request(req("good", [7, 8, 9], greedy(3)))
    sched.add_request(req("bad", [5, 6], greedy(3, regex="a+")))
    res = collect(drain(sched))
    got, fin = res["bad"]
    assert got == [] and fin.internal and "IndexError" in fin.error and fin.finished["type"] == "abort"
    assert res["good"][0] == reference_greedy([7, 8, 9], 3)
    assert_idle_clean(sched, runner)


def test_rejection_output_delivered_while_idle():
    sched, _ = make_scheduler()
    sched.add_request(req("bad", [], greedy(1)))
    assert not sched.has_work()
    outs = sched.step()
    assert [o.rid for o in outs] == ["bad"] and outs[0].error


def test_prompt_at_context_limit_minus_one_finishes_at_context():
    runner = FakeRunner(context_len=32)
    sched, _ = make_scheduler(runner)
    p = [5] * 31
    sched.add_request(req("a", p, greedy(10)))
    got, fin = collect(drain(sched))["a"]
    assert got == reference_greedy(p, 10, context_len=32) and len(got) == 1
    assert fin.finished["type"] == "length"


# ------------------------------------------------------------------ stop conditions


def test_max_new_tokens_zero_caches_prompt():
    rng = random.Random(10)
    p = toks(rng, 12)
    runner = FakeRunner()
    sched, _ = make_scheduler(runner)
    sched.add_request(req("warm", p, greedy(0)))
    got, fin = collect(drain(sched))["warm"]
    assert got == [] and fin.finished["type"] == "length" and fin.completion_tokens == 0
    assert all(s.num_logits <= 1 for s in runner.steps) and len(runner.steps) == 1
    sched.add_request(req("again", p, greedy(3)))
    got, fin = collect(drain(sched))["again"]
    assert fin.cached_tokens == len(p) - 1
    assert got == reference_greedy(p, 3)
    assert_idle_clean(sched, runner)


def test_eos_stops_and_min_new_tokens_suppresses_it():
    p = [9, 8, 7, 6]
    eos_at = {len(p) + 2}  # the third output token would be EOS
    runner = FakeRunner(eos_at_len=eos_at)
    sched, _ = make_scheduler(runner)
    sched.add_request(req("plain", p, greedy(8)))
    sched.add_request(req("min", p, greedy(8, min_new_tokens=5)))
    sched.add_request(req("ign", p, greedy(8, ignore_eos=True)))
    res = collect(drain(sched))
    plain, fin = res["plain"]
    assert len(plain) == 3 and plain[-1] == EOS and fin.finished == {"type": "stop", "matched": EOS}
    m = res["min"][0]
    assert EOS not in m[:5] and m == reference_greedy(p, 8, eos_at_len=eos_at, min_new_tokens=5)
    assert m[:2] == plain[:2] and m[2] == EOS + 1  # the runner-up replaced the masked EOS
    ign, fin = res["ign"]
    assert len(ign) == 8 and ign[2] == EOS and fin.finished["type"] == "length"
    assert ign == reference_greedy(p, 8, eos_at_len=eos_at, ignore_eos=True)


def test_stop_token_ids_stop():
    p = [11, 12, 13]
    ref = reference_greedy(p, 12)
    k = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i])
    sched, runner = make_scheduler()
    sched.add_request(req("a", p, greedy(12, stop_token_ids=[ref[k]])))
    got, fin = collect(drain(sched))["a"]
    assert got == ref[: k + 1]
    assert fin.finished == {"type": "stop", "matched": ref[k]}
    assert_idle_clean(sched, runner)


def test_stop_token_suppressed_by_min_new_tokens():
    p = [11, 12, 13]
    ref = reference_greedy(p, 12)
    stop = ref[1]
    sched, _ = make_scheduler()
    sched.add_request(req("a", p, greedy(12, stop_token_ids=[stop], min_new_tokens=4)))
    got, _ = collect(drain(sched))["a"]
    assert stop not in got[:4]
    assert got == reference_greedy(p, 12, stop_token_ids=(stop,), min_new_tokens=4)


# ------------------------------------------------------------------ seeded sampling


def test_seeded_sampling_is_batch_invariant():
    rng = random.Random(11)
    p = toks(rng, 8)
    seeded = SamplingParams(max_new_tokens=10, temperature=1.0, seed=1234)

    sched, _ = make_scheduler()
    sched.add_request(req("s", p, seeded))
    alone = collect(drain(sched))["s"][0]

    sched, runner = make_scheduler(chunked_prefill_size=8)
    sched.add_request(req("x", toks(rng, 12), SamplingParams(max_new_tokens=7, temperature=1.0)))
    sched.add_request(req("y", toks(rng, 5), greedy(15)))
    outs = sched.step()
    sched.add_request(req("s", p, SamplingParams(max_new_tokens=10, temperature=1.0, seed=1234)))
    sched.add_request(req("z", toks(rng, 20), SamplingParams(max_new_tokens=5, temperature=0.7, seed=7)))
    batched = collect(outs + drain(sched))["s"][0]
    assert batched == alone
    assert alone != reference_greedy(p, 10)  # it really sampled

    sched, _ = make_scheduler()
    sched.add_request(req("s", p, SamplingParams(max_new_tokens=10, temperature=1.0, seed=4321)))
    assert collect(drain(sched))["s"][0] != alone


@pytest.mark.parametrize("start", [0, 4])
def test_prompt_logprobs_survive_retraction(start):
    """A retracted request recomputes its prompt on re-admission; its prompt logprobs must still
    be reported once per prompt token, not once per admission."""
    rng = random.Random(12)
    work = [(f"r{i}", [3 + i] + toks(rng, 9), 30) for i in range(6)]
    runner = FakeRunner(num_slots=64)
    sched, _ = make_scheduler(runner)
    for rid, p, m in work:
        sched.add_request(req(rid, p, greedy(m), return_logprob=True, logprob_start_len=start))
    res = collect(drain(sched, check_each_step=True))
    assert sched.stats["retractions"] > 0
    for rid, p, m in work:
        got, fin = res[rid]
        assert got == reference_greedy(p, m), rid
        assert len(fin.output_logprobs) == m
        lps = fin.input_logprobs
        assert len(lps) == len(p) - start, (rid, len(lps))
        want = expected_prompt_logprobs(p, start)
        assert (lps[1:] if start == 0 else lps) == pytest.approx(want, abs=1e-5), rid


def test_streaming_chunks_concatenate_to_the_output():
    rng = random.Random(13)
    p = toks(rng, 7)
    sched, runner = make_scheduler(chunked_prefill_size=4)
    sched.add_request(req("s", p, greedy(9), stream=True))
    outs = drain(sched)
    assert len(outs) == 9  # one output per generated token, the last one finished
    assert all(len(o.new_ids) == 1 for o in outs)
    assert [o.finished is not None for o in outs] == [False] * 8 + [True]
    assert [t for o in outs for t in o.new_ids] == reference_greedy(p, 9)


def test_flush_cache_only_when_idle_and_frees_the_tree():
    sched, runner = make_scheduler()
    sched.add_request(req("a", [5, 6, 7, 8, 9], greedy(4)))
    sched.step()
    assert not sched.flush_cache()
    drain(sched)
    assert sched.tree.total_size() > 0
    assert sched.flush_cache()
    assert sched.tree.total_size() == 0 and runner.allocator.available_size() == runner.allocator.num_slots
    sched.check_integrity()


def test_requests_arriving_together_compute_a_shared_prefix_once():
    # eight prompts sharing a 60-token prefix, submitted in one go: the first is prefilled,
    # the rest wait one step and reuse its KV instead of computing the prefix again
    sched, runner = make_scheduler(chunked_prefill_size=0)
    shared = [5 + (i % 50) for i in range(60)]
    prompts = [shared + [7, 8 + i] for i in range(8)]
    for i, p in enumerate(prompts):
        sched.add_request(req(f"r{i}", p, greedy(3)))
    got = collect(drain(sched))
    for i, p in enumerate(prompts):
        assert got[f"r{i}"][0] == reference_greedy(p, 3)
    assert sum(got[f"r{i}"][1].cached_tokens for i in range(8)) >= 7 * 60
    # every prompt token beyond the shared prefix once per request, the prefix once
    assert runner.computed_tokens <= 60 + 8 * 2 + 8 * 3


class FailingRunner(FakeRunner):
    """Raises in the forward calls whose (0-based) index is in `fail_at` (all from
    `fail_from` on, when set)."""

    def __init__(self, fail_at=(), fail_from=None, **kw) -> None:
        super().__init__(**kw)
        self.fail_at, self.fail_from, self.calls = set(fail_at), fail_from, 0

    def forward(self, fb):
        i, self.calls = self.calls, self.calls + 1
        if i in self.fail_at or (self.fail_from is not None and i >= self.fail_from):
            raise RuntimeError(f"injected failure in forward call {i}")
        return super().forward(fb)


def test_a_failed_step_requeues_its_requests_not_stopping_them():
    """C's prefill raises once (a fault that does not recur): the KV state is rebuilt from
    empty, and A and B (decoding) and C go back to the front of the queue with their output so
    far, C first run alone; every request then gives its output alone, with no error."""
    rng = random.Random(21)
    prompts = {k: toks(rng, n) for k, n in (("A", 6), ("B", 9), ("C", 7), ("D", 5), ("E", 8))}
    runner = FailingRunner(fail_at={2}, max_running=3)
    sched, _ = make_scheduler(runner, recover=True)
    outs = []
    for rid in ("A", "B"):
        sched.add_request(req(rid, prompts[rid], greedy(10)))
    outs += sched.step()  # call 0: A and B prefill
    outs += sched.step()  # call 1: decode
    sched.add_request(req("C", prompts["C"], greedy(10)))
    sched.add_request(req("E", prompts["E"], greedy(6)))  # waits: max_running 3
    failed = sched.step()  # call 2: C's prefill raises (call 3: the canary passes)
    assert not failed and not sched.running and runner.calls == 4
    assert [r.rid for r in sched.waiting] == ["A", "B", "C", "E"] and list(sched._suspects)[0].rid == "C"
    assert [len(r.output_ids) for r in list(sched.waiting)[:2]] == [2, 2]  # their output is kept
    sched.check_integrity()
    assert sched.tree.total_size() == 0  # the prefix cache was rebuilt from empty
    sched.add_request(req("D", prompts["D"], greedy(7)))
    outs += drain(sched, check_each_step=True)
    res = collect(outs)
    for rid, n in (("A", 10), ("B", 10), ("C", 10), ("D", 7), ("E", 6)):
        assert res[rid][0] == reference_greedy(prompts[rid], n) and not res[rid][1].error, rid
    assert_idle_clean(sched, runner)
    assert not sched._live


def test_recovery_keeps_reserved_rows_and_integrity_counts_rows():
    """A failed step's recovery frees every request row but a reserved one (the CUDA graphs'
    padding row, whose table row must stay all zeros), and check_integrity notices a row that
    no active request holds."""
    runner = FailingRunner(fail_at={1}, max_running=3)
    spare = runner.req_to_token_pool.reserve()
    sched, _ = make_scheduler(runner, recover=True)
    sched.add_request(req("a", [3, 4, 5], greedy(4)))
    outs = sched.step() + sched.step()  # call 1 fails: the pool is cleared ("a" runs again)
    assert runner.calls == 3 and not outs and sched.waiting[0].rid == "a"
    assert spare not in runner.req_to_token_pool.free_rows()
    rows = []
    for rid in ("b", "c", "d"):  # all the other rows at once
        sched.add_request(req(rid, [6, 7, 8, 9], greedy(5)))
    for _ in range(3):
        sched.step()
        rows += [r.req_pool_idx for r in sched.running]
        sched.check_integrity()
    assert len(set(rows)) == 3 and spare not in rows
    drain(sched, check_each_step=True)
    assert_idle_clean(sched, runner)
    leaked = runner.req_to_token_pool.alloc()  # a row nobody holds: the check names it
    with pytest.raises(AssertionError, match="request rows in use"):
        sched.check_integrity()
    runner.req_to_token_pool.free(leaked)


def test_steps_that_keep_failing_raise():
    runner = FailingRunner(fail_from=0, max_running=1)
    sched, _ = make_scheduler(runner, recover=True)
    for i in range(6):
        sched.add_request(req(f"r{i}", [3 + i, 4, 5], greedy(3)))
    errors = []
    with pytest.raises(RuntimeError, match="injected failure"):
        for _ in range(10):
            errors += [o.rid for o in sched.step() if o.error]
    assert errors == ["r0", "r1", "r2"]  # three recovered failures, the fourth in a row is raised


def test_step_recovery_can_be_off():
    runner = FailingRunner(fail_at={0})
    sched, _ = make_scheduler(runner)
    assert Scheduler(EngineArgs(), runner, None).recover_step_errors  # on by default
    assert not sched.recover_step_errors
    sched.add_request(req("a", [3, 4, 5], greedy(3)))
    with pytest.raises(RuntimeError, match="injected failure"):
        sched.step()


def test_mixed_chunk_advances_running_requests_during_prefill():
    """With enable_mixed_chunk a long prompt's prefill chunks carry the running requests'
    decode tokens: no step leaves them waiting, outputs equal the reference, and each step
    stays within the chunk budget."""
    rng = random.Random(5)
    short = {f"s{i}": toks(rng, 4) for i in range(3)}
    long_prompt = toks(rng, 60)
    for mixed in (False, True):
        runner = FakeRunner()
        sched, _ = make_scheduler(runner, chunked_prefill_size=16, enable_mixed_chunk=mixed)
        for rid, p in short.items():
            sched.add_request(req(rid, p, greedy(12)))
        outs = sched.step()  # the three short prompts
        sched.add_request(req("long", long_prompt, greedy(3)))
        outs += drain(sched, check_each_step=True)
        res = collect(outs)
        for rid, p in short.items():
            assert res[rid][0] == reference_greedy(p, 12), (mixed, rid)
        assert res["long"][0] == reference_greedy(long_prompt, 3)
        chunk_steps = [st for st in runner.steps[1:] if st.mode == ForwardMode.EXTEND and max(st.extend_lens) > 1]
        assert len(chunk_steps) >= 4  # 60 tokens in chunks of at most 16
        riders = [sum(1 for n in st.extend_lens if n == 1) for st in chunk_steps]
        if mixed:
            assert riders == [3] * len(chunk_steps), riders  # every running request rides along
            assert all(sum(st.extend_lens) <= 16 for st in chunk_steps)
            assert sched.stats["mixed_steps"] >= 4
        else:
            assert not any(riders) and sched.stats["mixed_steps"] == 0
        assert_idle_clean(sched, runner)


def test_the_stop_string_window_holds_multibyte_stops_and_skipped_special_tokens(smollm2_tokenizer):
    """The trailing tokens the scheduler decodes to find a stop string ending in the last one
    (Scheduler._stop_window) hold the whole string: two emoji are 6 byte tokens (the window,
    in characters + 2, held 4), and special tokens that decoding skips, added ones such as
    SmolLM2's <file_sep> (not in all_special_ids) included, do not count against it."""
    from types import SimpleNamespace

    tok = smollm2_tokenizer
    sched = Scheduler(EngineArgs(), FakeRunner(), tok)
    file_sep = tok.convert_tokens_to_ids("<file_sep>")
    assert file_sep not in tok.all_special_ids and file_sep in sched.special_ids
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    for stop, out in (("🐧🐧", enc("Once 🐧🐧")), ("ab", enc("x a") + [file_sep] * 5 + enc("b"))):
        r = SimpleNamespace(params=SamplingParams(stop=[stop]), output_ids=out, stop_bytes=None)
        window = out[-sched._stop_window(r):]
        assert stop in tok.decode(window, skip_special_tokens=True), (stop, window)


def test_shares_uncached_prefix_is_a_common_prefix_past_the_cached_part():
    from treadle.runtime.scheduler import IN_BATCH_PREFIX_MIN, _shares_uncached_prefix

    rng = random.Random(4)
    for _ in range(500):
        base = [rng.randrange(2) for _ in range(rng.randrange(0, 80))]
        ids = base + [rng.randrange(2) for _ in range(rng.randrange(0, 60))]
        admitted = [base[: rng.randrange(0, len(base) + 1)] + [rng.randrange(2) for _ in range(rng.randrange(0, 60))]
                    for _ in range(rng.randrange(1, 4))]
        cached = rng.randrange(0, len(ids) + 1)

        def common(a, b):
            i = 0
            while i < min(len(a), len(b)) and a[i] == b[i]:
                i += 1
            return i

        expect = max(common(ids, a) for a in admitted) - cached >= IN_BATCH_PREFIX_MIN
        assert _shares_uncached_prefix(ids, admitted, cached) == expect

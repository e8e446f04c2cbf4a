"""Fused sampling and bitmask kernels vs their pure-torch references (CPU: TRITON_INTERPRET=1)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton is imported (conftest does the same)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

from treadle.kernels import sampling as sk
from treadle.kernels.bitmask import apply_token_bitmask, apply_token_bitmask_ref, unpack_bitmask
from treadle.kernels.sampling import (
    SamplingBatch,
    _MAX_ROUNDS,
    _fused_sample_launch,
    fused_sample,
    fused_sample_ref,
    kept_threshold_ref,
    make_sampling_batch,
    processed_logits_ref,
)

from sampling_checks import in_kept_set  # noqa: E402  (tests/sampling_checks.py)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _random_bitmask(gen: torch.Generator, B: int, V: int, density: float = 0.5) -> torch.Tensor:
    bits = (torch.rand(B, (V + 31) // 32 * 32, generator=gen) < density).to(torch.int64)
    bits[:, 0] = 1  # at least one allowed token per row
    words = (bits.view(B, -1, 32) << torch.arange(32)).sum(-1)
    return words.to(torch.int64).where(words < 2**31, words - 2**32).to(torch.int32)


def _batch(gen: torch.Generator, B: int, V: int, *, mask: bool, pen: bool, **kw) -> SamplingBatch:
    counts = (torch.randint(0, 4, (B, V), generator=gen) * (torch.rand(B, V, generator=gen) < 0.05)).int() if pen else None
    params = dict(
        temperatures=[0.0, 1.0, 0.7, 1.3, 1.0, 0.5][:B], top_ps=[1.0, 0.9, 1.0, 0.8, 0.95, 0.99][:B],
        top_ks=[-1, -1, 20, 50, 3, 900][:B], min_ps=[0.0, 0.0, 0.0, 0.05, 0.0, 0.1][:B],
        seeds=list(range(B)), steps=[7] * B, frequency_penalties=0.3, presence_penalties=0.2,
        repetition_penalties=1.2,
    )
    params.update(kw)
    return make_sampling_batch(
        B, DEV, bitmask=_random_bitmask(gen, B, V).to(DEV) if mask else None,
        mask_rows=torch.tensor([i % 3 != 1 for i in range(B)], device=DEV) if mask else None,
        token_counts=counts.to(DEV) if pen else None, **params,
    )


# ---------------------------------------------------------------------------- bitmask


@pytest.mark.parametrize("V", [1000, 1030])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("use_rows", [False, True])
def test_bitmask_matches_ref(V: int, dtype: torch.dtype, use_rows: bool) -> None:
    gen = torch.Generator().manual_seed(V)
    logits = torch.randn(5, V, generator=gen).to(dtype).to(DEV)
    mask = _random_bitmask(gen, 5, V, 0.3).to(DEV)
    rows = torch.tensor([0, 3], dtype=torch.int32, device=DEV) if use_rows else None
    a, b = logits.clone(), logits.clone()
    apply_token_bitmask(a, mask, rows)
    apply_token_bitmask_ref(b, mask, rows)
    assert torch.equal(a, b)
    allowed = unpack_bitmask(mask, V)
    masked_rows = [0, 3] if use_rows else range(5)
    for r in range(5):
        expect = torch.where(allowed[r], logits[r], float("-inf")) if r in masked_rows else logits[r]
        assert torch.equal(a[r], expect)


def test_unpack_bitmask_bit_order() -> None:
    words = torch.tensor([[0b101, -(2**31)]], dtype=torch.int32)
    allowed = unpack_bitmask(words, 64)[0].nonzero().squeeze(1).tolist()
    assert allowed == [0, 2, 63]


def test_bitmask_rejects_bad_arguments() -> None:
    logits = torch.randn(2, 100, device=DEV)
    good = torch.zeros(2, 4, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask(logits, torch.zeros(2, 3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="bitmask"):
        apply_token_bitmask(logits, good.to(torch.int64))
    with pytest.raises(ValueError, match="logits"):
        apply_token_bitmask(logits.to(torch.int32), good)
    with pytest.raises(ValueError, match="contiguous"):
        apply_token_bitmask(torch.randn(100, 2, device=DEV).t(), good)
    with pytest.raises(ValueError, match="rows"):
        apply_token_bitmask(logits, good, torch.tensor([0], device=DEV))
    with pytest.raises(ValueError, match="bitmask is on"):
        apply_token_bitmask(logits, torch.zeros(2, 4, dtype=torch.int32, device="meta"))


# ---------------------------------------------------------------------------- sampling


def _scaled(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed logits x, s = (x - max) / T) as the kernel and the reference compute them."""
    x = processed_logits_ref(logits, batch)
    s = (x - x.max(-1, keepdim=True).values) * (1.0 / batch.temperatures.clamp_min(1e-6))[:, None]
    return x, s


# Every mask / penalty variant in fp32; bf16 logits with both. The dtype is only the load's
# conversion (_process turns the row to fp32 before the penalties and the mask), so bf16 with
# both runs every line the other three bf16 variants ran (6 interpreted cases of 16).
MASK_PEN_BY_DTYPE = [(torch.float32, m, p) for m, p in [(False, False), (True, False), (True, True), (False, True)]] + [
    (torch.bfloat16, True, True)]


@pytest.mark.parametrize("V", [1000, 1030])  # one block of the interpreter's 1,024 with a tail; two
@pytest.mark.parametrize("dtype,mask,pen", MASK_PEN_BY_DTYPE)
def test_fused_sample_kept_set_and_greedy_exact(V: int, mask: bool, pen: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(V + 10 * mask + 100 * pen)
    logits = (torch.randn(6, V, generator=gen) * 3).to(dtype).to(DEV)
    batch = _batch(gen, 6, V, mask=mask, pen=pen)
    tok, lp, rounds, search = _fused_sample_launch(logits, batch)
    x, s = _scaled(logits, batch)
    # greedy row 0: exactly the argmax of the masked + penalised logits
    assert tok[0].item() == x[0].argmax().item()
    # every token is allowed; sampled ones are inside the exact kept set (top-p boundary
    # disagreements only within fp32 summation error, see in_kept_set)
    assert torch.isfinite(x.gather(1, tok[:, None])).all()
    assert in_kept_set(s, tok, batch, 1e-5)[1:].all()
    # the top-k search ran exactly on the top-k rows; rows without top-p need at most one
    # draw pass after pass 1 (their draw region lies inside the kept set)
    use_k = (batch.top_ks > 0) & (batch.top_ks < V)
    assert ((search > 0) == use_k).all() and int(search.max()) < 20
    assert (rounds[batch.top_ps >= 1] <= 1).all() and int(rounds.max()) < 10
    # logprob = log_softmax of the raw logits at the chosen token
    expect = torch.log_softmax(logits.float(), -1).gather(1, tok[:, None]).squeeze(1)
    torch.testing.assert_close(lp, expect, atol=1e-5, rtol=1e-5)
    # the ref agrees on greedy rows and also samples inside the kept sets
    tok_r, lp_r = fused_sample_ref(logits, batch)
    assert tok_r[0] == tok[0]
    assert (s.gather(1, tok_r[:, None]).squeeze(1)[1:] >= kept_threshold_ref(s, batch.top_ks, batch.top_ps, batch.min_ps)[1:]).all()
    torch.testing.assert_close(lp_r, torch.log_softmax(logits.float(), -1).gather(1, tok_r[:, None]).squeeze(1))


def test_rejection_rounds_and_round_budget() -> None:
    # Flat-ish logits, a small top-p and a high temperature: first draws are often rejected,
    # so later rounds (fresh noise, smaller draw region) are exercised; all stay inside.
    V, B = 200, 32
    gen = torch.Generator().manual_seed(11)
    logits = (torch.randn(B, V, generator=gen) * 0.5).to(DEV)
    top_ps = [0.3] * 8 + [0.9] * 8 + [1.0] * 16
    top_ks = [-1] * 16 + [3] * 8 + [-1] * 8  # then 8 rows of top-k only, 8 unfiltered
    batch = make_sampling_batch(B, DEV, temperatures=2.0, top_ps=top_ps, top_ks=top_ks, seeds=list(range(B)), steps=1)
    tok, _, rounds, search = _fused_sample_launch(logits, batch)
    x, s = _scaled(logits, batch)
    assert in_kept_set(s, tok, batch, 1e-5).all()
    assert int(rounds[:8].max()) >= 3  # several rejections in a row happened
    assert (rounds[16:24] == 1).any() and (rounds[16:24] <= 1).all() and (search[16:24] > 0).all()
    assert (rounds[24:] == 0).all() and (search[24:] == 0).all()  # pass 1's draw is the token
    # No round allowed: rows whose first draw still needs a check (or fell outside the
    # top-k set) take the argmax, the always-kept fallback; rows done in pass 1 keep their draw.
    tok0, _, rounds0, _ = _fused_sample_launch(logits, batch, max_rounds=0)
    assert (rounds0 == 0).all()
    needs_round = rounds > 0
    greedy = x.argmax(-1)
    assert torch.equal(tok0[needs_round], greedy[needs_round])
    assert torch.equal(tok0[~needs_round], tok[~needs_round])
    assert not torch.equal(tok0[24:], greedy[24:])
    assert _MAX_ROUNDS >= 16


def test_no_allowed_token_falls_back_to_greedy() -> None:
    V = 100
    logits = torch.randn(2, V).to(DEV)
    bitmask = torch.zeros(2, 4, dtype=torch.int32, device=DEV)
    bitmask[1, 2] = 1 << 5  # row 1: token 69 only
    batch = make_sampling_batch(2, DEV, temperatures=1.0, top_ps=0.9, top_ks=5, bitmask=bitmask)
    tok, lp = fused_sample(logits, batch)
    assert tok.tolist() == [0, 69] == fused_sample_ref(logits, batch)[0].tolist()
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1)[[0, 1], [0, 69]])


def test_a_tiny_temperature_is_greedy() -> None:
    """Temperatures below MIN_TEMPERATURE (1e-5) are greedy rows: 1 / T of 1e-40 overflowed
    float32, so the reference drew from NaN probabilities (torch.multinomial raised, failing
    the CPU runtime's whole batch step) and the kernel returned a wrong token."""
    V = 1030
    logits = (torch.randn(4, V, generator=torch.Generator().manual_seed(3)) * 2.5).to(DEV)
    batch = make_sampling_batch(4, DEV, temperatures=[1e-40, 3e-38, 1e-6, 0.0], seeds=[1, 2, 3, 4], steps=0)
    want = logits.argmax(-1).tolist()
    for impl in (fused_sample, fused_sample_ref):
        tok, lp = impl(logits, batch)
        assert tok.tolist() == want, impl.__name__
        torch.testing.assert_close(lp, torch.log_softmax(logits, -1)[torch.arange(4), tok.cpu()].to(lp.device))


@triton.jit
def _noise_kernel(seed_ptr, step_ptr, rnd_ptr, m_ptr, key_ptr, bits_ptr, g_ptr, N: tl.constexpr, FAST: tl.constexpr):
    i = tl.arange(0, N)
    key = sk._round_key(sk._row_key(tl.load(seed_ptr), tl.load(step_ptr)), tl.load(rnd_ptr))
    tl.store(key_ptr, key.to(tl.int32, bitcast=True))
    tl.store(bits_ptr + i, sk._hash_bits(i, key).to(tl.int32))
    tl.store(g_ptr + i, sk._gumbel_from_bits(tl.load(m_ptr + i).to(tl.uint32), FAST))


def _mix32_py(x: int) -> int:
    x ^= x >> 16
    x = x * 0x21F0AAAD & 0xFFFFFFFF
    x ^= x >> 15
    x = x * 0x735A2D97 & 0xFFFFFFFF
    return x ^ (x >> 15)


def test_noise_hash_matches_python_reference() -> None:
    # The counter-based noise in plain Python integers: uint64 / uint32 arithmetic must wrap
    # the same compiled and interpreted (negative int64 seeds included).
    M64 = 2**64 - 1
    N = 64
    for seed, step, rnd in [(0, 0, 0), (-5, 2**40 + 3, 7), (2**63 - 1, 12, 31)]:
        z = ((seed & M64) * 0x9E3779B97F4A7C15 + step) & M64
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & M64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & M64
        z ^= z >> 31
        key = _mix32_py(((z ^ (z >> 32)) & 0xFFFFFFFF) + rnd * 0x7F4A7C15 & 0xFFFFFFFF)
        bits = []
        for t in range(N):
            h = (t * 0x2C1B3C6D + key) & 0xFFFFFFFF
            h ^= h >> 16
            h = h * 0x21F0AAAD & 0xFFFFFFFF
            h ^= h >> 15
            bits.append((h * 0x735A2D97 & 0xFFFFFFFF) >> 9)
        # Gumbel noise over the whole u range, the ends u = 2^-24 and u = 1 - 2^-24 included
        m = torch.cat((torch.tensor([0, 1, 2, 2**22, 2**23 - 3, 2**23 - 2, 2**23 - 1]), torch.tensor(bits[7:])))
        out_key = torch.zeros(1, dtype=torch.int32, device=DEV)
        out_bits = torch.zeros(N, dtype=torch.int32, device=DEV)
        out_g = torch.zeros(N, dtype=torch.float32, device=DEV)
        t64 = lambda v: torch.tensor([v], dtype=torch.int64, device=DEV)  # noqa: E731
        _noise_kernel[(1,)](t64(seed), t64(step), torch.tensor([rnd], dtype=torch.int32, device=DEV),
                            m.to(torch.int32).to(DEV), out_key, out_bits, out_g, N=N, FAST=not sk._INTERPRETED)
        assert out_key.item() & 0xFFFFFFFF == key
        assert out_bits.tolist() == bits
        u = (m.double() + 0.5) / 2**23
        expect = -torch.log2(-torch.log2(u))
        assert torch.isfinite(out_g).all()
        torch.testing.assert_close(out_g.cpu().double(), expect, atol=5e-5, rtol=0)  # MUFU.LG2: ~2^-22


def test_penalty_semantics_ref() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    batch = make_sampling_batch(1, token_counts=torch.tensor([[1, 2, 0, 3]], dtype=torch.int32),
                                frequency_penalties=0.1, presence_penalties=0.5, repetition_penalties=2.0)
    x = processed_logits_ref(logits, batch)
    expect = torch.tensor([[2.0 / 2 - 0.1 - 0.5, -2.0 * 2 - 0.2 - 0.5, 1.0, 0.5 / 2 - 0.3 - 0.5]])
    torch.testing.assert_close(x, expect)


@pytest.mark.parametrize("impl", ["kernel", "ref"])
def test_same_seed_and_step_same_token_in_any_batch(impl: str) -> None:
    fn = fused_sample if impl == "kernel" else fused_sample_ref
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 300, generator=gen).to(DEV)
    batch = make_sampling_batch(4, DEV, temperatures=1.0, top_ps=0.95, seeds=[11, 12, 13, 14], steps=[5, 5, 6, 6])
    tok, _ = fn(logits, batch)
    tok2, _ = fn(logits, batch)
    assert torch.equal(tok, tok2)
    # row 2 alone, and row 2 placed first of a reordered batch: the same token
    alone = SamplingBatch(*[t[2:3] if isinstance(t, torch.Tensor) else t for t in batch])
    assert fn(logits[2:3].contiguous(), alone)[0].item() == tok[2].item()
    perm = torch.tensor([2, 0, 3, 1], device=DEV)
    shuffled = SamplingBatch(*[t[perm] if isinstance(t, torch.Tensor) else t for t in batch])
    assert fn(logits[perm].contiguous(), shuffled)[0][0].item() == tok[2].item()
    # a different step, or a different seed, gives different draws somewhere over a few tries
    draws = {fn(logits[2:3].contiguous(), alone._replace(steps=torch.tensor([st], device=DEV)))[0].item() for st in range(8)}
    assert len(draws) > 1
    draws = {fn(logits[2:3].contiguous(), alone._replace(seeds=torch.tensor([sd << 32], device=DEV)))[0].item() for sd in range(8)}
    assert len(draws) > 1


def _exact_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Exact filtered distribution of row 0, computed independently in float64 with a sort."""
    x = processed_logits_ref(logits[:1], SamplingBatch(*[t[:1] if isinstance(t, torch.Tensor) else t for t in batch]))[0].double()
    T, k, p, mp = (batch.temperatures[0].item(), batch.top_ks[0].item(), batch.top_ps[0].item(), batch.min_ps[0].item())
    probs = torch.softmax(x / T, -1)
    vals, order = probs.sort(descending=True)
    keep = torch.zeros_like(vals, dtype=torch.bool)
    keep[: k if k > 0 else len(vals)] = True
    vals = vals * keep
    vals = vals / vals.sum()
    keep &= (vals.cumsum(0) - vals) < p
    vals = vals * keep
    keep &= vals >= mp * vals.max()
    vals = vals * keep
    out = torch.zeros_like(probs)
    out[order] = vals / vals.sum()
    return out


@pytest.mark.parametrize("impl,n,bound", [("kernel", 300, 0.1), ("ref", 3000, 0.05)])
@pytest.mark.parametrize("params", [
    dict(top_ks=10, top_ps=0.9, min_ps=0.05, temperatures=0.8),
    dict(top_ps=0.6, temperatures=1.5, pen=True),
    dict(top_ks=6, min_ps=0.1, temperatures=1.2),
])
def test_sampled_distribution_matches_filtered_softmax(impl: str, n: int, bound: float, params: dict) -> None:
    # The interpreter runs one Python program per row, so the kernel gets fewer draws and a
    # looser (still failing-capable, see the last assert) total-variation bound.
    params = dict(params)
    V = 32
    gen = torch.Generator().manual_seed(5)
    row = torch.randn(1, V, generator=gen) * 1.5
    logits = row.expand(n, V).contiguous().to(DEV)
    bitmask = _random_bitmask(gen, 1, V, 0.7).expand(n, -1).contiguous().to(DEV)
    if params.pop("pen", False):  # penalties push the top tokens down: the kept set changes
        counts = torch.zeros(1, V, dtype=torch.int32)
        counts[0, row[0].topk(3).indices] = torch.tensor([1, 2, 1], dtype=torch.int32)
        params.update(token_counts=counts.expand(n, -1).contiguous().to(DEV), frequency_penalties=0.5,
                      presence_penalties=0.5, repetition_penalties=1.3)
    batch = make_sampling_batch(n, DEV, seeds=1234, steps=list(range(n)), bitmask=bitmask, **params)
    fn = fused_sample if impl == "kernel" else fused_sample_ref
    tok, _ = fn(logits, batch)
    exact = _exact_probs(logits, batch).cpu()
    freq = torch.bincount(tok.cpu(), minlength=V).double() / n
    assert (freq[exact == 0] == 0).all(), "drew a token outside the mask / top-k / top-p / min-p set"
    tv = 0.5 * (freq - exact).abs().sum().item()
    assert tv < bound, tv
    # the bound can fail: plain softmax at T=1 (no mask, no filtering) is far from the target
    assert 0.5 * (torch.softmax(row[0].double(), -1) - exact).abs().sum().item() > 2 * bound


def test_fused_sample_rejects_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = torch.randn(2, 100, device=DEV)
    good = make_sampling_batch(2, DEV)
    with pytest.raises(ValueError, match="temperatures"):
        fused_sample(logits, good._replace(temperatures=good.temperatures.double()))
    with pytest.raises(ValueError, match="top_ks"):
        fused_sample(logits, good._replace(top_ks=torch.ones(3, dtype=torch.int32, device=DEV)))
    with pytest.raises(ValueError, match="bitmask"):
        fused_sample(logits, good._replace(bitmask=torch.zeros(2, 3, dtype=torch.int32, device=DEV)))
    with pytest.raises(ValueError, match="token_counts"):
        fused_sample(logits, good._replace(token_counts=torch.zeros(2, 100, dtype=torch.int64, device=DEV)))
    with pytest.raises(ValueError, match="mask_rows"):
        fused_sample(logits, good._replace(mask_rows=torch.ones(2, dtype=torch.bool, device=DEV)))
    with pytest.raises(ValueError, match="contiguous"):
        fused_sample(torch.randn(100, 2, device=DEV).t(), good)
    with pytest.raises(ValueError, match="logits"):
        fused_sample(logits.to(torch.int32), good)
    with pytest.raises(ValueError, match="seeds is on"):
        fused_sample(logits, good._replace(seeds=torch.zeros(2, dtype=torch.int64, device="meta")))
    with pytest.raises(ValueError, match="fused_sample_ref"):
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        fused_sample(torch.randn(2, 100), make_sampling_batch(2, "cpu"))

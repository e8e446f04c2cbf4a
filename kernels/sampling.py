"""Fused grammar-aware sampling: penalties -> bitmask -> temperature -> top-k -> top-p ->
min-p -> draw, in one Triton launch with no sort, no host sync and no [B, V] intermediate.

Semantics (shared by :func:`fused_sample` and :func:`fused_sample_ref`), per row:

1. penalties on tokens with ``count > 0`` (counts of the row's *output* tokens so far; vLLM's
   and HF's repetition penalty also count the prompt's):
   HF repetition penalty (positive logit divided, negative multiplied), then
   ``logit -= frequency * count + presence``;
2. grammar bitmask (rows with ``mask_rows[b]`` False, or no bitmask at all, are unmasked);
3. ``temperature < MIN_TEMPERATURE`` (1e-5, vLLM's bound; 0 included), or no allowed token
   -> greedy: the first argmax (1 / T of a tiny T overflowed float32: NaN probabilities);
4. otherwise ``s = (logit - max) / T`` and the kept set is ``{s >= tau}`` with
   ``tau = min(0, max(tau_k, tau_p, log(min_p)))``: top-k keeps every token whose
   strictly-greater count is ``< k``, top-p (on the top-k-renormalised distribution) every
   token whose strictly-greater mass is ``< top_p * mass(top-k set)``, min-p every token
   with ``p >= min_p * p_max``. Ties at a threshold are all kept; the max token always is.
   When top-k or top-p is on, tokens with ``s < -40`` (p < 4e-18 * p_max) are never kept
   (nor counted in the top-p mass);
5. draw from ``softmax(s)`` restricted to the kept set.

The returned logprob is ``log_softmax(raw logits)[token]`` (before penalties, mask, T).

Kernel algorithm: one program per row (grid ``(B,)``, 16 warps, 4096-token blocks), a few
passes over the row, all in one launch; no sort, no host sync, no [B, V] buffer (with
penalties the processed logit is recomputed from the counts in every pass).

Noise is counter-based: ``u = hash(seed, step, round, token id)`` in (0, 1) with 24-bit
resolution (splitmix64 of (seed, step) per row, a 32-bit multiply-xorshift hash per token),
so a seeded request draws the same token for the same logits whatever batch it is in and
whatever its row index. Draws are Gumbel-max, ``argmax s + g`` with ``g = -log(-log u)``,
which needs no normalisation. The 24-bit ``u`` bounds ``g`` to [-2.8, 16.6]: a token more
than 19.4 nats below the best of its draw region is never drawn (true probability < 4e-9
of the best's, each), and the coarse top end of ``g`` already under-draws tokens from about
14 nats below (2M draws over a 128k-token row: 267 of 383 expected at 14-16 nats below, 0
of 14 beyond; about 1e-4 of the mass moved to likelier tokens). The CPU reference draws
exactly.

* pass 1: raw max / sum-exp (online, one exp per token; for the logprob), the first argmax
  of the processed logits (the greedy answer, and the max that defines ``s``), and a
  Gumbel-max draw ``t`` over all allowed tokens. Greedy rows are done.
* top-k rows only: the exact k-th largest ``s`` (``tau_k``) by a count search: each pass
  counts the tokens at or above ``NPIV`` pivots spread over a bracket ``[lo, hi]`` that
  always snaps to data values; exact after about log_7(tokens in the bracket) passes.
* rounds (exact rejection sampling): the kept set is a top set ``{s >= tau}``, so a rejected
  candidate ``t`` proves every token with ``s <= s_t`` is outside it. A round pass checks the
  pending candidate (its strictly-greater mass against ``top_p * Z``, ``Z`` the mass of
  ``{s >= max(-40, tau_k)}``) and, speculatively, draws the next candidate from
  ``{s >= floor, s > s_t}`` with fresh noise (``floor`` = the known part of ``tau``: -40,
  ``tau_k``, ``log(min_p)``). The first accepted candidate is the token; given acceptance it
  is distributed exactly as the kept-set softmax (every proposal is that softmax on a
  superset of the kept set). Rows without top-p need no mass check: a candidate at or
  above ``floor`` is accepted at once (one draw pass more if the first one was below it).
  The first draw is accepted with probability >= top_p, so with top_p = 0.9 about nine rows
  in ten need one round. Rounds are bounded by ``MAX_ROUNDS``; if that is ever hit the
  token is the argmax (always kept).

Per token, pass 1 is a (prefetched) load, the mask bit, one exp (online sum-exp), the hash
and two logs (MUFU.EX2 / MUFU.LG2; about 42 SASS instructions); a round pass about the same
(one exp, the hash, two logs). Measured on an H200, a pass over a 128K-token row takes
~33 us on one SM, about two thirds of the SM's instruction issue rate: the kernel is
instruction-bound, not memory-bound (a bf16 row is 256 KB, re-read mostly from L2). So
batch 64 (one wave on 132 SMs) costs pass 1 + the slowest row's rounds (~95 us) and batch
256 two waves (~175 us), against stock torch's ~1.2 / 3.9 ms (benchmarks/bench_sampling.py).
Top-k rows add ~5 search passes.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = ["MIN_TEMPERATURE", "SamplingBatch", "make_sampling_batch", "fused_sample", "fused_sample_ref"]

MIN_TEMPERATURE = 1e-5  # below it a row is greedy (vLLM's bound); the kernel writes it as a literal

S_MIN = -40.0  # lowest kept scaled logit when top-k / top-p is on (p / p_max = 4e-18)
_MAX_ROUNDS = 32  # rejection rounds after pass 1 (then: the argmax)
_MAX_SEARCH = 48  # top-k count-search passes (then: the smallest kept set seen)
_NPIV = 8  # pivots per top-k search pass
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

LOG2E = tl.constexpr(1.4426950408889634)
NEG_BIG = tl.constexpr(-3.4028234663852886e38)  # -FLT_MAX: the online max's start
U_SHIFT = tl.constexpr(1.0 - 2.0 ** -24)  # [1, 2) - U_SHIFT: a uniform in (0, 1)
IDX_MAX = tl.constexpr(2147483647)


class SamplingBatch(NamedTuple):
    """Per-row sampling parameters, all on the logits' device (B = batch rows, V = vocab)."""

    temperatures: torch.Tensor  # f32 [B]; < MIN_TEMPERATURE means greedy
    top_ps: torch.Tensor  # f32 [B]; 1 = off
    top_ks: torch.Tensor  # int32 [B]; <= 0 or >= V = off
    min_ps: torch.Tensor  # f32 [B]; 0 = off
    seeds: torch.Tensor  # int64 [B]
    steps: torch.Tensor  # int64 [B]; the output position: the RNG offset
    bitmask: torch.Tensor | None = None  # int32 [B, ceil(V/32)]; bit set = allowed
    mask_rows: torch.Tensor | None = None  # bool [B]; rows the bitmask applies to (None = all)
    token_counts: torch.Tensor | None = None  # int32 [B, V]; output-token counts
    frequency_penalties: torch.Tensor | None = None  # f32 [B]; 0 = off
    presence_penalties: torch.Tensor | None = None  # f32 [B]; 0 = off
    repetition_penalties: torch.Tensor | None = None  # f32 [B]; 1 = off


def make_sampling_batch(
    batch_size: int,
    device: torch.device | str = "cpu",
    *,
    temperatures: list[float] | float = 1.0,
    top_ps: list[float] | float = 1.0,
    top_ks: list[int] | int = -1,
    min_ps: list[float] | float = 0.0,
    seeds: list[int] | int = 0,
    steps: list[int] | int = 0,
    bitmask: torch.Tensor | None = None,
    mask_rows: torch.Tensor | None = None,
    token_counts: torch.Tensor | None = None,
    frequency_penalties: list[float] | float = 0.0,
    presence_penalties: list[float] | float = 0.0,
    repetition_penalties: list[float] | float = 1.0,
) -> SamplingBatch:
    """Build a :class:`SamplingBatch` from Python scalars or per-row lists."""

    def col(v, dtype):
        vals = v if isinstance(v, (list, tuple)) else [v] * batch_size
        if len(vals) != batch_size:
            raise ValueError(f"expected {batch_size} values, got {len(vals)}")
        return torch.tensor(vals, dtype=dtype, device=device)

    return SamplingBatch(
        temperatures=col(temperatures, torch.float32),
        top_ps=col(top_ps, torch.float32),
        top_ks=col(top_ks, torch.int32),
        min_ps=col(min_ps, torch.float32),
        seeds=col(seeds, torch.int64),
        steps=col(steps, torch.int64),
        bitmask=bitmask,
        mask_rows=mask_rows,
        token_counts=token_counts,
        frequency_penalties=col(frequency_penalties, torch.float32),
        presence_penalties=col(presence_penalties, torch.float32),
        repetition_penalties=col(repetition_penalties, torch.float32),
    )


# ----------------------------------------------------------------------------- kernel


@triton.jit
def _load(row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab,
          HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr):
    # the loads behind _process at ``offs`` (a block of token ids, or one); ``offs`` stands
    # in for what is not loaded. Passes load block i + 1 before computing block i, so the
    # loads' latency hides behind the arithmetic (one program per SM has nothing else to run).
    inb = offs < vocab
    raw = tl.load(row_ptr + offs, mask=inb, other=float("-inf"))
    word = offs
    cnt = offs
    if HAS_MASK:
        word = tl.load(mask_row_ptr + offs // 32, mask=inb, other=0)
    if HAS_PEN:
        cnt = tl.load(counts_row_ptr + offs, mask=inb, other=0)
    return raw, word, cnt


@triton.jit
def _process(raw, word, cnt, offs, use_mask, freq, pres, rep,
             HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr):
    # (raw, processed) fp32 logits: raw is -inf outside the vocab, processed is penalised
    # and -inf where the bitmask forbids the token.
    raw = raw.to(tl.float32)
    x = raw
    if HAS_PEN:
        seen = cnt > 0
        x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
        x = x - freq * cnt.to(tl.float32) - pres * seen.to(tl.float32)
    if HAS_MASK:
        allowed = (((word >> (offs % 32)) & 1) != 0) | (use_mask == 0)
        x = tl.where(allowed, x, float("-inf"))
    return raw, x


@triton.jit
def _logits(row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab, use_mask, freq, pres, rep,
            HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr):
    raw, word, cnt = _load(row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab, HAS_MASK, HAS_PEN)
    return _process(raw, word, cnt, offs, use_mask, freq, pres, rep, HAS_MASK, HAS_PEN)


@triton.jit
def _mix32(x):
    # 32-bit integer finaliser on uint32 (Wellons' lowbias32): a bijection, full avalanche.
    # uint32 throughout: shifts are logical and products wrap, compiled and interpreted.
    x ^= x >> 16
    x *= 0x21F0AAAD
    x ^= x >> 15
    x *= 0x735A2D97
    x ^= x >> 15
    return x


@triton.jit
def _row_key(seed, step):
    # uint32 key of (seed, step): splitmix64 of seed * golden + step, in uint64 (wraps)
    z = seed.to(tl.uint64) * 0x9E3779B97F4A7C15 + step.to(tl.uint64)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z ^= z >> 31
    return (z ^ (z >> 32)).to(tl.uint32)


@triton.jit
def _round_key(row_key, rnd):
    # the noise key of round rnd (int32 tensor; pass 1 is round 0: _mix32(row_key))
    return _mix32(row_key + rnd.to(tl.uint32) * 0x7F4A7C15)


@triton.jit
def _log2(x, FAST: tl.constexpr):
    # log2; compiled, one MUFU.LG2 (~2^-22 absolute error; subnormals flushed: the inputs
    # here are >= 2^-24). tl.log2 calls libdevice's accurate log2f (~20 instructions).
    if FAST:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.log2(x)


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    # 2^x; compiled, one MUFU.EX2 with subnormal results flushed to 0 (tl.exp2 adds ~3
    # instructions per call to produce them). Only weights of tokens 87+ nats below the
    # max are flushed: far under the -40 floor and fp32 resolution of any sum here.
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _exp(x, FAST: tl.constexpr):
    if FAST:
        return _exp2(x * LOG2E, FAST)
    else:
        return tl.exp(x)


@triton.jit
def _hash_bits(offs, key):
    # 23 well-mixed bits of hash(key, token id): _mix32 without its last xor-shift, which
    # only mixes into the low bits dropped here
    h = offs.to(tl.uint32) * 0x2C1B3C6D + key
    h ^= h >> 16
    h *= 0x21F0AAAD
    h ^= h >> 15
    h *= 0x735A2D97
    return h >> 9


@triton.jit
def _gumbel_from_bits(m, FAST: tl.constexpr):
    # Base-2 Gumbel noise -log2(-log2(u)) for u = (m + 1/2) / 2^23 in (0, 1) (m: 23 bits as
    # the mantissa of a float in [1, 2), minus 1 - 2^-24: exact). s * log2(e) + this has the
    # argmax of s + Gumbel noise. MUFU.LG2's error is absolute (~2^-22), so near u = 1 it
    # could zero -log2(u) (an infinite key): there, with v = 1 - u (exact) < 2^-6, use
    # -log2(1 - v) = (v + v^2/2 + v^3/3) / ln 2 (relative error < 2e-8).
    u = (m | 0x3F800000).to(tl.float32, bitcast=True) - U_SHIFT
    v = 1.0 - u
    e = tl.where(v < 0.015625, v * (1.4426950408889634 + v * (0.7213475204444817 + v * 0.48089834696298783)),
                 -_log2(u, FAST))
    return -_log2(e, FAST)


@triton.jit
def _gumbel2(offs, key, FAST: tl.constexpr):
    return _gumbel_from_bits(_hash_bits(offs, key), FAST)


@triton.jit
def _draw_update(g, offs, best_g, best_i):
    # per-lane Gumbel-max: keep the largest key g and its token id
    up = g > best_g
    return tl.where(up, g, best_g), tl.where(up, offs, best_i)


@triton.jit
def _first_argmax(v, i):
    # the value-max of per-lane bests and the smallest token id holding it
    vm = tl.max(v, axis=0)
    return vm, tl.min(tl.where(v == vm, i, IDX_MAX), axis=0)


@triton.jit
def _round_pass(row_ptr, mask_row_ptr, counts_row_ptr, vocab, use_mask, freq, pres, rep,
                row_max, inv_t, base, s_c, floor, draw_lo, key,
                HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr, BLOCK: tl.constexpr,
                FAST: tl.constexpr):
    # Z = mass(s >= base), mass(s > s_c), and a Gumbel-max draw from {s >= floor, s > draw_lo}.
    # (Hashing only blocks that hold a token of the draw region, usually a few near the max,
    # measured slower on an H200: the per-block any() is a cross-warp reduction + barrier.)
    lanes = tl.arange(0, BLOCK)
    z = tl.zeros([BLOCK], tl.float32)
    above = tl.zeros([BLOCK], tl.float32)
    best_g = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = lanes
    n_raw, n_word, n_cnt = _load(row_ptr, mask_row_ptr, counts_row_ptr, lanes, vocab, HAS_MASK, HAS_PEN)
    for start in range(0, vocab, BLOCK):
        offs = start + lanes
        raw, word, cnt = n_raw, n_word, n_cnt
        n_raw, n_word, n_cnt = _load(row_ptr, mask_row_ptr, counts_row_ptr, offs + BLOCK, vocab,
                                     HAS_MASK, HAS_PEN)
        _, x = _process(raw, word, cnt, offs, use_mask, freq, pres, rep, HAS_MASK, HAS_PEN)
        s = (x - row_max) * inv_t
        s2 = s * LOG2E
        e = _exp2(s2, FAST)
        z += tl.where(s >= base, e, 0.0)
        above += tl.where(s > s_c, e, 0.0)
        g = tl.where((s >= floor) & (s > draw_lo), s2 + _gumbel2(offs, key, FAST), float("-inf"))
        best_g, best_i = _draw_update(g, offs, best_g, best_i)
    _, tok = _first_argmax(best_g, best_i)
    return tl.sum(z, axis=0), tl.sum(above, axis=0), tok


@triton.jit
def _count_pass(row_ptr, mask_row_ptr, counts_row_ptr, vocab, use_mask, freq, pres, rep,
                row_max, inv_t, lo, hi,
                HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr, BLOCK_S: tl.constexpr,
                NPIV: tl.constexpr):
    # count(s >= piv_j) at NPIV pivots spread evenly over [lo, hi] (the last is hi), and per
    # pivot the largest s below it among s >= lo. Tokens below lo count at no pivot and
    # tokens at or above hi at all, so the [BLOCK_S, NPIV] work runs only in blocks holding
    # a token inside [lo, hi).
    jj = tl.arange(0, NPIV)
    piv = tl.where(jj == NPIV - 1, hi, tl.minimum(lo + (hi - lo) * (jj.to(tl.float32) / (NPIV - 1)), hi))
    lanes = tl.arange(0, BLOCK_S)
    above = tl.zeros([BLOCK_S], tl.float32)
    acc_n = tl.zeros([BLOCK_S, NPIV], tl.float32)
    acc_b = tl.full([BLOCK_S, NPIV], float("-inf"), tl.float32)
    n_raw, n_word, n_cnt = _load(row_ptr, mask_row_ptr, counts_row_ptr, lanes, vocab, HAS_MASK, HAS_PEN)
    for start in range(0, vocab, BLOCK_S):
        offs = start + lanes
        raw, word, cnt = n_raw, n_word, n_cnt
        n_raw, n_word, n_cnt = _load(row_ptr, mask_row_ptr, counts_row_ptr, offs + BLOCK_S, vocab,
                                     HAS_MASK, HAS_PEN)
        _, x = _process(raw, word, cnt, offs, use_mask, freq, pres, rep, HAS_MASK, HAS_PEN)
        s = (x - row_max) * inv_t
        above += tl.where(s >= hi, 1.0, 0.0)
        inb = (s >= lo) & (s < hi)
        if tl.max(inb.to(tl.int32), axis=0) > 0:
            s_in = tl.where(inb, s, float("-inf"))
            ge = s_in[:, None] >= piv[None, :]
            acc_n += tl.where(ge, 1.0, 0.0)
            acc_b = tl.maximum(acc_b, tl.where(ge, float("-inf"), s_in[:, None]))
    return piv, tl.sum(acc_n, axis=0) + tl.sum(above, axis=0), tl.max(acc_b, axis=0)


@triton.jit
def _fused_sample_kernel(
    logits_ptr, bitmask_ptr, mask_rows_ptr, counts_ptr,
    temp_ptr, top_p_ptr, top_k_ptr, min_p_ptr, seed_ptr, step_ptr,
    freq_ptr, pres_ptr, rep_ptr,
    out_tok_ptr, out_lp_ptr, out_rounds_ptr, out_search_ptr,
    vocab, stride_logits, stride_mask, stride_counts, max_rounds,
    HAS_MASK: tl.constexpr, HAS_MASK_ROWS: tl.constexpr, HAS_PEN: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, NPIV: tl.constexpr, MAX_SEARCH: tl.constexpr,
    FAST: tl.constexpr, DIAG: tl.constexpr, S_MIN_C: tl.constexpr,
):
    # grid: (B,); one program samples one row.
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_logits
    mask_row_ptr = bitmask_ptr + row * stride_mask
    counts_row_ptr = counts_ptr + row * stride_counts
    use_mask = 1  # int: 1 = this row's bitmask applies
    if HAS_MASK_ROWS:
        use_mask = tl.load(mask_rows_ptr + row).to(tl.int32)
    freq = 0.0
    pres = 0.0
    rep = 1.0
    if HAS_PEN:
        freq = tl.load(freq_ptr + row)
        pres = tl.load(pres_ptr + row)
        rep = tl.load(rep_ptr + row)
    temp = tl.load(temp_ptr + row)
    row_key = _row_key(tl.load(seed_ptr + row), tl.load(step_ptr + row))
    sampling = temp >= 1e-5  # MIN_TEMPERATURE
    inv_t = 1.0 / tl.where(sampling, temp, 1.0)
    lanes = tl.arange(0, BLOCK)

    # ---- pass 1: raw log-sum-exp, first argmax, Gumbel-max draw over allowed tokens ----
    # Per-lane online sum-exp with one exp per token: exp(-|x - m|) is the new term when
    # x <= m and the rescale factor of the old sum when x > m.
    key = _mix32(row_key)  # == _round_key(row_key, 0)
    c2 = inv_t * LOG2E
    raw_m = tl.full([BLOCK], NEG_BIG, tl.float32)
    raw_s = tl.zeros([BLOCK], tl.float32)
    best_x = tl.full([BLOCK], float("-inf"), tl.float32)
    best_xi = lanes
    best_g = tl.full([BLOCK], float("-inf"), tl.float32)
    best_gi = lanes
    n_raw, n_word, n_cnt = _load(row_ptr, mask_row_ptr, counts_row_ptr, lanes, vocab, HAS_MASK, HAS_PEN)
    for start in range(0, vocab, BLOCK):
        offs = start + lanes
        raw, word, cnt = n_raw, n_word, n_cnt
        n_raw, n_word, n_cnt = _load(row_ptr, mask_row_ptr, counts_row_ptr, offs + BLOCK, vocab,
                                     HAS_MASK, HAS_PEN)
        raw, x = _process(raw, word, cnt, offs, use_mask, freq, pres, rep, HAS_MASK, HAS_PEN)
        d = raw - raw_m
        t = _exp(-tl.abs(d), FAST)
        raw_s = tl.where(d > 0, raw_s * t + 1.0, raw_s + t)
        raw_m = tl.maximum(raw_m, raw)
        up = x > best_x
        best_x = tl.where(up, x, best_x)
        best_xi = tl.where(up, offs, best_xi)
        # masked tokens have x = -inf, so the key is -inf with no select
        best_g, best_gi = _draw_update(x * c2 + _gumbel2(offs, key, FAST), offs, best_g, best_gi)
    rmax = tl.max(raw_m, axis=0)
    lse = rmax + tl.log(tl.sum(raw_s * tl.exp(raw_m - rmax), axis=0))
    x_max, greedy_tok = _first_argmax(best_x, best_xi)
    _, tok = _first_argmax(best_g, best_gi)
    sampled = sampling & (x_max > float("-inf"))
    row_max = tl.where(sampled, x_max, 0.0)
    _, x_c = _logits(row_ptr, mask_row_ptr, counts_row_ptr, tok, vocab, use_mask, freq, pres, rep,
                     HAS_MASK, HAS_PEN)
    s_c = (x_c - row_max) * inv_t  # the candidate, as the passes compute s

    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    use_k = sampled & (top_k > 0) & (top_k < vocab)
    use_p = sampled & (top_p < 1.0)
    floor = tl.where(use_k | use_p, S_MIN_C, float("-inf"))
    floor = tl.where(min_p > 0, tl.maximum(floor, tl.log(tl.maximum(min_p, 1e-38))), floor)

    # ---- top-k rows: tau_k = the largest data value v with count(s >= v) >= k ----------
    lo = tl.full([], S_MIN_C, tl.float32)
    hi = lo * 0.0  # the max token has s == 0: a data value
    tau_k = lo
    searching = use_k.to(tl.int32)
    n_search = searching * 0
    kf = top_k.to(tl.float32)
    jj = tl.arange(0, NPIV)
    while (searching != 0) & (n_search < MAX_SEARCH):
        piv, cnt, below = _count_pass(row_ptr, mask_row_ptr, counts_row_ptr, vocab, use_mask, freq,
                                      pres, rep, row_max, inv_t, lo, hi,
                                      HAS_MASK, HAS_PEN, BLOCK_S, NPIV)
        jstar = tl.max(tl.where(cnt >= kf, jj, -1), axis=0)  # last pivot that passes
        new_lo = tl.sum(tl.where(jj == jstar, piv, 0.0), axis=0)
        new_hi = tl.max(tl.where(jj == jstar + 1, below, float("-inf")), axis=0)
        # W(hi) >= k: tau = hi; W(lo) < k (fewer than k tokens above -40): tau = lo; else
        # tau is in [new_lo, new_hi], both data values once they meet.
        tau_k = tl.where(jstar == NPIV - 1, hi, tl.where(jstar < 0, lo, new_lo))
        searching = tl.where((jstar == NPIV - 1) | (jstar < 0) | (new_hi <= new_lo), 0, 1)
        lo = tl.where(searching != 0, new_lo, lo)
        hi = tl.where(searching != 0, new_hi, hi)
        n_search += 1
    tau_k = tl.where(searching != 0, hi, tau_k)  # budget spent (never seen): keep {s >= hi}
    base = tl.where(use_k, tl.maximum(tau_k, S_MIN_C), S_MIN_C)  # the top-p mass is over s >= base
    floor = tl.minimum(tl.where(use_k, tl.maximum(floor, tau_k), floor), 0.0)

    # ---- rejection rounds ---------------------------------------------------------------
    in_floor = s_c >= floor
    pending = (use_p & in_floor).to(tl.int32)  # the candidate awaits its top-p check
    done = ((sampled == 0) | (in_floor & (use_p == 0))).to(tl.int32)
    tok = tl.where(sampled, tok, greedy_tok)
    piv = tl.full([], float("-inf"), tl.float32)  # every s <= piv is known to be rejected
    rounds = n_search * 0
    while (done == 0) & (rounds < max_rounds):
        rounds += 1
        draw_lo = tl.where(pending != 0, s_c, piv)
        z, above, t_new = _round_pass(row_ptr, mask_row_ptr, counts_row_ptr, vocab, use_mask, freq,
                                      pres, rep, row_max, inv_t, base, s_c, floor, draw_lo,
                                      _round_key(row_key, rounds),
                                      HAS_MASK, HAS_PEN, BLOCK, FAST)
        accepted = (pending != 0) & ((above < top_p * z) | (s_c >= 0.0))
        _, x_n = _logits(row_ptr, mask_row_ptr, counts_row_ptr, t_new, vocab, use_mask, freq, pres,
                         rep, HAS_MASK, HAS_PEN)
        tok = tl.where(accepted, tok, t_new)
        # without top-p the draw region is inside the kept set: the new candidate is accepted
        done = (accepted | (use_p == 0)).to(tl.int32)
        piv = draw_lo
        s_c = (x_n - row_max) * inv_t
        pending = use_p.to(tl.int32)
    tok = tl.where(done != 0, tok, greedy_tok)  # round budget spent: the argmax (always kept)

    raw_tok = tl.load(row_ptr + tok).to(tl.float32)
    tl.store(out_tok_ptr + row, tok.to(tl.int64))
    tl.store(out_lp_ptr + row, raw_tok - lse)
    if DIAG:
        tl.store(out_rounds_ptr + row, rounds)
        tl.store(out_search_ptr + row, n_search)


# triton.jit made an interpreter function (TRITON_INTERPRET=1 at import): no inline PTX there
_INTERPRETED = not isinstance(_fused_sample_kernel, triton.runtime.jit.JITFunction)


# ----------------------------------------------------------------------------- checks

_REQUIRED = (("temperatures", torch.float32), ("top_ps", torch.float32), ("top_ks", torch.int32),
             ("min_ps", torch.float32), ("seeds", torch.int64), ("steps", torch.int64))
_OPTIONAL = (("frequency_penalties", torch.float32), ("presence_penalties", torch.float32),
             ("repetition_penalties", torch.float32), ("mask_rows", torch.bool))


def _check_batch(logits: torch.Tensor, batch: SamplingBatch) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits must be a [B, V] tensor, got {getattr(logits, 'shape', type(logits))}")
    if logits.dtype not in _DTYPES:
        raise ValueError(f"logits must be fp32/fp16/bf16, got {logits.dtype}")
    if not logits.is_contiguous():
        raise ValueError("logits must be contiguous")
    if not isinstance(batch, SamplingBatch):
        raise ValueError(f"batch must be a SamplingBatch, got {type(batch).__name__}")
    B, V = logits.shape
    dev = logits.device
    for name, dtype in _REQUIRED:
        _check_tensor(batch, name, dtype, (B,), dev)
    for name, dtype in _OPTIONAL:
        if getattr(batch, name) is not None:
            _check_tensor(batch, name, dtype, (B,), dev)
        elif name != "mask_rows" and batch.token_counts is not None:
            raise ValueError(f"batch.{name} is required when token_counts is given")
    if batch.bitmask is not None:
        _check_tensor(batch, "bitmask", torch.int32, (B, (V + 31) // 32), dev)
    elif batch.mask_rows is not None:
        raise ValueError("batch.mask_rows is given without batch.bitmask")
    if batch.token_counts is not None:
        _check_tensor(batch, "token_counts", torch.int32, (B, V), dev)


def _check_tensor(batch: SamplingBatch, name: str, dtype: torch.dtype, shape: tuple[int, ...],
                  device: torch.device) -> None:
    t = getattr(batch, name)
    if t is None:
        raise ValueError(f"batch.{name} is required")
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"batch.{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"batch.{name} must be {dtype}, got {t.dtype}")
    if t.shape != shape:
        raise ValueError(f"batch.{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"batch.{name} is on {t.device} but logits is on {device}")
    if not t.is_contiguous():
        raise ValueError(f"batch.{name} must be contiguous")


# ----------------------------------------------------------------------------- wrapper


def fused_sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits: [B, V]`` (Triton, one launch, no host sync).

    Returns ``(tokens int64 [B], logprobs f32 [B])`` where ``logprobs`` is the raw-logit
    log-softmax at the chosen token. ``logits`` is not modified.
    """
    tokens, logprobs, _, _ = _fused_sample_launch(logits, batch, diagnostics=False)
    return tokens, logprobs


def _fused_sample_launch(
    logits: torch.Tensor, batch: SamplingBatch, *, max_rounds: int = _MAX_ROUNDS,
    block: int | None = None, num_warps: int | None = None, diagnostics: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`fused_sample` plus, per row, the rejection rounds run after pass 1 and the
    top-k search passes (int32 [B] each; None without ``diagnostics``): for tests and the
    benchmark. ``max_rounds`` bounds the rounds (a row not done after them takes the
    argmax); ``block`` / ``num_warps`` are tuning knobs.

    ``block`` must not depend on the batch: the row sums, hence a draw at a top-p boundary,
    depend on it, and a seeded request must draw the same token in any batch."""
    _check_batch(logits, batch)
    dev = logits.device
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"logits must be on a CUDA device (got {dev}); use fused_sample_ref on CPU")
    B, V = logits.shape
    if B and V == 0:
        raise ValueError("logits has an empty vocabulary")
    tokens = torch.empty(B, dtype=torch.int64, device=dev)
    logprobs = torch.empty(B, dtype=torch.float32, device=dev)
    rounds = search = None
    if diagnostics:
        rounds = torch.empty(B, dtype=torch.int32, device=dev)
        search = torch.empty(B, dtype=torch.int32, device=dev)
    if B == 0:
        return tokens, logprobs, rounds, search
    if block is None:
        block = 1024 if _INTERPRETED else 4096
    block = min(block, triton.next_power_of_2(V))
    if num_warps is None:
        num_warps = 16 if block >= 4096 else 8 if block >= 1024 else 4
    mask, counts = batch.bitmask, batch.token_counts
    dummy = batch.temperatures  # any tensor: pointers a constexpr flag leaves unread
    pen = (dummy,) * 3
    if counts is not None:
        pen = (batch.frequency_penalties, batch.presence_penalties, batch.repetition_penalties)
    args = (
        logits, dummy if mask is None else mask, dummy if batch.mask_rows is None else batch.mask_rows,
        dummy if counts is None else counts,
        batch.temperatures, batch.top_ps, batch.top_ks, batch.min_ps, batch.seeds, batch.steps, *pen,
        tokens, logprobs, tokens if rounds is None else rounds, tokens if search is None else search,
        V, logits.stride(0), 0 if mask is None else mask.stride(0), 0 if counts is None else counts.stride(0),
        max_rounds,
    )
    meta = (  # the constexprs, in signature order
        mask is not None, batch.mask_rows is not None, counts is not None, block,
        min(block, 128 if _INTERPRETED else 2048),  # top-k search tile: [BLOCK_S, NPIV] in registers
        _NPIV, _MAX_SEARCH, not _INTERPRETED, diagnostics, S_MIN,
    )
    _launch(B, args, meta, num_warps)
    return tokens, logprobs, rounds, search


_META_NAMES = ("HAS_MASK", "HAS_MASK_ROWS", "HAS_PEN", "BLOCK", "BLOCK_S", "NPIV", "MAX_SEARCH",
               "FAST", "DIAG", "S_MIN_C")
_COMPILED: dict = {}  # specialisation key -> Triton's compiled kernel


def _launch(B: int, args: tuple, meta: tuple, num_warps: int) -> None:
    """Launch _fused_sample_kernel on grid (B,). Triton's generic launch re-derives the
    kernel's specialisation from all ~30 arguments on every call (about 50 us of host time
    on the H200 host, as much as the kernel at batch 64); it depends only on what ``key``
    holds (Triton specialises pointers on 16-byte alignment and ints on == 1 / % 16 == 0),
    so repeated launches call the compiled kernel directly (about 20 us)."""
    if _INTERPRETED:
        _fused_sample_kernel[(B,)](*args, **dict(zip(_META_NAMES, meta)), num_warps=num_warps)
        return
    key = (args[0].device.index, args[0].dtype, meta, num_warps,
           tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                 else (type(a), a == 1, a % 16 == 0, a >= 2**31) for a in args))
    kernel = _COMPILED.get(key)
    if kernel is not None:
        kernel[(B, 1, 1)](*args, *meta)
        return
    kernel = _fused_sample_kernel[(B,)](*args, **dict(zip(_META_NAMES, meta)), num_warps=num_warps)
    if callable(getattr(kernel, "__getitem__", None)):
        _COMPILED[key] = kernel


# ----------------------------------------------------------------------------- reference


def _mix_seed(seed: int, step: int) -> int:
    """splitmix64 of (seed, step) -> a 63-bit torch.Generator seed."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1


def processed_logits_ref(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """fp32 ``[B, V]`` logits after penalties and the bitmask (what greedy rows argmax)."""
    x = logits.float().clone()
    if batch.token_counts is not None:
        counts = batch.token_counts
        seen = counts > 0
        rep = batch.repetition_penalties[:, None]
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
        x = x - batch.frequency_penalties[:, None] * counts.float() - batch.presence_penalties[:, None] * seen.float()
    if batch.bitmask is not None:
        shifts = torch.arange(32, device=x.device, dtype=torch.int32)
        allowed = ((batch.bitmask.unsqueeze(-1) >> shifts) & 1).reshape(x.shape[0], -1)[:, : x.shape[1]].bool()
        if batch.mask_rows is not None:
            allowed |= ~batch.mask_rows[:, None]
        x.masked_fill_(~allowed, float("-inf"))
    return x


def kept_threshold_ref(s: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor) -> torch.Tensor:
    """``tau [n]`` such that the kept set of each row of ``s = (x - max) / T`` is ``s >= tau``."""
    n, V = s.shape
    tau = torch.full((n,), float("-inf"), device=s.device)
    use_k = (top_ks > 0) & (top_ks < V)
    use_p = top_ps < 1.0
    if bool((use_k | use_p).any()):
        lo0 = torch.where(s > float("-inf"), s, float("inf")).amin(-1).clamp_min(S_MIN)
        vals = s.sort(-1, descending=True).values
        kth = vals.gather(1, (top_ks.clamp(1, V) - 1).long()[:, None]).squeeze(1)
        tau_k = torch.maximum(kth, lo0)
        base = torch.where(use_k, tau_k, lo0)[:, None]
        probs = torch.where(vals >= base, vals.exp(), 0.0)
        csum = probs.cumsum(-1)
        excl = torch.cat((torch.zeros_like(csum[:, :1]), csum[:, :-1]), dim=-1)
        keep = (excl < top_ps[:, None] * csum[:, -1:]) & (vals >= base)
        n_keep = keep.sum(-1).clamp_min(1)
        tau_p = vals.gather(1, (n_keep - 1)[:, None]).squeeze(1)
        tau = torch.where(use_k, torch.maximum(tau, tau_k), tau)
        tau = torch.where(use_p, torch.maximum(tau, tau_p), tau)
    tau = torch.where(min_ps > 0, torch.maximum(tau, min_ps.clamp_min(1e-38).log()), tau)
    return tau.clamp_max(0.0)  # the max token (s == 0) is always kept


def fused_sample_ref(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch :func:`fused_sample` (any device; the CPU runtime's sampler).

    Same semantics as the kernel; sampled rows draw with ``torch.multinomial`` from a
    per-row ``torch.Generator`` seeded by ``splitmix64(seed, step)``, so a request's draw
    does not depend on its batch. Greedy rows consume no randomness.
    """
    _check_batch(logits, batch)
    raw = logits.float()
    lse = torch.logsumexp(raw, dim=-1)
    x = processed_logits_ref(logits, batch)
    row_max, tokens = x.max(dim=-1)
    sampled = (batch.temperatures >= MIN_TEMPERATURE) & (row_max > float("-inf"))
    idx = sampled.nonzero().squeeze(1)
    if idx.numel() > 0:
        inv_t = 1.0 / batch.temperatures[idx]
        s = (x[idx] - row_max[idx, None]) * inv_t[:, None]  # [n, V], max 0
        tau = kept_threshold_ref(s, batch.top_ks[idx], batch.top_ps[idx], batch.min_ps[idx])
        probs = torch.where(s >= tau[:, None], s.exp(), 0.0)
        # a row of NaN / inf logits has no distribution: it keeps its argmax (as the kernel,
        # the caller must not use it) instead of failing the whole batch in multinomial
        drawable = ((probs < float("inf")).all(-1) & (probs.sum(-1) > 0)).tolist()
        gen = torch.Generator(device=logits.device)
        drawn = []
        for j, (seed, step) in enumerate(zip(batch.seeds[idx].tolist(), batch.steps[idx].tolist())):
            if not drawable[j]:
                drawn.append(tokens[idx[j]].view(1))
                continue
            gen.manual_seed(_mix_seed(seed, step))
            drawn.append(torch.multinomial(probs[j], 1, generator=gen))
        tokens = tokens.clone()
        tokens[idx] = torch.cat(drawn)
    return tokens, raw.gather(1, tokens[:, None]).squeeze(1) - lse

"""Fused grammar-aware sampling: penalties -> bitmask -> temperature -> top-k -> top-p ->
min-p -> draw, in one Triton kernel with no sort, no host sync and no [B, V] intermediate.

Semantics (shared by :func:`fused_sample` and :func:`fused_sample_ref`), per row:

1. penalties on tokens with ``count > 0`` (counts of the row's *output* tokens so far):
   HF repetition penalty (positive logit divided, negative multiplied), then
   ``logit -= frequency * count + presence``;
2. grammar bitmask (rows with ``mask_rows[b]`` False, or no bitmask at all, are unmasked);
3. ``temperature <= 0`` (or no allowed token) -> greedy: the first argmax;
4. otherwise ``s = (logit - max) / T`` and the kept set is ``{s >= tau}`` with
   ``tau = max(tau_k, tau_p, log(min_p))``: top-k keeps every token whose strictly-greater
   count is ``< k``, top-p (on the top-k-renormalised distribution) every token whose
   strictly-greater mass is ``< top_p * mass(top-k set)``, min-p every token with
   ``p >= min_p * p_max``. Ties at a threshold are all kept. When top-k or top-p is on,
   tokens with ``s < -40`` (p < 4e-18 * p_max) are never kept;
5. draw from ``softmax(s)`` restricted to the kept set.

The returned logprob is ``log_softmax(raw logits)[token]`` (before penalties, mask, T).

Kernel algorithm. :func:`fused_sample` splits each row over several programs, one per
contiguous vocab chunk, and runs the passes below as separate launches (stats, a fixed
number of search passes, draw) whose per-chunk partials are combined by the last program of
the row to finish (kernels/sampling_kernels.py; a search not done after the fixed launches
ends serially in the draw launch). ``_fused_sample_kernel`` is the same algorithm with one
program per row, kept as the split path's cross-check. The passes:

* pass 0 (stats): raw max + raw sum-exp (for the logprob), max and first argmax of the
  processed logits (the greedy answer), min of the processed logits. With penalties the
  processed row is written once to a scratch row (the only [B, V] buffer, only then).
* search passes: a threshold is ``tau* = the largest data value v with W(s >= v) >= target``
  (``W`` = count for top-k, mass ``exp(s)`` for top-p, with target ``k`` or
  ``top_p * W(s >= tau_k)``). One pass evaluates ``W`` at ``NPIV`` evenly spaced pivots in
  ``[lo, hi]`` (``hi`` is always a data value, ``W(lo) >= target``) and, for each pivot,
  the largest data value below it. Then either ``W(hi) >= target`` (``tau* = hi``, done), or
  the bracket ``[p_j, p_{j+1})`` holding ``tau*`` becomes ``[p_j, max{s < p_{j+1}}]``. The
  interval shrinks by at least ``NPIV - 1`` per pass and snaps to data, so it is exact after
  a few passes (about log_{NPIV-1}(tokens near the threshold) + 1). Top-k runs first, then
  top-p starts from ``tau_k``. A row stops as soon as it is exact; ``MAX_PASSES`` bounds
  the total (if ever hit, the threshold falls back to ``hi``, the smallest kept set seen).
* draw pass: Gumbel-max, ``argmax_{s >= tau} s + g`` with ``g = -log(-log(u))`` and
  ``u = philox(key(seed, step), token id)``: a seeded request draws the same token for the
  same logits whatever batch it is in.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .sampling_kernels import (
    _processed_logits,
    _scaled,
    _split_draw_kernel,
    _split_search_kernel,
    _split_stats_kernel,
)

__all__ = ["SamplingBatch", "make_sampling_batch", "fused_sample", "fused_sample_ref"]

S_MIN = -40.0  # lowest kept scaled logit when top-k / top-p is on (p / p_max = 4e-18)
_NPIV = 8
_MAX_PASSES = 48
_SPLIT_NPIV = 16  # pivots per search pass of the split kernels
_SPLIT_PASSES = 5  # search launches of the split path (a row not done by then ends serially)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class SamplingBatch(NamedTuple):
    """Per-row sampling parameters, all on the logits' device (B = batch rows, V = vocab)."""

    temperatures: torch.Tensor  # f32 [B]; <= 0 means greedy
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
def _fused_sample_kernel(
    logits_ptr, scratch_ptr, bitmask_ptr, mask_rows_ptr, counts_ptr,
    temp_ptr, top_p_ptr, top_k_ptr, min_p_ptr, seed_ptr, step_ptr,
    freq_ptr, pres_ptr, rep_ptr,
    out_tok_ptr, out_lp_ptr, out_passes_ptr, out_tau_ptr,
    vocab,
    stride_logits, stride_scratch, stride_mask, stride_counts,
    HAS_MASK: tl.constexpr, HAS_MASK_ROWS: tl.constexpr, HAS_PEN: tl.constexpr,
    BLOCK: tl.constexpr, NPIV: tl.constexpr, MAX_PASSES: tl.constexpr, S_MIN_C: tl.constexpr,
):
    # grid: (B,); one program samples one row.
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_logits
    scratch_row_ptr = scratch_ptr + row * stride_scratch
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
    lanes = tl.arange(0, BLOCK)

    # ---- pass 0: stats --------------------------------------------------------------
    raw_max = tl.full([BLOCK], float("-inf"), tl.float32)
    raw_sum = tl.zeros([BLOCK], tl.float32)
    low = tl.full([BLOCK], float("inf"), tl.float32)
    best_v = tl.max(raw_max, axis=0)  # -inf
    best_i = tl.argmax(raw_max, axis=0)  # 0
    for start in range(0, vocab, BLOCK):
        offs = start + lanes
        raw = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(raw_max, raw)
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)
        raw_sum = raw_sum * tl.exp(raw_max - safe) + tl.exp(raw - safe)
        raw_max = new_max
        x = _processed_logits(row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab, use_mask,
                              freq, pres, rep, HAS_MASK, HAS_PEN)
        if HAS_PEN:
            tl.store(scratch_row_ptr + offs, x, mask=offs < vocab)
        bv = tl.max(x, axis=0)
        bi = tl.argmax(x, axis=0)
        better = bv > best_v
        best_i = tl.where(better, start + bi, best_i)
        best_v = tl.where(better, bv, best_v)
        low = tl.minimum(low, tl.where(x > float("-inf"), x, float("inf")))
    if HAS_PEN:
        tl.debug_barrier()  # the scratch row written above is read back by other threads
    rmax = tl.max(raw_max, axis=0)
    rsafe = tl.where(rmax == float("-inf"), 0.0, rmax)
    lse = rsafe + tl.log(tl.sum(raw_sum * tl.exp(raw_max - rsafe), axis=0))

    temp = tl.load(temp_ptr + row)
    sampled = (temp > 0) & (best_v > float("-inf"))
    inv_t = 1.0 / tl.where(sampled, temp, 1.0)
    row_max = tl.where(sampled, best_v, 0.0)
    lo0 = tl.maximum((tl.min(low, axis=0) - row_max) * inv_t, S_MIN_C)

    # ---- search passes: top-k (phase 0) then top-p (phase 1) ------------------------
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    use_k = sampled & (top_k > 0) & (top_k < vocab)
    use_p = sampled & (top_p < 1.0)
    phase = tl.where(use_k, 0, tl.where(use_p, 1, 2))
    lo = lo0
    hi = lo0 * 0.0  # the max token has s == 0: a data value
    target = top_k.to(tl.float32)
    fresh = phase * 0 + 1  # first pass of a phase: top-p's target is set from W(lo)
    tau_k = lo0
    tau_p = lo0
    jj = tl.arange(0, NPIV)
    frac = jj.to(tl.float32) / (NPIV - 1)
    passes = phase * 0
    while (phase < 2) & (passes < MAX_PASSES):
        piv = tl.where(jj == NPIV - 1, hi, tl.minimum(lo + (hi - lo) * frac, hi))  # [NPIV]
        is_p = phase == 1
        wsum = tl.zeros([NPIV], tl.float32)
        below = tl.full([NPIV], float("-inf"), tl.float32)
        for start in range(0, vocab, BLOCK):
            offs = start + lanes
            s = _scaled(row_ptr, scratch_row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab,
                        use_mask, freq, pres, rep, row_max, inv_t, HAS_MASK, HAS_PEN)
            w = tl.where(is_p, tl.exp(s), tl.where(s > float("-inf"), 1.0, 0.0))
            ge = s[:, None] >= piv[None, :]  # [BLOCK, NPIV]
            wsum += tl.sum(tl.where(ge, w[:, None], 0.0), axis=0)
            below = tl.maximum(below, tl.max(tl.where(ge, float("-inf"), s[:, None]), axis=0))
        w_lo = tl.sum(tl.where(jj == 0, wsum, 0.0), axis=0)
        target = tl.where(is_p & (fresh == 1), top_p * w_lo, target)
        jstar = tl.max(tl.where(wsum >= target, jj, -1), axis=0)  # last pivot that passes
        new_lo = tl.sum(tl.where(jj == jstar, piv, 0.0), axis=0)
        new_hi = tl.max(tl.where(jj == jstar + 1, below, float("-inf")), axis=0)
        done = (jstar == NPIV - 1) | (jstar < 0) | (new_hi <= new_lo)
        tau = tl.where(jstar == NPIV - 1, hi, tl.where(jstar < 0, lo, new_lo))
        k_done = done & (phase == 0)
        tau_k = tl.where(k_done, tau, tau_k)
        tau_p = tl.where(done & (phase == 1), tau, tau_p)
        phase = tl.where(done, tl.where(k_done & use_p, 1, 2), phase)
        lo = tl.where(k_done, tau, tl.where(done, lo, new_lo))
        hi = tl.where(k_done, 0.0, tl.where(done, hi, new_hi))
        fresh = tl.where(k_done, 1, 0)
        passes += 1
    # Pass budget exhausted (never seen in practice): keep {s >= hi}, a data value.
    tau_k = tl.where(phase == 0, hi, tau_k)
    tau_p = tl.where(phase <= 1, hi, tau_p)
    tl.store(out_passes_ptr + row, passes)

    tau = tl.full([], float("-inf"), tl.float32)
    tau = tl.where(use_k, tl.maximum(tau, tau_k), tau)
    tau = tl.where(use_p, tl.maximum(tau, tau_p), tau)
    tau = tl.where(min_p > 0, tl.maximum(tau, tl.log(tl.maximum(min_p, 1e-38))), tau)
    tl.store(out_tau_ptr + row, tau)

    # ---- draw pass: Gumbel-max over the kept set ------------------------------------
    tok = best_i
    if sampled:
        key = tl.load(seed_ptr + row) * 6364136223846793005 + tl.load(step_ptr + row)
        g_best = tl.full([], float("-inf"), tl.float32)
        g_idx = best_i
        for start in range(0, vocab, BLOCK):
            offs = start + lanes
            s = _scaled(row_ptr, scratch_row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab,
                        use_mask, freq, pres, rep, row_max, inv_t, HAS_MASK, HAS_PEN)
            u = tl.maximum(tl.rand(key, offs), 1.0e-12)
            val = tl.where(s >= tau, s - tl.log(-tl.log(u)), float("-inf"))
            bv = tl.max(val, axis=0)
            bi = tl.argmax(val, axis=0)
            better = bv > g_best
            g_idx = tl.where(better, start + bi, g_idx)
            g_best = tl.where(better, bv, g_best)
        tok = g_idx
    raw_tok = tl.load(row_ptr + tok).to(tl.float32)
    tl.store(out_tok_ptr + row, tok.to(tl.int64))
    tl.store(out_lp_ptr + row, raw_tok - lse)


# ----------------------------------------------------------------------------- checks


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
    required = {
        "temperatures": torch.float32, "top_ps": torch.float32, "top_ks": torch.int32,
        "min_ps": torch.float32, "seeds": torch.int64, "steps": torch.int64,
    }
    optional = {
        "frequency_penalties": torch.float32, "presence_penalties": torch.float32,
        "repetition_penalties": torch.float32, "mask_rows": torch.bool,
    }
    for name, dtype in list(required.items()) + list(optional.items()):
        t = getattr(batch, name)
        if t is None:
            if name in required:
                raise ValueError(f"batch.{name} is required")
            if name != "mask_rows" and batch.token_counts is not None:
                raise ValueError(f"batch.{name} is required when token_counts is given")
            continue
        _check_tensor(f"batch.{name}", t, dtype, (B,), dev)
    if batch.bitmask is not None:
        _check_tensor("batch.bitmask", batch.bitmask, torch.int32, (B, (V + 31) // 32), dev)
    elif batch.mask_rows is not None:
        raise ValueError("batch.mask_rows is given without batch.bitmask")
    if batch.token_counts is not None:
        _check_tensor("batch.token_counts", batch.token_counts, torch.int32, (B, V), dev)


def _check_tensor(name: str, t: object, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but logits is on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


# ----------------------------------------------------------------------------- wrapper


def fused_sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits: [B, V]`` (Triton, no host sync).

    Returns ``(tokens int64 [B], logprobs f32 [B])`` where ``logprobs`` is the raw-logit
    log-softmax at the chosen token. ``logits`` is not modified.
    """
    # Measured on an H200 (benchmarks/results/sampling_cuda*.json): splitting each row over
    # many programs wins at small batches (bs 1: 310 vs 502 us), one program per row wins
    # once the batch fills the GPU (bs 64: 505 vs 566 us, bs 256: 1011 vs 1925 us).
    launch = _fused_sample_launch if logits.shape[0] < _ROWWISE_MIN_BATCH else _fused_sample_rowwise_launch
    tokens, logprobs, _, _ = launch(logits, batch)
    return tokens, logprobs


_ROWWISE_MIN_BATCH = 32


def _launch_outputs(logits: torch.Tensor, batch: SamplingBatch
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check the arguments of a sampling launch and allocate its outputs: tokens int64 [B],
    logprobs f32 [B], search passes int32 [B], threshold tau f32 [B]."""
    _check_batch(logits, batch)
    if logits.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"logits must be on a CUDA device (got {logits.device}); use fused_sample_ref on CPU")
    B, V = logits.shape
    if B and V == 0:
        raise ValueError("logits has an empty vocabulary")
    dev = logits.device
    return (torch.empty(B, dtype=torch.int64, device=dev), torch.empty(B, dtype=torch.float32, device=dev),
            torch.empty(B, dtype=torch.int32, device=dev), torch.empty(B, dtype=torch.float32, device=dev))


def _fused_sample_rowwise_launch(
    logits: torch.Tensor, batch: SamplingBatch, block: int | None = None, num_warps: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The one-program-per-row kernel (the split path's cross-check in tests): outputs as
    :func:`_fused_sample_launch`."""
    tokens, logprobs, passes, tau = outs = _launch_outputs(logits, batch)
    B, V = logits.shape
    dev = logits.device
    if B == 0:
        return outs
    has_pen = batch.token_counts is not None
    scratch = torch.empty((B, V), dtype=torch.float32, device=dev) if has_pen else logits
    dummy = batch.temperatures
    if block is None:
        block = min(4096, triton.next_power_of_2(V))
    if num_warps is None:
        num_warps = 16 if block >= 4096 else 8 if block >= 1024 else 4
    _fused_sample_kernel[(B,)](
        logits, scratch,
        batch.bitmask if batch.bitmask is not None else dummy,
        batch.mask_rows if batch.mask_rows is not None else dummy,
        batch.token_counts if has_pen else dummy,
        batch.temperatures, batch.top_ps, batch.top_ks, batch.min_ps, batch.seeds, batch.steps,
        batch.frequency_penalties if has_pen else dummy,
        batch.presence_penalties if has_pen else dummy,
        batch.repetition_penalties if has_pen else dummy,
        tokens, logprobs, passes, tau,
        V,
        logits.stride(0), scratch.stride(0),
        batch.bitmask.stride(0) if batch.bitmask is not None else 0,
        batch.token_counts.stride(0) if has_pen else 0,
        HAS_MASK=batch.bitmask is not None, HAS_MASK_ROWS=batch.mask_rows is not None,
        HAS_PEN=has_pen, BLOCK=block, NPIV=_NPIV, MAX_PASSES=_MAX_PASSES, S_MIN_C=S_MIN,
        num_warps=num_warps,
    )
    return tokens, logprobs, passes, tau


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few chunks per row so the split path is exercised
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _fused_sample_launch(
    logits: torch.Tensor, batch: SamplingBatch, block: int | None = None, num_warps: int | None = None,
    splits: int | None = None, search_launches: int | None = None, search_block: int | None = None,
    npiv: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fused_sample` plus, per row, the search passes used (int32 [B]) and the
    final threshold ``tau`` on ``s = (x - max) / T`` (f32 [B]; -inf = keep all): for tests.

    Each row is split over ``splits`` programs (default: about 4 programs per SM in all),
    ``search_launches`` search passes run split (a row still searching after them finishes
    serially in the draw kernel), ``npiv`` pivots per pass; see kernels/sampling_kernels.py."""
    tokens, logprobs, passes, tau = outs = _launch_outputs(logits, batch)
    B, V = logits.shape
    dev = logits.device
    if B == 0:
        return outs
    if block is None:  # stats / draw tile; the chunk of a program is a multiple of it
        block = 2048 if dev.type == "cuda" else 256
    block = min(block, triton.next_power_of_2(V))
    if search_block is None:  # search tile: [search_block, npiv] accumulators in registers
        search_block = 512 if dev.type == "cuda" else 128
    search_block = min(search_block, block)
    npiv = _SPLIT_NPIV if npiv is None else npiv
    if num_warps is None:
        num_warps = 8 if block >= 1024 else 4
    n_blocks = triton.cdiv(V, block)
    if splits is None:
        splits = triton.cdiv(4 * _sm_count(dev), B)  # about 4 programs per SM
    splits = max(1, min(splits, n_blocks))
    chunk = triton.cdiv(n_blocks, splits) * block
    splits = triton.cdiv(V, chunk)  # no empty chunk
    pw = max(2 * npiv, 4)
    fw, iw = 16 + splits * pw, 16 + splits
    fbuf = torch.empty((B, fw), dtype=torch.float32, device=dev)
    ibuf = torch.zeros((B, iw), dtype=torch.int32, device=dev)  # arrival counters start at 0
    has_pen = batch.token_counts is not None
    scratch = torch.empty((B, V), dtype=torch.float32, device=dev) if has_pen else logits
    dummy = batch.temperatures
    rows = (
        logits, scratch,
        batch.bitmask if batch.bitmask is not None else dummy,
        batch.mask_rows if batch.mask_rows is not None else dummy,
        batch.token_counts if has_pen else dummy,
    )
    pen = (
        batch.frequency_penalties if has_pen else dummy,
        batch.presence_penalties if has_pen else dummy,
        batch.repetition_penalties if has_pen else dummy,
    )
    geom = (
        V, chunk, splits, logits.stride(0), scratch.stride(0),
        batch.bitmask.stride(0) if batch.bitmask is not None else 0,
        batch.token_counts.stride(0) if has_pen else 0, fw, iw,
    )
    meta = dict(
        HAS_MASK=batch.bitmask is not None, HAS_MASK_ROWS=batch.mask_rows is not None, HAS_PEN=has_pen,
        BLOCK=block, SPLITS_P2=triton.next_power_of_2(splits), PW=pw, num_warps=num_warps,
    )
    grid = (B, splits)
    _split_stats_kernel[grid](
        *rows, batch.temperatures, batch.top_ps, batch.top_ks, *pen, fbuf, ibuf, *geom,
        S_MIN_C=S_MIN, **meta,
    )
    for _ in range(_SPLIT_PASSES if search_launches is None else search_launches):
        _split_search_kernel[grid](*rows, batch.top_ps, *pen, fbuf, ibuf, *geom, NPIV=npiv, BLOCK_S=search_block, **meta)
    _split_draw_kernel[grid](
        *rows, batch.top_ps, batch.min_ps, batch.seeds, batch.steps, *pen, fbuf, ibuf,
        tokens, logprobs, passes, tau, *geom, NPIV=npiv, BLOCK_S=search_block, MAX_PASSES=_MAX_PASSES, **meta,
    )
    return tokens, logprobs, passes, tau


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
    return torch.where(min_ps > 0, torch.maximum(tau, min_ps.clamp_min(1e-38).log()), tau)


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
    sampled = (batch.temperatures > 0) & (row_max > float("-inf"))
    idx = sampled.nonzero().squeeze(1)
    if idx.numel() > 0:
        inv_t = 1.0 / batch.temperatures[idx]
        s = (x[idx] - row_max[idx, None]) * inv_t[:, None]  # [n, V], max 0
        tau = kept_threshold_ref(s, batch.top_ks[idx], batch.top_ps[idx], batch.min_ps[idx])
        probs = torch.where(s >= tau[:, None], s.exp(), 0.0)
        gen = torch.Generator(device=logits.device)
        drawn = []
        for j, (seed, step) in enumerate(zip(batch.seeds[idx].tolist(), batch.steps[idx].tolist())):
            gen.manual_seed(_mix_seed(seed, step))
            drawn.append(torch.multinomial(probs[j], 1, generator=gen))
        tokens = tokens.clone()
        tokens[idx] = torch.cat(drawn)
    return tokens, raw.gather(1, tokens[:, None]).squeeze(1) - lse

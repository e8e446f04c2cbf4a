"""Split-row Triton kernels behind :func:`treadle.kernels.sampling.fused_sample`.

Each row is cut into ``splits`` contiguous vocab chunks, one program per (row, chunk), and
the work runs as a few small launches (no host sync):

* ``_split_stats_kernel``: per-chunk partial stats; the last program of a row to finish
  (an atomic arrival counter per row) combines them and writes the row's search state;
* ``_split_search_kernel`` (launched a fixed number of times): per-chunk pivot counts /
  masses for one search pass; the row's last arriver combines them and advances the state.
  Rows whose search is over skip the launch;
* ``_split_draw_kernel``: any row still searching (rare) finishes its search serially, then
  per-chunk Gumbel-max partials, combined by the row's last arriver into token + logprob.

Per-row workspace: ``fbuf`` f32 ``[B, 16 + splits * PW]`` (cols 0..7 state, then partials)
and ``ibuf`` int32 ``[B, 16 + splits]`` (cols 0..6 state, col 8 the arrival counter, which
must start at zero and is reset by every last arriver, then per-chunk indices).
"""
from __future__ import annotations

import triton
import triton.language as tl

# fbuf state columns
F_ROW_MAX, F_INV_T, F_LO, F_HI = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
F_TARGET, F_TAU_K, F_TAU_P, F_LSE = tl.constexpr(4), tl.constexpr(5), tl.constexpr(6), tl.constexpr(7)
# ibuf state columns
I_PHASE, I_FRESH, I_PASSES, I_BEST = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
I_SAMPLED, I_USE_K, I_USE_P, I_COUNT = tl.constexpr(4), tl.constexpr(5), tl.constexpr(6), tl.constexpr(8)
PART0 = tl.constexpr(16)  # first partials column in both buffers


@triton.jit
def _processed_logits(
    row_ptr, mask_row_ptr, counts_row_ptr,
    offs, vocab, use_mask, freq, pres, rep,
    HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr,
):
    # [BLOCK] fp32 logits after penalties and mask; -inf outside the vocab / disallowed.
    inb = offs < vocab
    x = tl.load(row_ptr + offs, mask=inb, other=float("-inf")).to(tl.float32)
    if HAS_PEN:
        c = tl.load(counts_row_ptr + offs, mask=inb, other=0)
        seen = c > 0
        x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
        x = x - freq * c.to(tl.float32) - pres * seen.to(tl.float32)
    if HAS_MASK:
        word = tl.load(mask_row_ptr + offs // 32, mask=inb, other=-1)
        allowed = (((word >> (offs % 32)) & 1) != 0) | (use_mask == 0)
        x = tl.where(allowed, x, float("-inf"))
    return x


@triton.jit
def _scaled(
    row_ptr, scratch_row_ptr, mask_row_ptr, counts_row_ptr,
    offs, vocab, use_mask, freq, pres, rep, row_max, inv_t,
    HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr,
):
    # s = (processed logit - max) / T; with penalties the processed row lives in scratch.
    if HAS_PEN:
        x = tl.load(scratch_row_ptr + offs, mask=offs < vocab, other=float("-inf"))
    else:
        x = _processed_logits(row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab, use_mask,
                              freq, pres, rep, HAS_MASK, False)
    return (x - row_max) * inv_t


@triton.jit
def _row_params(mask_rows_ptr, freq_ptr, pres_ptr, rep_ptr, row,
                HAS_MASK_ROWS: tl.constexpr, HAS_PEN: tl.constexpr):
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
    return use_mask, freq, pres, rep


@triton.jit
def _pivots(lo, hi, NPIV: tl.constexpr):
    # NPIV evenly spaced pivots in [lo, hi]; the last is exactly hi (a data value).
    jj = tl.arange(0, NPIV)
    frac = jj.to(tl.float32) / (NPIV - 1)
    return tl.where(jj == NPIV - 1, hi, tl.minimum(lo + (hi - lo) * frac, hi))


@triton.jit
def _pivot_partial(
    row_ptr, scratch_row_ptr, mask_row_ptr, counts_row_ptr, start0, stop, vocab,
    use_mask, freq, pres, rep, row_max, inv_t, lo, hi, is_p,
    HAS_MASK: tl.constexpr, HAS_PEN: tl.constexpr, BLOCK: tl.constexpr, NPIV: tl.constexpr,
):
    # Over tokens [start0, stop): W(s >= piv_j) (count, or mass exp(s) when is_p) and the
    # largest s below piv_j among s >= lo. Tokens below lo weigh nothing at any pivot and
    # tokens at or above hi weigh the same at every pivot, so the [BLOCK, NPIV] work is
    # only done for blocks holding a token inside [lo, hi).
    piv = _pivots(lo, hi, NPIV)
    lanes = tl.arange(0, BLOCK)
    above = tl.zeros([BLOCK], tl.float32)
    acc_w = tl.zeros([BLOCK, NPIV], tl.float32)  # reduced once, after the loop
    acc_b = tl.full([BLOCK, NPIV], float("-inf"), tl.float32)
    for start in range(start0, stop, BLOCK):
        offs = start + lanes
        s = _scaled(row_ptr, scratch_row_ptr, mask_row_ptr, counts_row_ptr, offs, vocab,
                    use_mask, freq, pres, rep, row_max, inv_t, HAS_MASK, HAS_PEN)
        w = tl.where(is_p, tl.exp(s), tl.where(s > float("-inf"), 1.0, 0.0))
        above += tl.where(s >= hi, w, 0.0)
        inb = (s >= lo) & (s < hi)
        if tl.max(inb.to(tl.int32), axis=0) > 0:
            s_in = tl.where(inb, s, float("-inf"))  # out of the bracket: below every pivot
            ge = s_in[:, None] >= piv[None, :]  # [BLOCK, NPIV]
            acc_w += tl.where(ge, w[:, None], 0.0)
            acc_b = tl.maximum(acc_b, tl.where(ge, float("-inf"), s_in[:, None]))
    return tl.sum(acc_w, axis=0) + tl.sum(above, axis=0), tl.max(acc_b, axis=0)


@triton.jit
def _search_step(wsum, below, lo, hi, target, fresh, tau_k, tau_p, phase, passes, top_p, use_p,
                 NPIV: tl.constexpr):
    # One search pass given W at the pivots of [lo, hi]: pick the bracket holding tau*.
    jj = tl.arange(0, NPIV)
    piv = _pivots(lo, hi, NPIV)
    is_p = phase == 1
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
    phase = tl.where(done, tl.where(k_done & (use_p != 0), 1, 2), phase)
    lo_out = tl.where(k_done, tau, tl.where(done, lo, new_lo))
    hi_out = tl.where(k_done, 0.0, tl.where(done, hi, new_hi))
    fresh = tl.where(k_done, 1, 0)
    return lo_out, hi_out, target, fresh, tau_k, tau_p, phase, passes + 1


@triton.jit
def _arrive(ibuf_row_ptr, splits):
    # All this program's partial stores happen before its arrival; True for the last one.
    tl.debug_barrier()
    old = tl.atomic_add(ibuf_row_ptr + I_COUNT, 1)  # acq_rel, gpu scope
    return old == splits - 1


@triton.jit
def _split_stats_kernel(
    logits_ptr, scratch_ptr, bitmask_ptr, mask_rows_ptr, counts_ptr,
    temp_ptr, top_p_ptr, top_k_ptr, freq_ptr, pres_ptr, rep_ptr, fbuf_ptr, ibuf_ptr,
    vocab, chunk, splits, stride_logits, stride_scratch, stride_mask, stride_counts, FW, IW,
    HAS_MASK: tl.constexpr, HAS_MASK_ROWS: tl.constexpr, HAS_PEN: tl.constexpr,
    BLOCK: tl.constexpr, SPLITS_P2: tl.constexpr, PW: tl.constexpr, S_MIN_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    row_ptr = logits_ptr + row * stride_logits
    scratch_row_ptr = scratch_ptr + row * stride_scratch
    mask_row_ptr = bitmask_ptr + row * stride_mask
    counts_row_ptr = counts_ptr + row * stride_counts
    fb = fbuf_ptr + row * FW
    ib = ibuf_ptr + row * IW
    use_mask, freq, pres, rep = _row_params(mask_rows_ptr, freq_ptr, pres_ptr, rep_ptr, row,
                                            HAS_MASK_ROWS, HAS_PEN)
    lanes = tl.arange(0, BLOCK)
    c0 = c * chunk
    raw_max = tl.full([BLOCK], float("-inf"), tl.float32)
    raw_sum = tl.zeros([BLOCK], tl.float32)
    low = tl.full([BLOCK], float("inf"), tl.float32)
    best_v = tl.max(raw_max, axis=0)  # -inf
    best_i = c0
    for start in range(c0, c0 + chunk, BLOCK):
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
    rmax = tl.max(raw_max, axis=0)
    rsafe = tl.where(rmax == float("-inf"), 0.0, rmax)
    part = fb + PART0 + c * PW
    tl.store(part + 0, rmax)
    tl.store(part + 1, tl.sum(raw_sum * tl.exp(raw_max - rsafe), axis=0))
    tl.store(part + 2, best_v)
    tl.store(part + 3, tl.min(low, axis=0))
    tl.store(ib + PART0 + c, best_i)
    if _arrive(ib, splits):
        ks = tl.arange(0, SPLITS_P2)
        km = ks < splits
        parts = fb + PART0 + ks * PW
        m = tl.load(parts + 0, mask=km, other=float("-inf"), cache_modifier=".cg")
        sm = tl.load(parts + 1, mask=km, other=0.0, cache_modifier=".cg")
        bvs = tl.load(parts + 2, mask=km, other=float("-inf"), cache_modifier=".cg")
        lows = tl.load(parts + 3, mask=km, other=float("inf"), cache_modifier=".cg")
        bis = tl.load(ib + PART0 + ks, mask=km, other=2147483647, cache_modifier=".cg")
        mm = tl.max(m, axis=0)
        ms = tl.where(mm == float("-inf"), 0.0, mm)
        lse = ms + tl.log(tl.sum(sm * tl.exp(m - ms), axis=0))
        best_v = tl.max(bvs, axis=0)
        best_i = tl.min(tl.where(bvs == best_v, bis, 2147483647), axis=0)  # first argmax
        temp = tl.load(temp_ptr + row)
        sampled = (temp > 0) & (best_v > float("-inf"))
        inv_t = 1.0 / tl.where(sampled, temp, 1.0)
        row_max = tl.where(sampled, best_v, 0.0)
        lo0 = tl.maximum((tl.min(lows, axis=0) - row_max) * inv_t, S_MIN_C)
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        use_k = sampled & (top_k > 0) & (top_k < vocab)
        use_p = sampled & (top_p < 1.0)
        tl.store(fb + F_ROW_MAX, row_max)
        tl.store(fb + F_INV_T, inv_t)
        tl.store(fb + F_LO, lo0)
        tl.store(fb + F_HI, 0.0)  # the max token has s == 0: a data value
        tl.store(fb + F_TARGET, top_k.to(tl.float32))
        tl.store(fb + F_TAU_K, lo0)
        tl.store(fb + F_TAU_P, lo0)
        tl.store(fb + F_LSE, lse)
        tl.store(ib + I_PHASE, tl.where(use_k, 0, tl.where(use_p, 1, 2)))
        tl.store(ib + I_FRESH, 1)
        tl.store(ib + I_PASSES, 0)
        tl.store(ib + I_BEST, best_i)
        tl.store(ib + I_SAMPLED, sampled.to(tl.int32))
        tl.store(ib + I_USE_K, use_k.to(tl.int32))
        tl.store(ib + I_USE_P, use_p.to(tl.int32))
        tl.store(ib + I_COUNT, 0)


@triton.jit
def _split_search_kernel(
    logits_ptr, scratch_ptr, bitmask_ptr, mask_rows_ptr, counts_ptr,
    top_p_ptr, freq_ptr, pres_ptr, rep_ptr, fbuf_ptr, ibuf_ptr,
    vocab, chunk, splits, stride_logits, stride_scratch, stride_mask, stride_counts, FW, IW,
    HAS_MASK: tl.constexpr, HAS_MASK_ROWS: tl.constexpr, HAS_PEN: tl.constexpr,
    BLOCK: tl.constexpr, SPLITS_P2: tl.constexpr, PW: tl.constexpr, NPIV: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    fb = fbuf_ptr + row * FW
    ib = ibuf_ptr + row * IW
    phase = tl.load(ib + I_PHASE)
    if phase < 2:  # the same for every chunk of the row: all arrive or none
        use_mask, freq, pres, rep = _row_params(mask_rows_ptr, freq_ptr, pres_ptr, rep_ptr, row,
                                                HAS_MASK_ROWS, HAS_PEN)
        lo = tl.load(fb + F_LO)
        hi = tl.load(fb + F_HI)
        c0 = c * chunk
        wsum, below = _pivot_partial(
            logits_ptr + row * stride_logits, scratch_ptr + row * stride_scratch,
            bitmask_ptr + row * stride_mask, counts_ptr + row * stride_counts,
            c0, c0 + chunk, vocab, use_mask, freq, pres, rep,
            tl.load(fb + F_ROW_MAX), tl.load(fb + F_INV_T), lo, hi, phase == 1,
            HAS_MASK, HAS_PEN, BLOCK_S, NPIV)
        jj = tl.arange(0, NPIV)
        part = fb + PART0 + c * PW
        tl.store(part + jj, wsum)
        tl.store(part + NPIV + jj, below)
        if _arrive(ib, splits):
            ks = tl.arange(0, SPLITS_P2)
            offs = PART0 + ks[:, None] * PW + jj[None, :]
            km = (ks < splits)[:, None]
            wsum = tl.sum(tl.load(fb + offs, mask=km, other=0.0, cache_modifier=".cg"), axis=0)
            below = tl.max(tl.load(fb + offs + NPIV, mask=km, other=float("-inf"),
                                   cache_modifier=".cg"), axis=0)
            lo, hi, target, fresh, tau_k, tau_p, phase, passes = _search_step(
                wsum, below, lo, hi, tl.load(fb + F_TARGET), tl.load(ib + I_FRESH),
                tl.load(fb + F_TAU_K), tl.load(fb + F_TAU_P), phase, tl.load(ib + I_PASSES),
                tl.load(top_p_ptr + row), tl.load(ib + I_USE_P), NPIV)
            tl.store(fb + F_LO, lo)
            tl.store(fb + F_HI, hi)
            tl.store(fb + F_TARGET, target)
            tl.store(fb + F_TAU_K, tau_k)
            tl.store(fb + F_TAU_P, tau_p)
            tl.store(ib + I_PHASE, phase)
            tl.store(ib + I_FRESH, fresh)
            tl.store(ib + I_PASSES, passes)
            tl.store(ib + I_COUNT, 0)


@triton.jit
def _split_draw_kernel(
    logits_ptr, scratch_ptr, bitmask_ptr, mask_rows_ptr, counts_ptr,
    top_p_ptr, min_p_ptr, seed_ptr, step_ptr, freq_ptr, pres_ptr, rep_ptr, fbuf_ptr, ibuf_ptr,
    out_tok_ptr, out_lp_ptr, out_passes_ptr, out_tau_ptr,
    vocab, chunk, splits, stride_logits, stride_scratch, stride_mask, stride_counts, FW, IW,
    HAS_MASK: tl.constexpr, HAS_MASK_ROWS: tl.constexpr, HAS_PEN: tl.constexpr,
    BLOCK: tl.constexpr, SPLITS_P2: tl.constexpr, PW: tl.constexpr, NPIV: tl.constexpr,
    BLOCK_S: tl.constexpr, MAX_PASSES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    row_ptr = logits_ptr + row * stride_logits
    scratch_row_ptr = scratch_ptr + row * stride_scratch
    mask_row_ptr = bitmask_ptr + row * stride_mask
    counts_row_ptr = counts_ptr + row * stride_counts
    fb = fbuf_ptr + row * FW
    ib = ibuf_ptr + row * IW
    use_mask, freq, pres, rep = _row_params(mask_rows_ptr, freq_ptr, pres_ptr, rep_ptr, row,
                                            HAS_MASK_ROWS, HAS_PEN)
    row_max = tl.load(fb + F_ROW_MAX)
    inv_t = tl.load(fb + F_INV_T)
    lo = tl.load(fb + F_LO)
    hi = tl.load(fb + F_HI)
    target = tl.load(fb + F_TARGET)
    tau_k = tl.load(fb + F_TAU_K)
    tau_p = tl.load(fb + F_TAU_P)
    phase = tl.load(ib + I_PHASE)
    fresh = tl.load(ib + I_FRESH)
    passes = tl.load(ib + I_PASSES)
    best_i = tl.load(ib + I_BEST)
    sampled = tl.load(ib + I_SAMPLED) != 0
    use_k = tl.load(ib + I_USE_K) != 0
    use_p_i = tl.load(ib + I_USE_P)
    top_p = tl.load(top_p_ptr + row)
    # A search the fixed launches did not finish (rare) ends here over the whole row: every
    # chunk of the row computes the same threshold.
    while (phase < 2) & (passes < MAX_PASSES):
        wsum, below = _pivot_partial(row_ptr, scratch_row_ptr, mask_row_ptr, counts_row_ptr,
                                     0, vocab, vocab, use_mask, freq, pres, rep, row_max, inv_t,
                                     lo, hi, phase == 1, HAS_MASK, HAS_PEN, BLOCK_S, NPIV)
        lo, hi, target, fresh, tau_k, tau_p, phase, passes = _search_step(
            wsum, below, lo, hi, target, fresh, tau_k, tau_p, phase, passes, top_p, use_p_i, NPIV)
    # Pass budget exhausted (never seen in practice): keep {s >= hi}, a data value.
    tau_k = tl.where(phase == 0, hi, tau_k)
    tau_p = tl.where(phase <= 1, hi, tau_p)
    min_p = tl.load(min_p_ptr + row)
    tau = tl.full([], float("-inf"), tl.float32)
    tau = tl.where(use_k, tl.maximum(tau, tau_k), tau)
    tau = tl.where(use_p_i != 0, tl.maximum(tau, tau_p), tau)
    tau = tl.where(min_p > 0, tl.maximum(tau, tl.log(tl.maximum(min_p, 1e-38))), tau)

    g_best = tl.full([], float("-inf"), tl.float32)
    g_idx = best_i
    if sampled:
        key = tl.load(seed_ptr + row) * 6364136223846793005 + tl.load(step_ptr + row)
        lanes = tl.arange(0, BLOCK)
        c0 = c * chunk
        for start in range(c0, c0 + chunk, BLOCK):
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
    tl.store(fb + PART0 + c * PW, g_best)
    tl.store(ib + PART0 + c, g_idx)
    if _arrive(ib, splits):
        ks = tl.arange(0, SPLITS_P2)
        km = ks < splits
        gb = tl.load(fb + PART0 + ks * PW, mask=km, other=float("-inf"), cache_modifier=".cg")
        gi = tl.load(ib + PART0 + ks, mask=km, other=2147483647, cache_modifier=".cg")
        top = tl.max(gb, axis=0)
        tok = tl.min(tl.where(gb == top, gi, 2147483647), axis=0)  # first index of the max
        tok = tl.where(sampled, tok, best_i)
        raw_tok = tl.load(row_ptr + tok).to(tl.float32)
        tl.store(out_tok_ptr + row, tok.to(tl.int64))
        tl.store(out_lp_ptr + row, raw_tok - tl.load(fb + F_LSE))
        tl.store(out_passes_ptr + row, passes)
        tl.store(out_tau_ptr + row, tau)
        tl.store(ib + I_COUNT, 0)

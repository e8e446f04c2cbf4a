"""Fused mixture-of-experts: routing, then each token's chosen experts in two grouped GEMMs.

Shapes (T tokens, H hidden, E experts on this rank, I expert width on this rank, K experts a
token):
    x            [T, H]        the MoE layer's input
    w13          [E, 2I, H]    gate rows [0, I), then up rows [I, 2I) (HF's gate_up_proj layout)
    w2           [E, H, I]     down projection
    topk_weights [T, K] fp32   routing weights
    topk_ids     [T, K] int32  expert of each (token, k) pair in [0, E]; E = "not on this rank"
                               (expert parallelism), such pairs add nothing
    out[t] = sum_k topk_weights[t, k] * w2[e] @ (silu(gate_e @ x[t]) * (up_e @ x[t])), e = topk_ids[t, k]

`moe_route` turns router logits into (topk_weights, topk_ids): softmax over all experts, the
top K, renormalised to sum to 1 when asked (Qwen3-MoE's norm_topk_prob; Mixtral always, which
equals a softmax over its top-K logits). `moe_router` is the router's matmul and `moe_route`
in one launch, for a few tokens (decode).

`fused_moe` picks one of two paths, both with a fixed launch shape for a given T (so CUDA graphs
capture them) and no per-expert Python loop:
- decode (T == 1, or T*K <= E/2: few pairs, experts rarely shared): one program per (pair,
  column block) computes gate and up rows and the SiLU product; then one program per (token,
  column block) runs the down projection of the token's K experts, weights and sums them.
- grouped: the (token, k) pairs are sorted by expert and each expert's run padded to the block
  size M (`moe_align`); one grouped GEMM computes gate and up with the SiLU product in its
  epilogue, another the down projection with the routing weight in its epilogue, and the K
  rows of a token are summed.
`fused_moe_ref` is the same computation in torch (gathered expert weights, batched matmul): the
CPU path.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl
from treadle.kernels.gemv import dequantize_blocks, scale_block_k
from treadle.kernels.rmsnorm import NormedInput

__all__ = ["moe_route", "moe_router", "moe_route_ref", "moe_align", "pick_config", "fused_moe", "fused_moe_ref"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ONE_HOT_MAX = 1 << 21  # moe_align: pairs x (experts + 1) up to this use the one-hot count


# ------------------------------------------------------------------------------- routing

@triton.jit
def _route_token(logits_ptr, weights_ptr, ids_ptr, t, num_experts, expert_start, num_local, stride_l,
                 TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr, RENORM: tl.constexpr,
                 CACHE: tl.constexpr):
    # one token: softmax over the experts, K rounds of argmax
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    x = tl.load(logits_ptr + t * stride_l + offs, mask=mask, other=-float("inf"), cache_modifier=CACHE)
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = tl.where(mask, p, 0.0)
    p = p / tl.sum(p, axis=0)
    left = tl.where(mask, p, -1.0)
    ks = tl.arange(0, K_PAD)
    w = tl.zeros([K_PAD], dtype=tl.float32)
    ids = tl.zeros([K_PAD], dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        idx = tl.min(tl.where(left == best, offs, BLOCK_E), axis=0)  # the lowest index of a tie
        w = tl.where(ks == k, best, w)
        ids = tl.where(ks == k, idx, ids)
        left = tl.where(offs == idx, -1.0, left)
    if RENORM:
        w = w / tl.sum(w, axis=0)
    local = ids - expert_start
    local = tl.where((local >= 0) & (local < num_local), local, num_local)
    tl.store(weights_ptr + t * TOP_K + ks, w, mask=ks < TOP_K)
    tl.store(ids_ptr + t * TOP_K + ks, local, mask=ks < TOP_K)


@triton.jit
def _route_kernel(
    logits_ptr, weights_ptr, ids_ptr,
    num_experts, expert_start, num_local,
    stride_l,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr, RENORM: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (T,); one program = one token
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    _route_token(logits_ptr, weights_ptr, ids_ptr, tl.program_id(0).to(tl.int64), num_experts, expert_start,
                 num_local, stride_l, TOP_K, K_PAD, BLOCK_E, RENORM, "")


@triton.jit
def _router_input(x_row, r_row, g_ptr, k0, cols, hidden, NORM: tl.constexpr, RESIDUAL: tl.constexpr):
    # inputs k0 : k0 + BLOCK_K of a token: (h, what multiplies the router weight), fp32, zeros past
    # H. h = x, or x + residual rounded to x's dtype; NORM: the weight multiplies h * g (the norm's
    # weight), and the sums are scaled by the row's 1 / rms at the end (kernels/rmsnorm.py's NormedInput)
    kmask = k0 + cols < hidden
    h = tl.load(x_row + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
    if RESIDUAL:
        h = (h + tl.load(r_row + k0 + cols, mask=kmask, other=0.0).to(tl.float32)).to(x_row.dtype.element_ty)
        h = h.to(tl.float32)
    a = h
    if NORM:
        a = h * tl.load(g_ptr + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
    return h, a


@triton.jit
def _router_kernel(
    x_ptr, w_ptr, logits_ptr, weights_ptr, ids_ptr, ticket_ptr, r_ptr, g_ptr, ro_ptr, xn_ptr,
    num_tokens, num_experts, hidden, expert_start, num_local, eps,
    stride_xt, stride_w,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr, RENORM: tl.constexpr, PDL: tl.constexpr,
    NORM: tl.constexpr = False, RESIDUAL: tl.constexpr = False, SLICE: tl.constexpr = 16,
):
    # grid: (cdiv(E, BLOCK_R),); each program the logits of BLOCK_R experts for every token
    # (fp32, as kernels/gemv.py), then a ticket: the program that takes the last one routes
    # every token (kernels/decode_attention.py's merge, same ordering: barrier, one
    # release/acquire atomic at GPU scope, barrier, loads through L2).
    # NORM: x is a NormedInput (rows of stride H): every program normalises as it loads, and
    # writes its SLICE of the normed rows to xn (for the experts) and, RESIDUAL, of x + residual
    # to residual_out; the norm costs no launch of its own.
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < num_experts
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_w + cols[None, :]
    # the router weight before the wait (kernels/pdl.py): nobody writes it
    w0 = tl.load(w_ptrs, mask=rmask[:, None] & (cols < hidden)[None, :], other=0.0).to(tl.float32)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    for t in range(0, num_tokens):
        x_row = x_ptr + t * stride_xt
        r_row = r_ptr + t * hidden
        h, a = _router_input(x_row, r_row, g_ptr, 0, cols, hidden, NORM, RESIDUAL)
        acc = w0 * a[None, :]
        squares = h * h
        for k0 in range(BLOCK_K, hidden, BLOCK_K):
            kmask = k0 + cols < hidden
            w = tl.load(w_ptrs + k0, mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            h, a = _router_input(x_row, r_row, g_ptr, k0, cols, hidden, NORM, RESIDUAL)
            acc += w * a[None, :]
            squares += h * h
        logit = tl.sum(acc, axis=1)
        if NORM:
            rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / hidden + eps)
            logit = logit * rstd
            # the normed row (rmsnorm's rounding) and the residual stream, SLICE inputs a program
            # (every program has the row's rstd): no program streams the whole row twice
            offs = pid * SLICE + tl.arange(0, SLICE)
            smask = offs < hidden
            h, a = _router_input(x_row, r_row, g_ptr, pid * SLICE, tl.arange(0, SLICE), hidden, NORM, RESIDUAL)
            if RESIDUAL:
                tl.store(ro_ptr + t * hidden + offs, h.to(ro_ptr.dtype.element_ty), mask=smask)
            g = tl.load(g_ptr + offs, mask=smask, other=0.0).to(tl.float32)
            xn = (h * rstd).to(xn_ptr.dtype.element_ty).to(tl.float32) * g
            tl.store(xn_ptr + t * hidden + offs, xn.to(xn_ptr.dtype.element_ty), mask=smask)
        tl.store(logits_ptr + t * num_experts + rows, logit, mask=rmask)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        tl.debug_barrier()
        for t in range(0, num_tokens):
            _route_token(logits_ptr, weights_ptr, ids_ptr, t, num_experts, expert_start, num_local, num_experts,
                         TOP_K, K_PAD, BLOCK_E, RENORM, ".cg")
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")  # ready for the next launch


def _check_route(logits: torch.Tensor | int, top_k: int, expert_start: int, num_local: int | None) -> int:
    """Checks of the routing arguments (logits [T, E], or E itself); returns num_local."""
    if isinstance(logits, int):
        e = logits
    elif not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("router logits must be a [T, E] tensor")
    else:
        e = logits.shape[1]
    if not 0 < top_k <= e:
        raise ValueError(f"top_k must be in [1, {e}], got {top_k}")
    num_local = e if num_local is None else num_local
    if not (0 <= expert_start and 0 < num_local and expert_start + num_local <= e):
        raise ValueError(f"local experts [{expert_start}, {expert_start + num_local}) are not within [0, {e})")
    return num_local


def moe_route(logits: torch.Tensor, top_k: int, renormalize: bool, expert_start: int = 0,
              num_local: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, K] fp32, ids [T, K] int32), ids relative to this rank's
    experts [expert_start, expert_start + num_local); an expert elsewhere is num_local (Triton)."""
    num_local = _check_route(logits, top_k, expert_start, num_local)
    if logits.device.type != "cuda" and not _interpreting():
        raise ValueError(f"logits must be on a CUDA device (got {logits.device}); use moe_route_ref on CPU")
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous in the expert dimension")
    t, e = logits.shape
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    if t:
        _route_kernel[(t,)](logits, weights, ids, e, expert_start, num_local, logits.stride(0),
                            TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
                            BLOCK_E=triton.next_power_of_2(e), RENORM=renormalize, num_warps=1 if e <= 256 else 4,
                            **pdl.options(logits))
    return weights, ids


ROUTER_MAX_TOKENS = 8  # moe_router's tokens: every program loops over all of them


def moe_router(x: torch.Tensor | NormedInput, gate_weight: torch.Tensor, top_k: int, renormalize: bool,
               ticket: torch.Tensor, expert_start: int = 0, num_local: int | None = None,
               normed_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The router of a few tokens in one launch: logits x [T, H] @ gate_weight [E, H].T in
    fp32, then `moe_route` on them -> (weights [T, K] fp32, ids [T, K] int32). T <= 8.
    ticket: an int32 zero on x's device (the kernel leaves it zero); one launch at a time uses
    it. A decode step at batch 1 saves the route kernel's launch a layer.
    x may be a NormedInput (kernels/rmsnorm.py; contiguous rows): the router normalises it as it
    loads it, writes the normed rows into `normed_out` ([T, H], x's dtype: the experts' input) and
    x + residual into its residual_out: the norm before the MoE block costs no launch."""
    norm = x if isinstance(x, NormedInput) else None
    if norm is not None:
        norm.check()
        x = norm.x
        if not (isinstance(normed_out, torch.Tensor) and normed_out.shape == x.shape and normed_out.dtype == x.dtype
                and normed_out.is_contiguous() and normed_out.device == x.device):
            raise ValueError(f"a NormedInput router needs normed_out, a contiguous tensor like x {tuple(x.shape)}")
        if not x.is_contiguous():
            raise ValueError("a NormedInput router takes contiguous rows of x")
    elif normed_out is not None:
        raise ValueError("normed_out is written for a NormedInput x only")
    if not (isinstance(x, torch.Tensor) and x.dim() == 2 and 0 < x.shape[0] <= ROUTER_MAX_TOKENS):
        raise ValueError(f"x must be [T, H] with 1 <= T <= {ROUTER_MAX_TOKENS}")
    if gate_weight.dim() != 2 or gate_weight.shape[1] != x.shape[1] or not gate_weight.is_contiguous():
        raise ValueError(f"gate_weight must be a contiguous [E, H={x.shape[1]}] tensor, got {tuple(gate_weight.shape)}")
    num_local = _check_route(gate_weight.shape[0], top_k, expert_start, num_local)
    if x.stride(1) != 1 or x.dtype not in _DTYPES or gate_weight.dtype != x.dtype:
        raise ValueError("x must be contiguous in H and share gate_weight's fp32/fp16/bf16 dtype")
    if not (isinstance(ticket, torch.Tensor) and ticket.dtype == torch.int32 and ticket.numel() >= 1):
        raise ValueError("ticket must be an int32 tensor holding a zero")
    if x.device.type != "cuda" and not _interpreting():
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use moe_route_ref on CPU")
    t, h = x.shape
    e = gate_weight.shape[0]
    logits = torch.empty((t, e), dtype=torch.float32, device=x.device)
    weights = torch.empty((t, top_k), dtype=torch.float32, device=x.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=x.device)
    residual = norm.residual if norm is not None and norm.residual is not None else x
    # one warp a program, one expert's row each: the logit's sum and the routing (the last
    # program's) stay within a warp, no shared-memory reductions (an H100 profile of a 4-warp,
    # 2-row version: 5.6 us a layer, against 4.0 for the GEMV and moe_route launched apart)
    block_k = min(triton.next_power_of_2(h), 2048)
    _router_kernel[(e,)](
        x, gate_weight, logits, weights, ids, ticket, residual, norm.weight if norm is not None else x,
        norm.residual_out if norm is not None and norm.residual_out is not None else x,
        normed_out if normed_out is not None else x,
        t, e, h, expert_start, num_local, float(norm.eps) if norm is not None else 0.0, x.stride(0),
        gate_weight.stride(0), BLOCK_R=1, BLOCK_K=block_k, TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
        BLOCK_E=triton.next_power_of_2(e), RENORM=renormalize, NORM=norm is not None,
        RESIDUAL=norm is not None and norm.residual is not None, SLICE=triton.next_power_of_2(triton.cdiv(h, e)),
        num_warps=1, **pdl.options(x))
    return weights, ids


def moe_route_ref(logits: torch.Tensor, top_k: int, renormalize: bool, expert_start: int = 0,
                  num_local: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch `moe_route` (any device): softmax in fp32, top-k, optional renormalisation."""
    num_local = _check_route(logits, top_k, expert_start, num_local)
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    local = ids - expert_start
    local = torch.where((local >= 0) & (local < num_local), local, num_local)
    return weights, local.to(torch.int32)


# ------------------------------------------------------------------------------- alignment

def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the P = T*K (token, k) pairs by expert, each expert's run padded to block_m.

    Returns (sorted_ids [S] int32, block_expert [S / block_m] int32, num_padded [1] int32):
    sorted_ids lists pair indices (t*K + k) expert by expert, padding entries = P; block b holds
    sorted_ids[b*M : (b+1)*M], all of expert block_expert[b]; blocks at or past num_padded are
    unused. S = P + min(E, P) * (M - 1) rounded up to M bounds every routing, so the shapes (and
    the GEMM grids) depend on T alone: no host sync, CUDA-graph safe. Pairs of expert E (not on
    this rank) are left out.

        experts   0 0 0 | 1 | 3 3      (P = 6, M = 4)
        sorted    a b c P | d P P P | e f P P      num_padded = 12
    """
    flat = topk_ids.reshape(-1)
    p = flat.numel()
    dev = flat.device
    size = -(-(p + min(num_experts, p) * (block_m - 1)) // block_m) * block_m
    e_idx = flat.long()
    if p * (num_experts + 1) <= _ONE_HOT_MAX:
        # decode-sized: a pair's place within its expert from a running count over a one-hot
        # table (one cumsum; no sort)
        # (experts along rows, pairs along the scanned inner dimension: torch's scan over an
        # outer dimension took ~200 us for 1,024 pairs on the H200, the inner one a few)
        onehot = (torch.arange(num_experts + 1, device=dev)[:, None] == e_idx[None, :]).to(torch.int32)
        running = torch.cumsum(onehot, 1)  # [E + 1, P]
        counts = running[:, -1].long()
        rank = running.gather(0, e_idx[None, :]).squeeze(0).long() - 1
        sorted_e, order = e_idx, torch.arange(p, device=dev)
    else:
        counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
        counts.scatter_add_(0, e_idx, torch.ones_like(e_idx))
        order = torch.argsort(flat, stable=True)  # pairs by expert; pairs of expert E come last
        sorted_e = e_idx[order]
        first = torch.cumsum(counts, 0) - counts  # [E + 1] where each expert's pairs start in `order`
        rank = torch.arange(p, device=dev) - first[sorted_e]  # position within its expert
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)  # [E] end of each expert's run in sorted_ids
    starts = torch.cat([ends - padded, ends.new_full((1,), size)])
    dest = torch.where(sorted_e < num_experts, starts[sorted_e] + rank, size)  # expert E -> a trash slot
    sorted_ids = torch.full((size + 1,), p, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, size, block_m, device=dev)
    block_expert = torch.searchsorted(ends, block_starts, right=True).to(torch.int32)
    return sorted_ids[:size], block_expert, ends[-1:].to(torch.int32)


# ------------------------------------------------------------------------------- kernels

@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr, s_ptr,
    n_out, k_in, num_pairs,
    stride_am, stride_we, stride_wn, stride_cm, stride_se, stride_sn,
    A_DIV: tl.constexpr, GATED: tl.constexpr, WEIGHTED: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_K: tl.constexpr = 0,
):
    # grid: (blocks of sorted pairs * column blocks,). c[pair, n] = a[pair // A_DIV] @ w[e, n]^T,
    # GATED: silu(rows n) * (rows n + n_out) of w; WEIGHTED: times the pair's routing weight.
    # SCALE_K > 0: w is FP8 with scales s[e, n, k // SCALE_K]; each K step's weights (within one
    # scale block) are dequantized to a's dtype before the product (weight-only FP8)
    pid = tl.program_id(0)
    num_n = tl.cdiv(n_out, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ids_ptr + offs_m)
    mask_m = pairs < num_pairs
    rows = (pairs // A_DIV).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_out
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = w_ptr + e * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [K, N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, tl.cdiv(k_in, BLOCK_K)):
        mask_k = offs_k < k_in - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if SCALE_K > 0:
            s_rows = s_ptr + e * stride_se + offs_n.to(tl.int64) * stride_sn + (k0 * BLOCK_K) // SCALE_K
            b = (b.to(tl.float32) * tl.load(s_rows, mask=mask_n, other=0.0)[None, :]).to(a_ptr.dtype.element_ty)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if GATED:
            b_up = tl.load(b_ptrs + n_out * stride_wn, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            if SCALE_K > 0:
                s_up = tl.load(s_rows + n_out * stride_sn, mask=mask_n, other=0.0)
                b_up = (b_up.to(tl.float32) * s_up[None, :]).to(a_ptr.dtype.element_ty)
            if IEEE:
                acc_up = tl.dot(a, b_up, acc_up, input_precision="ieee")
            else:
                acc_up = tl.dot(a, b_up, acc_up)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(topk_w_ptr + pairs, mask=mask_m, other=0.0)[:, None]
    c_ptrs = c_ptr + pairs[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _moe_gemv_up_kernel(
    x_ptr, w13_ptr, ids_ptr, act_ptr, s_ptr,
    hidden: tl.constexpr, inter, num_experts,
    stride_xt, stride_we, stride_wn, stride_at, stride_se, stride_sn,
    TOP_K: tl.constexpr, EVEN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    SCALE_K: tl.constexpr = 0, ROW_SCALE: tl.constexpr = False,
):
    # grid: (T*K, cdiv(I, BLOCK_N)); act[pair, n] = silu(gate_e[n] . x[t]) * (up_e[n] . x[t]).
    # SCALE_K > 0: FP8 weights times their scales s[e, n, k // SCALE_K] (as kernels/gemv.py's);
    # ROW_SCALE (one block covers K: a scale per row) applies them once, to the sums
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    # As kernels/gemv.py: [BLOCK_N, BLOCK_K] fp32 partial products kept in registers and
    # reduced once at the end, weights loaded once with an evict-first hint.
    pair = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    e = tl.load(ids_ptr + pair)
    valid = e < num_experts  # an expert on another rank: nothing is read, the row is never used
    mask_n = (offs_n < inter) & (offs_n * 0 + e < num_experts)
    cols = tl.arange(0, BLOCK_K)
    w_gate = w13_ptr + tl.where(valid, e, 0).to(tl.int64) * stride_we + offs_n[:, None].to(tl.int64) * stride_wn \
        + cols[None, :]
    w_up = w_gate + inter * stride_wn
    x_row = x_ptr + (pair // TOP_K) * stride_xt + cols
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.static_range(0, hidden, BLOCK_K):  # unrolled: every chunk's loads can be in flight
        if EVEN:
            xv = tl.load(x_row + k0).to(tl.float32)
            m = mask_n[:, None] & (cols < BLOCK_K)[None, :]
        else:
            mask_k = k0 + cols < hidden
            xv = tl.load(x_row + k0, mask=mask_k, other=0.0).to(tl.float32)
            m = mask_n[:, None] & mask_k[None, :]
        g = tl.load(w_gate + k0, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        u = tl.load(w_up + k0, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        if SCALE_K > 0 and not ROW_SCALE:
            s_gate = s_ptr + tl.where(valid, e, 0).to(tl.int64) * stride_se + offs_n[:, None].to(tl.int64) * stride_sn \
                + ((k0 + cols) // SCALE_K)[None, :]
            g *= tl.load(s_gate, mask=m, other=0.0)
            u *= tl.load(s_gate + inter * stride_sn, mask=m, other=0.0)
        acc_g += g * xv[None, :]
        acc_u += u * xv[None, :]
    sg = tl.sum(acc_g, axis=1)
    su = tl.sum(acc_u, axis=1)
    if ROW_SCALE:
        s_row = s_ptr + tl.where(valid, e, 0).to(tl.int64) * stride_se + offs_n.to(tl.int64) * stride_sn
        sg *= tl.load(s_row, mask=mask_n, other=0.0)
        su *= tl.load(s_row + inter * stride_sn, mask=mask_n, other=0.0)
    y = sg / (1.0 + tl.exp(-sg)) * su
    tl.store(act_ptr + pair * stride_at + offs_n, y.to(act_ptr.dtype.element_ty), mask=offs_n < inter)


@triton.jit
def _down_weights(w_rows, wmask, k0, cols, inter: tl.constexpr, EVEN: tl.constexpr):
    # chunk k0 of every expert's rows, [K_PAD, BLOCK_N, BLOCK_K] in the weights' dtype, streamed once
    if EVEN:
        return tl.load(w_rows + k0, mask=wmask, other=0.0, eviction_policy="evict_first")
    return tl.load(w_rows + k0, mask=wmask & (k0 + cols < inter)[None, None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _down_scaled(w, s_rows, wmask, k0, cols, inter: tl.constexpr, SCALE_K: tl.constexpr):
    # a chunk of down weights in fp32, FP8 ones (SCALE_K > 0) times their scales s[e, n, k // SCALE_K]
    if SCALE_K == 0:
        return w.to(tl.float32)
    s = tl.load(s_rows + ((k0 + cols) // SCALE_K)[None, None, :], mask=wmask & (k0 + cols < inter)[None, None, :],
                other=0.0)
    return w.to(tl.float32) * s


@triton.jit
def _down_acts(a_rows, amask, wt, k0, cols, inter: tl.constexpr):
    # the same inputs of the K activations, [K_PAD, BLOCK_K] in fp32, times their routing weights
    a = tl.load(a_rows + k0, mask=amask & (k0 + cols < inter)[None, :], other=0.0)
    return a.to(tl.float32) * wt[:, None]


@triton.jit
def _moe_gemv_down_kernel(
    act_ptr, w2_ptr, ids_ptr, topk_w_ptr, out_ptr, s_ptr,
    hidden, inter: tl.constexpr, num_experts,
    stride_at, stride_we, stride_wn, stride_ot, stride_se, stride_sn,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, EVEN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr, SCALE_K: tl.constexpr = 0, ROW_SCALE: tl.constexpr = False,
):
    # grid: (T, cdiv(H, BLOCK_N)); out[t, n] = sum_k w[t, k] * (w2_e[n] . act[t*K + k]): one
    # [K_PAD, BLOCK_N, BLOCK_K] fp32 tile collects every expert's products (the routing weight
    # scales the activation chunk) and is reduced once at the end.
    # The routing was written by the router, the kernel before the up projection (which runs
    # just before this one), so the expert ids, their routing weights and the weights they pick
    # are read before the wait (kernels/pdl.py): the first two chunks of every expert's rows
    # load while the up projection finishes. Only the activations wait.
    t = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden
    ks = tl.arange(0, K_PAD)
    pairs = t * TOP_K + ks
    e = tl.load(ids_ptr + pairs, mask=ks < TOP_K, other=num_experts)
    valid = e < num_experts  # an expert on another rank (or a padding k): nothing read, weight 0
    wt = tl.load(topk_w_ptr + pairs, mask=valid, other=0.0)
    cols = tl.arange(0, BLOCK_K)
    w_rows = w2_ptr + tl.where(valid, e, 0).to(tl.int64)[:, None, None] * stride_we \
        + offs_n.to(tl.int64)[None, :, None] * stride_wn + cols[None, None, :]
    a_rows = act_ptr + pairs[:, None] * stride_at + cols[None, :]
    wmask = valid[:, None, None] & mask_n[None, :, None]
    amask = valid[:, None]
    w0 = _down_weights(w_rows, wmask, 0, cols, inter, EVEN)
    if inter > BLOCK_K:
        w1 = _down_weights(w_rows, wmask, BLOCK_K, cols, inter, EVEN)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    s_rows = s_ptr + tl.where(valid, e, 0).to(tl.int64)[:, None, None] * stride_se \
        + offs_n.to(tl.int64)[None, :, None] * stride_sn
    chunk_k: tl.constexpr = 0 if ROW_SCALE else SCALE_K  # per row: scaled once, after the sums
    acc = _down_scaled(w0, s_rows, wmask, 0, cols, inter, chunk_k) * _down_acts(a_rows, amask, wt, 0, cols,
                                                                                 inter)[:, None, :]
    if inter > BLOCK_K:
        acc += _down_scaled(w1, s_rows, wmask, BLOCK_K, cols, inter, chunk_k) \
            * _down_acts(a_rows, amask, wt, BLOCK_K, cols, inter)[:, None, :]
    for k0 in tl.static_range(2 * BLOCK_K, inter, BLOCK_K):  # unrolled: every chunk's loads in flight
        w = _down_weights(w_rows, wmask, k0, cols, inter, EVEN)
        acc += _down_scaled(w, s_rows, wmask, k0, cols, inter, chunk_k) \
            * _down_acts(a_rows, amask, wt, k0, cols, inter)[:, None, :]
    if ROW_SCALE:
        s_row = s_ptr + tl.where(valid, e, 0).to(tl.int64)[:, None] * stride_se \
            + offs_n.to(tl.int64)[None, :] * stride_sn
        per_k = tl.sum(acc, axis=2) * tl.load(s_row, mask=valid[:, None] & mask_n[None, :], other=0.0)
        y = tl.sum(per_k, axis=0)
    else:
        y = tl.sum(tl.sum(acc, axis=2), axis=0)
    tl.store(out_ptr + t * stride_ot + offs_n, y.to(out_ptr.dtype.element_ty), mask=mask_n)


# ------------------------------------------------------------------------------- wrappers

def _check(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
           topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None
           ) -> tuple[int, int]:
    """The arguments' checks; returns the scales' block widths (0, 0 without scales)."""
    for name, t in (("x", x), ("w13", w13), ("w2", w2), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"need x [T, H], w13 [E, 2I, H], w2 [E, H, I]; got {tuple(x.shape)}, "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}")
    e, two_i, h = w13.shape
    if h != x.shape[1] or two_i % 2 or tuple(w2.shape) != (e, h, two_i // 2):
        raise ValueError(f"shapes do not agree: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids and topk_weights must both be [T, K] with T = {x.shape[0]}")
    if topk_ids.dtype != torch.int32 or topk_weights.dtype != torch.float32:
        raise ValueError("topk_ids must be int32 and topk_weights float32")
    if (w13_scale is None) != (w2_scale is None):
        raise ValueError("give both w13_scale and w2_scale (FP8 experts) or neither")
    if w13_scale is None:
        if x.dtype not in _DTYPES or w13.dtype != x.dtype or w2.dtype != x.dtype:
            raise ValueError(f"x, w13 and w2 must share one of fp32/fp16/bf16, got {x.dtype}, {w13.dtype}, {w2.dtype}")
        return 0, 0
    if x.dtype not in _DTYPES or w13.dtype != torch.float8_e4m3fn or w2.dtype != torch.float8_e4m3fn:
        raise ValueError(f"with scales, w13 and w2 must be float8_e4m3fn and x fp32/fp16/bf16, got {w13.dtype}, "
                         f"{w2.dtype}, {x.dtype}")
    blocks = []
    for name, sc, w in (("w13_scale", w13_scale, w13), ("w2_scale", w2_scale, w2)):
        if not isinstance(sc, torch.Tensor) or sc.dtype != torch.float32 or sc.dim() != 3 \
                or sc.shape[:2] != w.shape[:2] or not sc.is_contiguous() or sc.device != x.device:
            raise ValueError(f"{name} must be contiguous fp32 [E, N, K blocks] = [{w.shape[0]}, {w.shape[1]}, ...] "
                             f"on x's device, got {tuple(sc.shape) if isinstance(sc, torch.Tensor) else sc!r}")
        blocks.append(scale_block_k(w.shape[2], sc.shape[2]))
    return blocks[0], blocks[1]


def pick_config(t: int, top_k: int, num_experts: int, hidden: int, inter: int) -> dict:
    """Launch parameters for T tokens: `decode` True = the GEMV path (bn_up / bk_up for gate
    and up; bn_down / bk_down for down, split_down: one program per pair and column block, the
    K partial rows summed after, instead of a program looping over a token's K experts),
    False = the grouped GEMMs (block_m / block_n / block_k, warps, stages). A JSON file named
    by TREADLE_FUSED_MOE_CONFIG (benchmarks/bench_fused_moe.py --write-config writes one)
    overrides these for its own shape: its entry for the smallest token count >= T (past its
    largest, these defaults)."""
    fits = [n for n in (_tuned(num_experts, top_k, hidden, inter) or {}) if n >= t]
    if fits:
        return dict(_TUNED_BY_SHAPE[(num_experts, top_k, hidden, inter)][min(fits)])
    if t == 1 or t * top_k <= num_experts // 2:
        # kernels/gemv.py's shape of work: 4 weight rows a program, long K chunks
        bk_down = min(256, triton.next_power_of_2(inter))
        while bk_down > 16 and inter % bk_down:  # a chunk that divides I needs no masks
            bk_down //= 2
        # (H200 sweep, qwen3-30b-a3b, one token: 2 rows a program on both sides, 33.8 us a layer
        # with the routing, 4 rows 35.8; benchmarks/results/fused_moe_qwen3-30b-a3b_cuda.json)
        return dict(decode=True, bn_up=2, bk_up=min(1024, triton.next_power_of_2(hidden)), warps_up=2,
                    bn_down=2, bk_down=bk_down if inter % bk_down == 0 else min(256, triton.next_power_of_2(inter)),
                    split_down=False, warps=4)
    if t * top_k <= 16 * num_experts:  # few pairs an expert (decode batches): small row blocks waste less
        # (H200, qwen3-30b-a3b, 32 and 128 tokens: block_n 128 the best of the sweep, 79.8% and
        # 75.6% of the copy bandwidth over the experts a batch activates)
        cfg = dict(decode=False, block_m=16, block_n=128, block_k=128, warps=4, stages=3)
    else:
        cfg = dict(decode=False, block_m=64, block_n=128, block_k=64, warps=8, stages=3)
    if _interpreting():
        cfg.update(block_n=32, block_k=32)
    return cfg


_TUNED: dict[tuple, dict[int, dict] | None] = {}
_TUNED_BY_SHAPE: dict[tuple, dict[int, dict]] = {}


def _tuned(num_experts: int, top_k: int, hidden: int, inter: int) -> dict[int, dict] | None:
    """{token count: config} from TREADLE_FUSED_MOE_CONFIG for this shape, or None."""
    path = os.environ.get("TREADLE_FUSED_MOE_CONFIG")
    if not path:
        return None
    key = (path, num_experts, top_k, hidden, inter)
    if key not in _TUNED:
        import json

        with open(path) as f:
            d = json.load(f)
        if list(d.get("shape", ())) != [num_experts, top_k, hidden, inter]:
            _TUNED[key] = None
        else:
            _TUNED[key] = {int(n): c for n, c in d["configs"].items()}
    if _TUNED[key]:
        _TUNED_BY_SHAPE[key[1:]] = _TUNED[key]
    return _TUNED[key]


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, decode_path: bool | None = None, config: dict | None = None, *,
              w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The module docstring's `out` [T, H] in x's dtype (Triton). decode_path None picks the
    path from the sizes, True / False forces one (tests); config overrides `pick_config`'s
    launch parameters (benchmarks). FP8 experts (weight-only): w13 and w2 float8_e4m3fn with
    fp32 scales [E, N, cdiv(K, b)], one per output row and per b inputs (b a power of two:
    per channel, b covers K; a block-quantized checkpoint's 128)."""
    sk13, sk2 = _check(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)
    if x.device.type != "cuda" and not _interpreting():
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use fused_moe_ref on CPU")
    if not (x.stride(1) == 1 and w13.is_contiguous() and w2.is_contiguous()
            and topk_ids.is_contiguous() and topk_weights.is_contiguous()):
        raise ValueError("x must be contiguous in its last dimension, the other tensors contiguous")
    t, h = x.shape
    e, two_i, _ = w13.shape
    inter, top_k = two_i // 2, topk_ids.shape[1]
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    cfg = pick_config(t, top_k, e, h, inter)
    if decode_path is not None and decode_path != cfg["decode"]:
        cfg = pick_config(1 if decode_path else max(t, e), top_k, e, h, inter)
    if not cfg["decode"] and x.element_size() == 4:  # fp32 tiles: half the K depth fits shared memory
        cfg["block_k"] = min(cfg["block_k"], 64)
    cfg.update(config or {})
    s13 = w13_scale if w13_scale is not None else w13
    s2 = w2_scale if w2_scale is not None else w2
    ss13 = (s13.stride(0), s13.stride(1)) if sk13 else (0, 0)
    ss2 = (s2.stride(0), s2.stride(1)) if sk2 else (0, 0)
    if cfg["decode"]:
        act = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
        _moe_gemv_up_kernel[(t * top_k, triton.cdiv(inter, cfg["bn_up"]))](
            x, w13, topk_ids, act, s13, h, inter, e, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), *ss13,
            TOP_K=top_k, EVEN=h % cfg["bk_up"] == 0, BLOCK_N=cfg["bn_up"], BLOCK_K=cfg["bk_up"], SCALE_K=sk13,
            ROW_SCALE=bool(sk13) and s13.shape[2] == 1,
            num_warps=cfg.get("warps_up", cfg["warps"]), **pdl.options(x))
        if cfg.get("split_down"):  # each pair on its own programs: K partial rows, summed after
            part = torch.empty((t * top_k, h), dtype=x.dtype, device=x.device)
            _moe_gemv_down_kernel[(t * top_k, triton.cdiv(h, cfg["bn_down"]))](
                act, w2, topk_ids, topk_weights, part, s2, h, inter, e, act.stride(0), w2.stride(0), w2.stride(1),
                part.stride(0), *ss2, TOP_K=1, K_PAD=1, EVEN=inter % cfg["bk_down"] == 0, BLOCK_N=cfg["bn_down"],
                BLOCK_K=cfg["bk_down"], SCALE_K=sk2, ROW_SCALE=bool(sk2) and s2.shape[2] == 1, num_warps=cfg["warps"],
                **pdl.options(x))
            torch.sum(part.view(t, top_k, h), dim=1, out=out)
            return out
        _moe_gemv_down_kernel[(t, triton.cdiv(h, cfg["bn_down"]))](
            act, w2, topk_ids, topk_weights, out, s2, h, inter, e, act.stride(0), w2.stride(0), w2.stride(1),
            out.stride(0), *ss2, TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), EVEN=inter % cfg["bk_down"] == 0,
            BLOCK_N=cfg["bn_down"], BLOCK_K=cfg["bk_down"], SCALE_K=sk2, ROW_SCALE=bool(sk2) and s2.shape[2] == 1,
            num_warps=cfg["warps"], **pdl.options(x))
        return out
    pairs = t * top_k
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    launch = dict(num_warps=cfg["warps"]) if _interpreting() else dict(num_warps=cfg["warps"], num_stages=cfg["stages"])
    sorted_ids, block_expert, num_padded = moe_align(topk_ids, e, bm)
    ieee = x.dtype == torch.float32
    act = torch.empty((pairs, inter), dtype=x.dtype, device=x.device)
    blocks = block_expert.numel()
    _moe_gemm_kernel[(blocks * triton.cdiv(inter, bn),)](
        x, w13, act, topk_weights, sorted_ids, block_expert, num_padded, s13, inter, h, pairs,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), *ss13,
        A_DIV=top_k, GATED=True, WEIGHTED=False, IEEE=ieee, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=min(bk, sk13) if sk13 else bk, SCALE_K=sk13, **launch)
    # pairs of experts on other ranks are never written: they must read as zeros
    down = torch.zeros((pairs, h), dtype=x.dtype, device=x.device)
    _moe_gemm_kernel[(blocks * triton.cdiv(h, bn),)](
        act, w2, down, topk_weights, sorted_ids, block_expert, num_padded, s2, h, inter, pairs,
        act.stride(0), w2.stride(0), w2.stride(1), down.stride(0), *ss2,
        A_DIV=1, GATED=False, WEIGHTED=True, IEEE=ieee, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=min(bk, sk2) if sk2 else bk, SCALE_K=sk2, **launch)
    torch.sum(down.view(t, top_k, h), dim=1, out=out)
    return out


def fused_moe_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, decode_path: bool | None = None, config: dict | None = None, *,
                  w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-torch `fused_moe` (any device): each pair's expert weights gathered (FP8 ones
    dequantized, in x's dtype) and applied with a batched matmul, in chunks of pairs that bound
    the gathered bytes (no loop over experts). decode_path and config are accepted for the same
    signature and ignored."""
    _check(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)
    t, h = x.shape
    e, two_i, _ = w13.shape
    inter, top_k = two_i // 2, topk_ids.shape[1]
    ids = topk_ids.reshape(-1).long()
    valid = ids < e
    wts = (topk_weights.reshape(-1) * valid).to(x.dtype)  # [P]; experts elsewhere weigh 0
    ids = torch.where(valid, ids, 0)
    down = torch.empty((t * top_k, h), dtype=x.dtype, device=x.device)
    chunk = max(1, (256 << 20) // max(1, 3 * inter * h * x.element_size()))
    for s in range(0, t * top_k, chunk):
        sel = ids[s : s + chunk]
        xs = x[torch.arange(s, s + sel.numel(), device=x.device) // top_k].unsqueeze(2)  # [p, H, 1]
        gu = torch.bmm(_expert_weights(w13, w13_scale, sel, x.dtype), xs).squeeze(2)  # [p, 2I]
        act = (torch.nn.functional.silu(gu[:, :inter].float()) * gu[:, inter:].float()).to(x.dtype)
        y = torch.bmm(_expert_weights(w2, w2_scale, sel, x.dtype), act.unsqueeze(2)).squeeze(2)  # [p, H]
        down[s : s + sel.numel()] = y * wts[s : s + sel.numel(), None]
    return down.view(t, top_k, h).sum(dim=1)


def _expert_weights(w: torch.Tensor, scale: torch.Tensor | None, sel: torch.Tensor, dtype: torch.dtype
                    ) -> torch.Tensor:
    """w[sel] in `dtype`: FP8 experts dequantized with their scales [E, N, K blocks]."""
    return w[sel] if scale is None else dequantize_blocks(w[sel], scale[sel]).to(dtype)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"

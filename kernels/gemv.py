"""Skinny matmul for decoding a few tokens: ``y = x @ w.T (+ bias)`` with ``x: [M, K]``,
``M <= MAX_M`` and ``w: [N, K]`` (an ``nn.Linear`` weight).

At batch 1 a decode step is one pass over the weights, so its speed is the speed at which a
matmul streams ``w`` from memory. Each program here owns ``BLOCK_N`` whole rows of ``w``
and walks them along K in ``BLOCK_K`` chunks, keeping a ``[BLOCK_N, BLOCK_K]`` fp32 partial
product per token in registers and reducing it once at the end: no split-K pass, no
second launch, and the weight is loaded exactly once with an evict-first hint (it will not
be reused before the next step). ``x`` is tiny and stays in cache.

``w`` may also be float8_e4m3fn with one fp32 scale per row (``w_scale`` [N]): the FP8 linear's
decode path (kernels/fp8_linear.py), which streams one byte an element and multiplies each
output by its row's scale after the reduction. Block-quantized FP8 (DeepSeek / Qwen FP8
checkpoints, a scale per 128 x 128 block) gives a scale per row and per ``scale_block_k``
inputs instead (``w_scale`` [N, cdiv(K, scale_block_k)], the blocks' scales repeated down their
rows): each weight chunk is multiplied by its scales before the products.

One row of ``x`` may come as a ``NormedInput`` (kernels/rmsnorm.py): the RMSNorm before the
projection (and the residual add before that) done by this kernel as it loads x, its sums
scaled by the row's 1 / rms at the end, instead of by a launch of its own; with it, ``act="silu"``
takes a gate/up weight and writes ``silu(gate) * up``, so batch-1 decode runs a dense MLP's
norm, gate/up and SiLU in one launch (runtime/models/llama.py).

``gemv_ref`` is ``torch.nn.functional.linear`` in fp32, rounded to the output dtype.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl
from treadle.kernels.rmsnorm import NormedInput, normed_input_ref

__all__ = ["gemv", "gemv_ref", "MAX_M", "pick_config", "scale_block_k", "dequantize_blocks"]

MAX_M = 4
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _x_chunk(x_row, k0, cols, K, EVEN: tl.constexpr):
    # x[row, k0 : k0 + BLOCK_K] in fp32 (zeros past K)
    if EVEN:
        x = tl.load(x_row + k0 + cols)
    else:
        x = tl.load(x_row + k0 + cols, mask=k0 + cols < K, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _store_row(y_row, acc, scale, bias, rows, rmask):
    tl.store(y_row + rows, (tl.sum(acc, axis=1) * scale + bias).to(y_row.dtype.element_ty), mask=rmask)


@triton.jit
def _w_chunk(w_ptrs, k0, cols, rmask, K, EVEN: tl.constexpr):
    # w[rows, k0 : k0 + BLOCK_K] in its own dtype, streamed once (evict-first)
    if EVEN:
        w = tl.load(w_ptrs + k0, eviction_policy="evict_first")
    else:
        w = tl.load(w_ptrs + k0, mask=rmask[:, None] & (k0 + cols < K)[None, :], other=0.0,
                    eviction_policy="evict_first")
    return w


@triton.jit
def _block_scaled(w, s_ptr, rows, k0, cols, rmask, K, stride_sn, SCALE_K: tl.constexpr):
    # w[rows, k0 : k0 + BLOCK_K] in fp32 times its scales s[rows, (k0 + cols) // SCALE_K]
    kmask = k0 + cols < K
    s = tl.load(s_ptr + rows[:, None] * stride_sn + ((k0 + cols) // SCALE_K)[None, :],
                mask=rmask[:, None] & kmask[None, :], other=0.0)
    return w.to(tl.float32) * s


@triton.jit
def _accumulate(acc0, acc1, acc2, acc3, w, x_ptr, stride_xm, k0, cols, K, M: tl.constexpr, EVEN: tl.constexpr):
    w = w.to(tl.float32)
    acc0 += w * _x_chunk(x_ptr, k0, cols, K, EVEN)[None, :]
    if M > 1:
        acc1 += w * _x_chunk(x_ptr + stride_xm, k0, cols, K, EVEN)[None, :]
    if M > 2:
        acc2 += w * _x_chunk(x_ptr + 2 * stride_xm, k0, cols, K, EVEN)[None, :]
    if M > 3:
        acc3 += w * _x_chunk(x_ptr + 3 * stride_xm, k0, cols, K, EVEN)[None, :]
    return acc0, acc1, acc2, acc3


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr,
    N, K,
    stride_xm, stride_wn, stride_ym, stride_sn,
    M: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD2: tl.constexpr, PDL: tl.constexpr,
    SCALE_K: tl.constexpr = 0,
):
    # grid: (cdiv(N, BLOCK_N),); one program = BLOCK_N output features for all M tokens, one
    # fp32 partial-product tile per token (M <= 4, unrolled: the tiles live in registers).
    # SCALE_K > 0: w_scale is [N, cdiv(K, SCALE_K)], applied to each chunk (block-quantized FP8)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + cols[None, :]
    # the first chunk of weights, the second too where K has one (AHEAD2), and the scales
    # before waiting on the kernel that writes x (kernels/pdl.py): under PDL these loads
    # overlap that kernel's tail. Held in the weight's own dtype until used.
    w = _w_chunk(w_ptrs, 0, cols, rmask, K, EVEN)
    if AHEAD2:
        w_second = _w_chunk(w_ptrs, BLOCK_K, cols, rmask, K, EVEN)
    if SCALE_K > 0:
        w = _block_scaled(w, s_ptr, rows, 0, cols, rmask, K, stride_sn, SCALE_K)
        if AHEAD2:
            w_second = _block_scaled(w_second, s_ptr, rows, BLOCK_K, cols, rmask, K, stride_sn, SCALE_K)
    scale = tl.full([BLOCK_N], 1.0, tl.float32)
    if HAS_SCALE and SCALE_K == 0:
        scale = tl.load(s_ptr + rows, mask=rmask, other=0.0)
    bias = tl.zeros([BLOCK_N], tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc0, acc1, acc2, acc3 = _accumulate(acc0, acc1, acc2, acc3, w, x_ptr, stride_xm, 0, cols, K, M, EVEN)
    start = BLOCK_K
    if AHEAD2:
        acc0, acc1, acc2, acc3 = _accumulate(acc0, acc1, acc2, acc3, w_second, x_ptr, stride_xm, BLOCK_K, cols, K,
                                             M, EVEN)
        start = 2 * BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        w = _w_chunk(w_ptrs, k0, cols, rmask, K, EVEN)
        if SCALE_K > 0:
            w = _block_scaled(w, s_ptr, rows, k0, cols, rmask, K, stride_sn, SCALE_K)
        acc0, acc1, acc2, acc3 = _accumulate(acc0, acc1, acc2, acc3, w, x_ptr, stride_xm, k0, cols, K, M, EVEN)
    _store_row(y_ptr, acc0, scale, bias, rows, rmask)
    if M > 1:
        _store_row(y_ptr + stride_ym, acc1, scale, bias, rows, rmask)
    if M > 2:
        _store_row(y_ptr + 2 * stride_ym, acc2, scale, bias, rows, rmask)
    if M > 3:
        _store_row(y_ptr + 3 * stride_ym, acc3, scale, bias, rows, rmask)


@triton.jit
def _normed_chunk(x_ptr, r_ptr, g_ptr, ro_ptr, k0, cols, K, store_k, RESIDUAL: tl.constexpr,
                  EVEN: tl.constexpr, NORM: tl.constexpr = True):
    # (h, h * g) for inputs k0 : k0 + BLOCK_K of a NormedInput's one row, h = x (+ residual, rounded
    # to x's dtype, written to residual_out below store_k: K in one program, 0 in the others), in
    # fp32, zeros past K. Not NORM (a plain row of x): (x, x)
    h = _x_chunk(x_ptr, k0, cols, K, EVEN)
    a = h
    if NORM:
        if RESIDUAL:
            h = (h + _x_chunk(r_ptr, k0, cols, K, EVEN)).to(x_ptr.dtype.element_ty).to(tl.float32)
            tl.store(ro_ptr + k0 + cols, h.to(ro_ptr.dtype.element_ty), mask=k0 + cols < store_k)
        a = h * tl.load(g_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
    return h, a


@triton.jit
def _normed_step(acc_g, acc_u, squares, wg, wu, x_ptr, r_ptr, g_ptr, ro_ptr, s_ptr, rows, rmask, up_rows, k0, cols, K,
                 stride_sn, store_k, RESIDUAL: tl.constexpr, SILU: tl.constexpr, SCALE_K: tl.constexpr,
                 EVEN: tl.constexpr, NORM: tl.constexpr):
    # one chunk of _gemv_normed_kernel: the chunk's squares and its products with the gate (or
    # only) rows wg and the up rows wu, weights in their own dtype (FP8 block-scaled: SCALE_K > 0)
    h, a = _normed_chunk(x_ptr, r_ptr, g_ptr, ro_ptr, k0, cols, K, store_k, RESIDUAL, EVEN, NORM)
    if NORM:
        squares += h * h
    if SCALE_K > 0:
        wg = _block_scaled(wg, s_ptr, rows, k0, cols, rmask, K, stride_sn, SCALE_K)
    acc_g += wg.to(tl.float32) * a[None, :]
    if SILU:
        if SCALE_K > 0:
            wu = _block_scaled(wu, s_ptr, rows + up_rows, k0, cols, rmask, K, stride_sn, SCALE_K)
        acc_u += wu.to(tl.float32) * a[None, :]
    return acc_g, acc_u, squares


@triton.jit
def _gemv_normed_kernel(
    x_ptr, r_ptr, g_ptr, ro_ptr, w_ptr, s_ptr, b_ptr, y_ptr,
    N, K, eps, up_rows,
    stride_wn, stride_sn,
    RESIDUAL: tl.constexpr, SILU: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD2: tl.constexpr, PDL: tl.constexpr,
    SCALE_K: tl.constexpr = 0, NORM: tl.constexpr = True,
):
    # grid: (cdiv(N, BLOCK_N),); _gemv_kernel's program for one row of x that is a NormedInput
    # (kernels/rmsnorm.py): y[n] = rstd * sum_k w[n, k] * h[k] * g[k], rstd = 1 / sqrt(mean(h^2) + eps),
    # the squares summed over the same chunks as the products. SILU: rows n and up_rows + n (a
    # gate/up pair) give y[n] = silu(gate) * up, N outputs of the 2N rows. Not NORM: x is a plain
    # row (rstd 1, no residual), for the SILU of a projection whose input comes normed already.
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + cols[None, :]
    u_ptrs = w_ptrs + up_rows * stride_wn
    # as _gemv_kernel: the store_k chunk of weights (the second too, AHEAD2) and the scales before
    # the wait (kernels/pdl.py)
    wg = _w_chunk(w_ptrs, 0, cols, rmask, K, EVEN)
    wu = wg
    if SILU:
        wu = _w_chunk(u_ptrs, 0, cols, rmask, K, EVEN)
    if AHEAD2:
        wg2 = _w_chunk(w_ptrs, BLOCK_K, cols, rmask, K, EVEN)
        wu2 = wg2
        if SILU:
            wu2 = _w_chunk(u_ptrs, BLOCK_K, cols, rmask, K, EVEN)
    sg = tl.full([BLOCK_N], 1.0, tl.float32)
    su = tl.full([BLOCK_N], 1.0, tl.float32)
    if HAS_SCALE and SCALE_K == 0:
        sg = tl.load(s_ptr + rows, mask=rmask, other=0.0)
        if SILU:
            su = tl.load(s_ptr + up_rows + rows, mask=rmask, other=0.0)
    bg = tl.zeros([BLOCK_N], tl.float32)
    bu = tl.zeros([BLOCK_N], tl.float32)
    if HAS_BIAS:
        bg = tl.load(b_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        if SILU:
            bu = tl.load(b_ptr + up_rows + rows, mask=rmask, other=0.0).to(tl.float32)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    store_k = tl.where(pid == 0, K, 0)  # program 0 writes residual_out
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    squares = tl.zeros([BLOCK_K], tl.float32)
    acc_g, acc_u, squares = _normed_step(acc_g, acc_u, squares, wg, wu, x_ptr, r_ptr, g_ptr, ro_ptr, s_ptr, rows, rmask,
                                         up_rows, 0, cols, K, stride_sn, store_k, RESIDUAL, SILU, SCALE_K, EVEN, NORM)
    start = BLOCK_K
    if AHEAD2:
        acc_g, acc_u, squares = _normed_step(acc_g, acc_u, squares, wg2, wu2, x_ptr, r_ptr, g_ptr, ro_ptr, s_ptr, rows,
                                             rmask, up_rows, BLOCK_K, cols, K, stride_sn, store_k, RESIDUAL, SILU,
                                             SCALE_K, EVEN, NORM)
        start = 2 * BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        wg = _w_chunk(w_ptrs, k0, cols, rmask, K, EVEN)
        wu = wg
        if SILU:
            wu = _w_chunk(u_ptrs, k0, cols, rmask, K, EVEN)
        acc_g, acc_u, squares = _normed_step(acc_g, acc_u, squares, wg, wu, x_ptr, r_ptr, g_ptr, ro_ptr, s_ptr, rows,
                                             rmask, up_rows, k0, cols, K, stride_sn, store_k, RESIDUAL, SILU, SCALE_K,
                                             EVEN, NORM)
    rstd = 1.0
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
    y = tl.sum(acc_g, axis=1) * (sg * rstd) + bg
    if SILU:
        up = tl.sum(acc_u, axis=1) * (su * rstd) + bu
        y = y / (1.0 + tl.exp(-y)) * up
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rmask)


def scale_block_k(k: int, blocks: int) -> int:
    """The inputs a scale column covers when K inputs have `blocks` of them: the power of two
    (at least 32) b with cdiv(k, b) == blocks. Block sizes are powers of two (checked where a
    checkpoint's config is read), and that b is then the only one: cdiv(k, blocks) lies in
    (b / 2, b] for two blocks or more, and one block covers all of K whatever its size."""
    if blocks < 1:
        raise ValueError(f"a block-scaled weight needs at least one scale column, got {blocks}")
    b = max(32, triton.next_power_of_2(triton.cdiv(k, blocks)))
    if triton.cdiv(k, b) != blocks:
        raise ValueError(f"{blocks} scale columns do not cover {k} inputs in power-of-two blocks")
    return b


def dequantize_blocks(w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """fp32 [..., N, K]: w times its scales, w_scale [..., N, KB] holding one per row and
    scale_block_k inputs (FP8 experts [E, N, K] too)."""
    k = w.shape[-1]
    b = scale_block_k(k, w_scale.shape[-1])
    return w.float() * w_scale.float().repeat_interleave(b, dim=-1)[..., :k]


def pick_config(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for an [m, k] x [n, k]^T product.

    m == 1: 4 rows x 1 KB-wide chunks on 2 warps, the best or within 3% of the best config of
    an H200 sweep on every llama3-8b shape (benchmarks/bench_gemv.py: 3.4-4.4 TB/s, against
    cuBLAS's 2.6-4.1). More rows of x multiply the fp32 partial sums held per thread, so
    m > 1 takes narrower tiles on more threads. One-byte (FP8) weights keep the same tiles:
    2,048-wide chunks (the same bytes a step as bf16's) measured 67% of the copy bandwidth on
    a llama3-8b layer, 1,024-wide 72-83% (benchmarks/results/quant_gemv_sweep_cuda.log)."""
    block_k = min(1024 if m == 1 else 512, triton.next_power_of_2(k))
    if m == 1:
        return 4, block_k, 2, 1
    return 2, block_k, 4, 1


def _check(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None,
           w_scale: torch.Tensor | None = None) -> None:
    for name, t in (("x", x), ("w", w)) + ((("bias", bias),) if bias is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        if name == "w" and w_scale is not None:
            if t.dtype != torch.float8_e4m3fn:
                raise ValueError(f"a w with w_scale must be float8_e4m3fn, got {t.dtype}")
        elif t.dtype not in _DTYPES:
            raise ValueError(f"{name} must be fp32/fp16/bf16, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"need x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if not 1 <= x.shape[0] <= MAX_M:
        raise ValueError(f"gemv handles 1..{MAX_M} rows of x, got {x.shape[0]}")
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError("x must have a unit last stride and w must be contiguous")
    if w_scale is None and w.dtype != x.dtype:
        raise ValueError(f"w ({w.dtype}) must have x's dtype ({x.dtype})")
    if w_scale is not None and (not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32
                                or w_scale.shape[:1] != (w.shape[0],) or w_scale.dim() > 2
                                or w_scale.device != x.device or not w_scale.is_contiguous()):
        raise ValueError(f"w_scale must be contiguous fp32 [N={w.shape[0]}] or [N, K blocks] on x's device")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"bias must be [N={w.shape[0]}], got {tuple(bias.shape)}")
    if out_dtype is not None and out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype must be fp32/fp16/bf16, got {out_dtype}")


def gemv(x: torch.Tensor | NormedInput, w: torch.Tensor, bias: torch.Tensor | None = None, *,
         out_dtype: torch.dtype | None = None, config: tuple[int, int, int, int] | None = None,
         w_scale: torch.Tensor | None = None, act: str | None = None) -> torch.Tensor:
    """``x [M<=4, K] @ (w[N, K] * w_scale[:, None]).T (+ bias)`` -> ``[M, N]`` in ``out_dtype``
    (default x's); w_scale (fp32 [N], or [N, KB]: a scale per row and per scale_block_k(K, KB)
    inputs) only with a float8_e4m3fn w.
    x may be a NormedInput of one row (kernels/rmsnorm.py): the kernel normalises it as it loads
    it and writes its residual_out. With one row of x (a NormedInput or not), act "silu" takes w's
    rows as a gate/up pair (gate rows, then as many up rows) and gives silu(gate) * up, [1, N / 2]:
    the decode step's gate/up and SiLU in one launch."""
    if isinstance(x, NormedInput) or act is not None:
        return _gemv_normed(x, w, bias, out_dtype, config, w_scale, act)
    _check(x, w, bias, out_dtype, w_scale)
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use gemv_ref on CPU")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if n == 0:
        return y
    if k == 0:
        return y.copy_(bias.expand(m, n) if bias is not None else torch.zeros_like(y))
    block_n, block_k, warps, stages = config or pick_config(m, n, k)
    even = n % block_n == 0 and k % block_k == 0
    blocked = w_scale is not None and w_scale.dim() == 2
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, w_scale if w_scale is not None else x, bias if bias is not None else x, y,
        n, k, x.stride(0), w.stride(0), y.stride(0), w_scale.stride(0) if blocked else 0,
        M=m, HAS_SCALE=w_scale is not None, HAS_BIAS=bias is not None, EVEN=even, BLOCK_N=block_n, BLOCK_K=block_k,
        AHEAD2=m == 1 and k > block_k, SCALE_K=scale_block_k(k, w_scale.shape[1]) if blocked else 0,
        num_warps=warps, num_stages=stages, **pdl.options(x),
    )
    return y


def _check_normed(n: NormedInput | torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  out_dtype: torch.dtype | None, w_scale: torch.Tensor | None, act: str | None) -> None:
    # a NormedInput, or a plain x with an act: one non-empty row either way
    if isinstance(n, NormedInput):
        n.check()
        x = n.x
    elif isinstance(n, torch.Tensor):
        x = n
    else:
        raise ValueError("x must be a torch.Tensor or a NormedInput")
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] == 0:
        what = "a NormedInput GEMV" if isinstance(n, NormedInput) else "gemv with an act"
        raise ValueError(f"{what} takes one non-empty row of x, got {tuple(x.shape)}")
    _check(x, w, bias, out_dtype, w_scale)
    if act not in (None, "silu"):
        raise ValueError(f"act must be None or 'silu', got {act!r}")
    if act and w.shape[0] % 2:
        raise ValueError(f"act 'silu' needs gate and up rows, an even N, got {w.shape[0]}")


def _gemv_normed(n: NormedInput | torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype | None, config: tuple[int, int, int, int] | None, w_scale: torch.Tensor | None,
                 act: str | None) -> torch.Tensor:
    # _gemv_normed_kernel: a NormedInput (with or without act), or one plain row with act (NORM off)
    _check_normed(n, w, bias, out_dtype, w_scale, act)
    norm = n if isinstance(n, NormedInput) else None
    x = norm.x if norm is not None else n
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use gemv_ref on CPU")
    k = x.shape[1]
    rows = w.shape[0]
    n_out = rows // 2 if act else rows
    y = torch.empty((1, n_out), dtype=out_dtype or x.dtype, device=x.device)
    block_n, block_k, warps, stages = config or pick_config(1, rows, k)
    if act:  # gate and up rows: the rows a program streams stay a plain GEMV's
        block_n = max(1, block_n // 2)
    blocked = w_scale is not None and w_scale.dim() == 2
    residual = norm.residual if norm is not None else None
    residual_out = norm.residual_out if norm is not None else None
    _gemv_normed_kernel[(triton.cdiv(n_out, block_n),)](
        x, residual if residual is not None else x, norm.weight if norm is not None else x,
        residual_out if residual_out is not None else x, w,
        w_scale if w_scale is not None else x, bias if bias is not None else x, y,
        n_out, k, float(norm.eps) if norm is not None else 0.0, n_out if act else 0, w.stride(0),
        w_scale.stride(0) if blocked else 0,
        RESIDUAL=residual is not None, SILU=act is not None, HAS_SCALE=w_scale is not None, HAS_BIAS=bias is not None,
        EVEN=n_out % block_n == 0 and k % block_k == 0, BLOCK_N=block_n, BLOCK_K=block_k, AHEAD2=k > block_k,
        SCALE_K=scale_block_k(k, w_scale.shape[1]) if blocked else 0, NORM=norm is not None, num_warps=warps,
        num_stages=stages, **pdl.options(x),
    )
    return y


def gemv_ref(x: torch.Tensor | NormedInput, w: torch.Tensor, bias: torch.Tensor | None = None, *,
             out_dtype: torch.dtype | None = None, config: tuple[int, int, int, int] | None = None,
             w_scale: torch.Tensor | None = None, act: str | None = None) -> torch.Tensor:
    """Pure-torch reference with the same signature: fp32 math, rounded once (a NormedInput
    normalised store_k, as rmsnorm_ref rounds it)."""
    if isinstance(x, NormedInput) or act is not None:
        _check_normed(x, w, bias, out_dtype, w_scale, act)
    if isinstance(x, NormedInput):
        x = normed_input_ref(x)
    _check(x, w, bias, out_dtype, w_scale)
    if w_scale is not None and w_scale.dim() == 2:
        y = x.float() @ dequantize_blocks(w, w_scale).T
    else:
        y = x.float() @ w.float().T
        if w_scale is not None:
            y = y * w_scale[None, :]
    if bias is not None:
        y = y + bias.float()
    if act:
        gate, up = y.chunk(2, dim=1)
        y = torch.nn.functional.silu(gate) * up
    return y.to(out_dtype or x.dtype)

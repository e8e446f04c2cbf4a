"""Skinny matmul for decode batches: ``y = x @ w.T (+ bias)`` with ``x: [M, K]`` for a few
dozen to a few hundred rows and ``w: [N, K]`` (an ``nn.Linear`` weight).

At decode a step's matmuls read every weight once and multiply it by only ``M`` tokens, so
up to ``M`` ~ 128 on an H200 they are limited by how fast ``w`` streams from memory, not by
the tensor cores. The kernel is a plain tiled GEMM arranged for that:

- ``x`` is the small operand. With ``SWAP`` the weight tile is the left operand of
  ``tl.dot`` (``[BLOCK_N, BLOCK_K] @ [BLOCK_K, BLOCK_M]``): the MMA's wide dimension is filled
  by weight rows instead of by a handful of padded tokens.
- Programs that share a weight tile (several M blocks) are launched next to each other, so
  the second read of the tile comes from L2; the weight is loaded with an evict-first hint.
- Shapes with few output tiles (``N = 4096`` with ``K = 14336``) split K over ``SPLIT_K``
  programs that write fp32 partials; one small kernel sums them, adds the bias and rounds.

``matmul_ref`` is ``torch.nn.functional.linear`` in fp32, rounded to the output dtype.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = ["Config", "matmul", "matmul_ref", "pick_config"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Config(NamedTuple):
    block_n: int
    block_k: int
    split_k: int
    swap: bool
    num_warps: int
    num_stages: int


@triton.jit
def _matmul_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_ym, stride_ys,
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, SWAP: tl.constexpr, F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # F32: multiply in fp32 ieee (fp32 inputs; bf16 under the interpreter)
    # grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K); axis 0 (M blocks) varies fastest
    # so the programs reading one weight tile run together. With SPLIT_K > 1 the program
    # writes its fp32 partial to y[pid_s] (a [SPLIT_K, M, N] workspace) without the bias.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mmask = rm < M
    nmask = rn < N
    k_lo = pid_s * k_per_split
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + (k_lo + rk)[None, :]
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + (k_lo + rk)[None, :]
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        if EVEN:
            x = tl.load(x_ptrs, mask=mmask[:, None], other=0.0)
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            kmask = (k_lo + k0 + rk < K) & (k0 + rk < k_per_split)
            x = tl.load(x_ptrs, mask=mmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=nmask[:, None] & kmask[None, :], other=0.0,
                        eviction_policy="evict_first")
        if F32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
            if SWAP:
                acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            if SWAP:
                acc = tl.dot(w, tl.trans(x), acc)
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        if SWAP:
            acc += bias[:, None]
        else:
            acc += bias[None, :]
    y_base = y_ptr + pid_s.to(tl.int64) * stride_ys
    if SWAP:
        y_ptrs = y_base + rm.to(tl.int64)[None, :] * stride_ym + rn[:, None]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=nmask[:, None] & mmask[None, :])
    else:
        y_ptrs = y_base + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _split_sum_kernel(ws_ptr, b_ptr, y_ptr, N, total, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr):
    # y.flat[i] = sum_s ws[s].flat[i] (+ bias[i % N]), rounded to y's dtype; ws is [SPLIT_K, M*N]
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * total + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def block_m(m: int) -> int:
    """Rows of x per program: the batch rounded up to a power of two (tl.dot needs >= 16),
    at most 128 (bigger batches take several M blocks that share each weight tile via L2)."""
    return min(max(16, triton.next_power_of_2(m)), 128)


def pick_config(m: int, n: int, k: int) -> Config:
    """The config for an [m, k] x [n, k]^T product.

    Weight rows on the MMA's wide side (swap) with 64 x 128 weight tiles streams best for
    decode batches; a long K over few output tiles (llama3-8b's down projection) is split so
    that every SM has work. See benchmarks/bench_gemv.py --m for the sweep behind it."""
    tiles = triton.cdiv(n, 64) * triton.cdiv(m, block_m(m))
    split = 1
    while tiles * split < 264 and k // (split * 2) >= 1024:
        split *= 2
    return Config(block_n=64, block_k=128, split_k=split, swap=True, num_warps=4, num_stages=4)


def _check(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None) -> None:
    for name, t in (("x", x), ("w", w)) + ((("bias", bias),) if bias is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name} must be fp32/fp16/bf16, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"need x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError("x must have a unit last stride and w must be contiguous")
    if w.dtype != x.dtype:
        raise ValueError(f"w ({w.dtype}) must have x's dtype ({x.dtype})")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"bias must be [N={w.shape[0]}], got {tuple(bias.shape)}")
    if out_dtype is not None and out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype must be fp32/fp16/bf16, got {out_dtype}")


def _check_config(cfg: Config) -> None:
    for name in ("block_n", "block_k", "split_k"):
        v = getattr(cfg, name)
        if v < 1 or v & (v - 1):
            raise ValueError(f"config {name} must be a power of two, got {v}")
    if cfg.block_n < 16 or cfg.block_k < 16:
        raise ValueError(f"config block_n and block_k must be >= 16, got {cfg.block_n}, {cfg.block_k}")


def matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype | None = None, config: Config | None = None) -> torch.Tensor:
    """``x [M, K] @ w[N, K].T (+ bias)`` -> ``[M, N]`` in ``out_dtype`` (default x's)."""
    _check(x, w, bias, out_dtype)
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use matmul_ref on CPU")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.copy_(bias.expand(m, n) if bias is not None else torch.zeros_like(y))
    cfg = Config(*config) if config is not None else pick_config(m, n, k)
    _check_config(cfg)
    bm = block_m(m)
    split = min(cfg.split_k, triton.cdiv(k, cfg.block_k))
    k_per_split = triton.cdiv(triton.cdiv(k, split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)
    even = n % cfg.block_n == 0 and k % k_per_split == 0
    ws = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _matmul_kernel[(triton.cdiv(m, bm), triton.cdiv(n, cfg.block_n), split)](
        x, w, bias if bias is not None else w, ws,
        m, n, k, k_per_split,
        x.stride(0), w.stride(0), n, m * n,
        HAS_BIAS=bias is not None and split == 1, EVEN=even, SWAP=bool(cfg.swap),
        # fp32 operands multiply in full fp32 (not tf32); so does bf16 under the interpreter,
        # whose bf16 tl.dot is wrong (see kv_store.dot_operand_dtype)
        F32=x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and x.device.type != "cuda"),
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split > 1:
        total = m * n
        _split_sum_kernel[(triton.cdiv(total, 1024),)](
            ws, bias if bias is not None else ws, y, n, total,
            SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK=1024, num_warps=4,
        )
    return y


def matmul_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
               out_dtype: torch.dtype | None = None, config: Config | None = None) -> torch.Tensor:
    """Pure-torch reference with the same signature: fp32 math, rounded once."""
    _check(x, w, bias, out_dtype)
    y = x.float() @ w.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)

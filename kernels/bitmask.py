"""Apply a grammar token bitmask to logits in place.

Layout: ``bitmask: [B, W]`` int32 with ``W = ceil(V / 32)``; token ``t`` is allowed when bit
``t % 32`` of word ``t // 32`` is set (bit 0 = least significant). Disallowed logits become
``-inf``. ``rows: [R]`` int32 (optional) lists the rows to mask, so a batch where only a few
requests have a grammar pays only for those rows.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["apply_token_bitmask", "apply_token_bitmask_ref", "unpack_bitmask"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _bitmask_kernel(
    logits_ptr, bitmask_ptr, rows_ptr,
    vocab,
    stride_logits, stride_mask,
    HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    # grid: (R, cdiv(V, BLOCK)); program (i, j) masks block j of row rows[i] (or row i).
    if HAS_ROWS:
        row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = offs < vocab
    word = tl.load(bitmask_ptr + row * stride_mask + offs // 32, mask=in_vocab, other=-1)
    allowed = ((word >> (offs % 32)) & 1) != 0
    # Only disallowed positions are written: allowed logits are never touched.
    tl.store(logits_ptr + row * stride_logits + offs, float("-inf"), mask=in_vocab & ~allowed)


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits must be a [B, V] tensor, got {getattr(logits, 'shape', type(logits))}")
    if logits.dtype not in _DTYPES:
        raise ValueError(f"logits must be fp32/fp16/bf16, got {logits.dtype}")
    if not logits.is_contiguous():
        raise ValueError("logits must be contiguous")
    B, V = logits.shape
    W = (V + 31) // 32
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be an int32 tensor, got {getattr(bitmask, 'dtype', type(bitmask))}")
    if tuple(bitmask.shape) != (B, W):
        raise ValueError(f"bitmask must be [B={B}, ceil(V/32)={W}], got {tuple(bitmask.shape)}")
    if not bitmask.is_contiguous():
        raise ValueError("bitmask must be contiguous")
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device} but logits is on {logits.device}")
    if rows is not None:
        if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int32 or rows.dim() != 1:
            raise ValueError(f"rows must be a 1-D int32 tensor, got {getattr(rows, 'dtype', type(rows))}")
        if not rows.is_contiguous():
            raise ValueError("rows must be contiguous")
        if rows.device != logits.device:
            raise ValueError(f"rows is on {rows.device} but logits is on {logits.device}")


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Set disallowed logits to -inf in place (Triton).

    ``logits: [B, V]`` fp32/bf16/fp16, ``bitmask: [B, ceil(V/32)]`` int32,
    ``rows: [R]`` int32 row indices into ``B`` (None = all rows). Row indices must be in
    range (not checked: that would need a host sync).
    """
    _check(logits, bitmask, rows)
    if logits.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"logits must be on a CUDA device (got {logits.device}); use apply_token_bitmask_ref on CPU")
    B, V = logits.shape
    n_rows = B if rows is None else rows.shape[0]
    if n_rows == 0 or V == 0:
        return
    block = min(4096, triton.next_power_of_2(V))
    _bitmask_kernel[(n_rows, triton.cdiv(V, block))](
        logits, bitmask, rows if rows is not None else bitmask,
        V,
        logits.stride(0), bitmask.stride(0),
        HAS_ROWS=rows is not None, BLOCK=block, num_warps=4,
    )


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[B, W]`` int32 -> ``[B, vocab]`` bool, True = allowed (pure torch, any device)."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [B, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Pure-torch reference of :func:`apply_token_bitmask` (in place, any device)."""
    _check(logits, bitmask, rows)
    V = logits.shape[1]
    if rows is None:
        logits.masked_fill_(~unpack_bitmask(bitmask, V), float("-inf"))
        return
    idx = rows.long()
    sub = logits[idx]
    sub.masked_fill_(~unpack_bitmask(bitmask[idx], V), float("-inf"))
    logits[idx] = sub

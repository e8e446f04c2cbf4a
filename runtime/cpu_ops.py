"""The per-layer ops of a float32 CPU forward in one C pass each (`cpu_ops.c`, built with the
quantized matmuls by `cpu_quant.library()`).

At batch 1 a SmolLM2 decode step spent more time dispatching the pure-torch references'
tiny tensor ops (5-10 each: casts, pow, mean, rsqrt, cat, index_select, softmax) than in its
matmuls: 14 of 35 ms in attention, norms, RoPE and SiLU on one thread. `models/ops.py` and the
torch attention backend call these where `usable(...)` holds (float32, CPU, the layouts
below, the library built) and their `*_ref` otherwise; the tests compare the two.
"""
from __future__ import annotations

import torch

from treadle.runtime import cpu_quant

_lib = None
_tried = False


def lib():
    """The compiled library, or None (no compiler: callers keep the references)."""
    global _lib, _tried
    if not _tried:
        _lib = cpu_quant.library()
        _tried = True
    return _lib


def usable(*tensors: torch.Tensor) -> bool:
    """float32 CPU tensors and a built library (first call may compile it, ~1 s)."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and not torch.is_grad_enabled() and lib() is not None)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    h = x.shape[-1]
    lib().cpu_rmsnorm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // h, h, eps)
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual += x; x = rmsnorm(residual) * weight. x, residual contiguous."""
    assert x.is_contiguous() and residual.is_contiguous() and x.shape == residual.shape
    h = x.shape[-1]
    lib().cpu_fused_add_rmsnorm(x.data_ptr(), residual.data_ptr(), weight.contiguous().data_ptr(),
                                x.numel() // h, h, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    t, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(t, inter, dtype=x.dtype)
    lib().cpu_silu_and_mul(x.data_ptr(), out.data_ptr(), t, inter)
    return out


def rope_layout_ok(q: torch.Tensor, k: torch.Tensor) -> bool:
    """q [T, Hq, D], k [T, Hk, D] with heads contiguous in a row (views of the qkv output are)."""
    return all(x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2] for x in (q, k))


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    """In place, as kernels.rope.apply_rope_ref."""
    pos = positions.to(torch.int64).contiguous()
    cs = cos_sin.contiguous()
    assert cs.shape[1] == q.shape[2]  # positions < cs.shape[0]: the scheduler keeps them in the context
    lib().cpu_rope(q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(), k.stride(0), k.shape[1], q.shape[0],
                   q.shape[2], pos.data_ptr(), cs.data_ptr())


def decode_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor,
                     req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                     sm_scale: float) -> None:
    """As kernels.decode_attention.decode_attention_ref (writes o [B, Hq, D])."""
    b, hq, d = q.shape
    assert q.stride(2) == 1 and q.stride(1) == d and o.is_contiguous()
    assert k_buffer.is_contiguous() and v_buffer.is_contiguous() and req_to_token.dtype == torch.int32
    assert req_to_token.is_contiguous()
    rows = req_pool_indices.to(torch.int64).contiguous()
    lens = seq_lens.to(torch.int64).contiguous()
    lib().cpu_decode_attention(q.data_ptr(), q.stride(0), k_buffer.data_ptr(), v_buffer.data_ptr(), o.data_ptr(),
                               req_to_token.data_ptr(), req_to_token.shape[1], rows.data_ptr(), lens.data_ptr(),
                               b, hq, k_buffer.shape[1], d, sm_scale, torch.get_num_threads())

"""Elementwise ops for the model: the Triton kernel on CUDA, its pure-torch `*_ref` elsewhere.
Chosen per call from the tensor's device, so importing this works on any machine."""
from __future__ import annotations

import torch

from treadle.kernels import activation, rmsnorm as rmsnorm_k, rope


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda:
        return rmsnorm_k.rmsnorm(x, weight, eps)
    return rmsnorm_k.rmsnorm_ref(x, weight, eps)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual += x; x = rmsnorm(residual)."""
    if x.is_cuda:
        rmsnorm_k.fused_add_rmsnorm(x, residual, weight, eps)
    else:
        rmsnorm_k.fused_add_rmsnorm_ref(x, residual, weight, eps)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    if q.is_cuda:
        rope.apply_rope(q, k, positions, cos_sin)
    else:
        rope.apply_rope_ref(q, k, positions, cos_sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        return activation.silu_and_mul(x)
    return activation.silu_and_mul_ref(x)


build_cos_sin_cache = rope.build_cos_sin_cache

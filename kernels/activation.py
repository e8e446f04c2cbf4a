"""SiLU-and-multiply (the SwiGLU gate of Llama-style MLPs).

``silu_and_mul(x)`` with ``x: [T, 2I]`` returns ``silu(x[:, :I]) * x[:, I:]`` as ``[T, I]``.
The kernel computes in fp32 and rounds once to the input dtype.

With ``quant=ActQuant(...)`` it returns the product quantized per token for an FP8 linear (an
``Fp8Act``, kernels/fp8_quant.py; Llama's down projection) instead: one program a row, two
passes over the row's gate/up (amax, then quantize; the second reads them back from cache),
the bf16 product never written. Rounded to x's dtype first, so bit for bit ``per_token_quant``
of the unfused output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl
from treadle.kernels.fp8_quant import (
    ActQuant, Fp8Act, check_quant, empty_act, interpreting, per_token_quant_ref, quantize, token_scale,
)

__all__ = ["silu_and_mul", "silu_and_mul_ref"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr,
    inter,
    stride_x, stride_out,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (T, cdiv(I, BLOCK)); one program = one block of one token's gate/up halves.
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_block(x_ptr, row, offs, mask, inter, stride_x):
    # silu(gate) * up over one block of a row, rounded to x's dtype, in fp32
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    return (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _silu_and_mul_quant_kernel(
    x_ptr, q_ptr, s_ptr,
    inter, scale_ub,
    stride_x, stride_q,
    HAS_UB: tl.constexpr, GRID_ROUND: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (T,); one program = one token's row: its amax, then the quantized row
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    amax = tl.zeros([BLOCK], tl.float32)
    for i0 in range(0, inter, BLOCK):
        y = _silu_mul_block(x_ptr, row, i0 + cols, i0 + cols < inter, inter, stride_x)
        amax = tl.maximum(amax, tl.abs(y))
    scale = token_scale(tl.max(amax, axis=0), scale_ub, HAS_UB)
    tl.store(s_ptr + row, scale)
    for i0 in range(0, inter, BLOCK):
        y = _silu_mul_block(x_ptr, row, i0 + cols, i0 + cols < inter, inter, stride_x)
        tl.store(q_ptr + row * stride_q + i0 + cols, quantize(y, scale, GRID_ROUND).to(q_ptr.dtype.element_ty),
                 mask=i0 + cols < inter)


def _check(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError("x must be a torch.Tensor")
    if x.dim() != 2 or x.shape[1] % 2 != 0:
        raise ValueError(f"x must be [T, 2*I] with an even last dim, got {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x must be fp32/fp16/bf16, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")


def silu_and_mul(x: torch.Tensor, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """``x: [T, 2I]`` -> ``[T, I]`` = ``silu(x[:, :I]) * x[:, I:]`` (Triton), or its per-token FP8
    quantization with ``quant``."""
    _check(x)
    check_quant(quant)
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use silu_and_mul_ref on CPU")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    if quant is not None:
        act = empty_act(num_tokens, inter, x.device, x.dtype)
        if num_tokens and inter:
            _silu_and_mul_quant_kernel[(num_tokens,)](
                x, act.q, act.scale, inter, float(quant.scale_ub or 0.0), x.stride(0), act.q.stride(0),
                HAS_UB=quant.scale_ub is not None, GRID_ROUND=interpreting(),
                BLOCK=min(2048, triton.next_power_of_2(inter)), num_warps=8, **pdl.options(x))
        return act
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    grid = (num_tokens, triton.cdiv(inter, block))
    _silu_and_mul_kernel[grid](x, out, inter, x.stride(0), out.stride(0), BLOCK=block, num_warps=4, **pdl.options(x))
    return out


def silu_and_mul_ref(x: torch.Tensor, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """Pure-torch reference with the same signature (any device): fp32 math, cast back."""
    _check(x)
    check_quant(quant)
    inter = x.shape[1] // 2
    xf = x.float()
    y = (torch.nn.functional.silu(xf[:, :inter]) * xf[:, inter:]).to(x.dtype)
    return y if quant is None else Fp8Act(*per_token_quant_ref(y, quant.scale_ub), y.dtype)

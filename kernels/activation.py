"""SiLU-and-multiply (the SwiGLU gate of Llama-style MLPs).

``silu_and_mul(x)`` with ``x: [T, 2I]`` returns ``silu(x[:, :I]) * x[:, I:]`` as ``[T, I]``.
The kernel computes in fp32 and rounds once to the input dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl

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


def _check(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError("x must be a torch.Tensor")
    if x.dim() != 2 or x.shape[1] % 2 != 0:
        raise ValueError(f"x must be [T, 2*I] with an even last dim, got {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x must be fp32/fp16/bf16, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x: [T, 2I]`` -> ``[T, I]`` = ``silu(x[:, :I]) * x[:, I:]`` (Triton)."""
    _check(x)
    if x.device.type != "cuda" and not _interpreting():
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use silu_and_mul_ref on CPU")
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    grid = (num_tokens, triton.cdiv(inter, block))
    _silu_and_mul_kernel[grid](x, out, inter, x.stride(0), out.stride(0), BLOCK=block, num_warps=4, **pdl.options(x))
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Pure-torch reference with the same signature (any device): fp32 math, cast back."""
    _check(x)
    inter = x.shape[1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[:, :inter]) * xf[:, inter:]).to(x.dtype)


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"

"""RMSNorm and fused residual-add + RMSNorm.

``rmsnorm(x, w, eps)``: ``y = (x / sqrt(mean(x^2) + eps)).to(x.dtype) * w`` row-wise over
``x: [T, H]``. Like HF ``LlamaRMSNorm``, the normalisation runs in fp32, the result is
rounded to ``x.dtype`` and then multiplied by the weight (so bf16 matches HF bit for bit in
the common case). ``fused_add_rmsnorm(x, residual, w, eps)`` is in place:
``residual += x`` then ``x = rmsnorm(residual)`` (the pre-norm decoder-layer pattern).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl

__all__ = ["rmsnorm", "fused_add_rmsnorm", "rmsnorm_ref", "fused_add_rmsnorm_ref"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr,
    hidden, eps,
    stride_x, stride_res, stride_out,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (T,); one program normalises one row of H <= BLOCK elements held in registers.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait (kernels/pdl.py)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0)
        # residual is stored in its own dtype, as the unfused `residual = residual + x` would.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_res + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    y = (xf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> None:
    for name, t in (("x", x), ("weight", weight)) + ((("residual", residual),) if residual is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name} must be fp32/fp16/bf16, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got {tuple(x.shape)}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"weight must be [H={x.shape[1]}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x ({tuple(x.shape)}, {x.dtype}), got {tuple(residual.shape)}, {residual.dtype}")
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"eps must be a positive float, got {eps!r}")


def _check_device(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"x must be on a CUDA device (got {x.device}); use the *_ref functions on CPU")


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block = triton.next_power_of_2(hidden)
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    res = residual if residual is not None else x
    _rmsnorm_kernel[(num_tokens,)](
        x, res, weight, out,
        hidden, float(eps),
        x.stride(0), res.stride(0), out.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps, **pdl.options(x),
    )


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [T, H]``, ``weight: [H]`` -> new ``[T, H]`` tensor in ``x.dtype`` (Triton)."""
    _check(x, weight, eps)
    _check_device(x)
    out = torch.empty_like(x)
    _launch(x, None, weight, out, eps)
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: ``residual += x`` then ``x[:] = rmsnorm(residual)``; both ``[T, H]`` (Triton)."""
    _check(x, weight, eps, residual)
    _check_device(x)
    _launch(x, residual, weight, x, eps)


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Pure-torch reference (any device), same signature and rounding order as the kernel."""
    _check(x, weight, eps)
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (y.float() * weight.float()).to(x.dtype)


def fused_add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """Pure-torch reference of :func:`fused_add_rmsnorm` (in place, any device)."""
    _check(x, weight, eps, residual)
    residual.copy_((residual.float() + x.float()).to(residual.dtype))
    x.copy_(rmsnorm_ref(residual, weight, eps))

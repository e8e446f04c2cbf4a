"""RMSNorm and fused residual-add + RMSNorm.

``rmsnorm(x, w, eps)``: ``y = (x / sqrt(mean(x^2) + eps)).to(x.dtype) * w`` row-wise over
``x: [T, H]``. Like HF ``LlamaRMSNorm``, the normalisation runs in fp32, the result is
rounded to ``x.dtype`` and then multiplied by the weight (so bf16 matches HF bit for bit in
the common case). ``fused_add_rmsnorm(x, residual, w, eps)`` is in place:
``residual += x`` then ``x = rmsnorm(residual)`` (the pre-norm decoder-layer pattern).

Both take ``quant=ActQuant(...)`` to return the normed rows quantized per token for an FP8
linear (an ``Fp8Act``, kernels/fp8_quant.py) instead of writing them in ``x.dtype``: the row is
in registers already, so its amax costs no second read. The values are rounded to x's dtype
first, so the result is bit for bit ``per_token_quant`` of the unfused output.

``NormedInput`` is a norm left to the kernel that reads its output (batch-1 decode on the GPU:
the GEMV of kernels/gemv.py, the MoE router of kernels/fused_moe.py): that kernel adds the
residual and accumulates the sum of squares as it loads x, and scales its sums by the
reciprocal root at the end, so the norm costs no launch of its own. ``normed_input_ref``
computes what it stands for.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl
from treadle.kernels.fp8_quant import (
    ActQuant, Fp8Act, check_quant, empty_act, interpreting, per_token_quant_ref, quantize, token_scale,
)

__all__ = ["rmsnorm", "fused_add_rmsnorm", "rmsnorm_ref", "fused_add_rmsnorm_ref", "NormedInput", "normed_input_ref"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, q_ptr, s_ptr,
    hidden, eps, scale_ub,
    stride_x, stride_res, stride_out, stride_q,
    HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr, HAS_UB: tl.constexpr, GRID_ROUND: tl.constexpr,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
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
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    if QUANT:  # per token, of y as rounded to x's dtype (kernels/fp8_quant.py)
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
        scale = token_scale(tl.max(tl.abs(y), axis=0), scale_ub, HAS_UB)
        tl.store(s_ptr + row, scale)
        tl.store(q_ptr + row * stride_q + offs, quantize(y, scale, GRID_ROUND).to(q_ptr.dtype.element_ty), mask=mask)
    else:
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


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor, eps: float,
            act: Fp8Act | None = None, scale_ub: float | None = None) -> None:
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block = triton.next_power_of_2(hidden)
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    res = residual if residual is not None else x
    q, s = (act.q, act.scale) if act is not None else (out, out)
    _rmsnorm_kernel[(num_tokens,)](
        x, res, weight, out, q, s,
        hidden, float(eps), float(scale_ub or 0.0),
        x.stride(0), res.stride(0), out.stride(0), q.stride(0),
        HAS_RESIDUAL=residual is not None, QUANT=act is not None, HAS_UB=scale_ub is not None,
        GRID_ROUND=interpreting(), BLOCK=block, num_warps=warps, **pdl.options(x),
    )


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """``x: [T, H]``, ``weight: [H]`` -> new ``[T, H]`` tensor in ``x.dtype``, or its per-token FP8
    quantization with ``quant`` (Triton)."""
    _check(x, weight, eps)
    check_quant(quant)
    _check_device(x)
    if quant is not None:
        act = empty_act(*x.shape, x.device, x.dtype)
        _launch(x, None, weight, x, eps, act, quant.scale_ub)
        return act
    out = torch.empty_like(x)
    _launch(x, None, weight, out, eps)
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """In place: ``residual += x`` then ``x[:] = rmsnorm(residual)``; both ``[T, H]`` (Triton).
    Returns x, or with ``quant`` the normed rows quantized per token (x is then left as it was)."""
    _check(x, weight, eps, residual)
    check_quant(quant)
    _check_device(x)
    if quant is not None:
        act = empty_act(*x.shape, x.device, x.dtype)
        _launch(x, residual, weight, x, eps, act, quant.scale_ub)
        return act
    _launch(x, residual, weight, x, eps)
    return x


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """Pure-torch reference (any device), same signature and rounding order as the kernel."""
    _check(x, weight, eps)
    check_quant(quant)
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = (y.float() * weight.float()).to(x.dtype)
    return y if quant is None else Fp8Act(*per_token_quant_ref(y, quant.scale_ub), y.dtype)


def fused_add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                          quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """Pure-torch reference of :func:`fused_add_rmsnorm` (in place, any device)."""
    _check(x, weight, eps, residual)
    residual.copy_((residual.float() + x.float()).to(residual.dtype))
    if quant is not None:
        return rmsnorm_ref(residual, weight, eps, quant)
    x.copy_(rmsnorm_ref(residual, weight, eps))
    return x


class NormedInput(NamedTuple):
    """``rmsnorm(x + residual) * weight`` not computed yet: the kernel reading it normalises as it
    loads. ``residual`` None: the norm of x alone. With a residual, the consumer also writes
    ``x + residual`` (rounded to x's dtype, as ``fused_add_rmsnorm`` leaves it) into
    ``residual_out``, a tensor of its own (the consumer's programs all read ``residual``): the
    residual stream from there on. x, residual and residual_out are [T, H], weight [H]."""
    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None = None
    residual_out: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def is_cuda(self) -> bool:
        return self.x.is_cuda

    def check(self) -> None:
        """ValueError unless the parts fit: _check's rules, and residual_out like x, not aliasing
        residual or x."""
        _check(self.x, self.weight, self.eps, self.residual)
        if (self.residual is None) != (self.residual_out is None):
            raise ValueError("a NormedInput takes residual and residual_out together, or neither")
        out = self.residual_out
        if out is not None:
            if not isinstance(out, torch.Tensor) or out.shape != self.x.shape or out.dtype != self.x.dtype \
                    or not out.is_contiguous() or out.device != self.x.device:
                raise ValueError(f"residual_out must be a contiguous tensor like x ({tuple(self.x.shape)}, {self.x.dtype})")
            if out.data_ptr() in (self.x.data_ptr(), self.residual.data_ptr()):
                raise ValueError("residual_out must not share memory with x or residual")


def normed_input_ref(n: NormedInput) -> torch.Tensor:
    """What ``n`` stands for, in torch (any device): the normed rows [T, H] in x's dtype, rounded
    as ``rmsnorm_ref``; writes ``residual_out`` as the consumer would."""
    n.check()
    h = n.x
    if n.residual is not None:
        h = (n.residual.float() + n.x.float()).to(n.x.dtype)
        n.residual_out.copy_(h)
    return rmsnorm_ref(h, n.weight, n.eps)

"""Per-token FP8 quantization of activations, the input side of the W8A8 linear (kernels/fp8_linear.py).

``x [M, K]`` -> ``xq [M, K]`` float8_e4m3fn and ``x_scale [M]`` fp32 with
``x_scale[m] = max(min(amax|x[m]|, scale_ub) / 448, 1e-12)`` and ``xq = clamp(x / x_scale, +-448)``.

Two ways to get there:
- ``per_token_quant``: its own launch over a finished activation (one program a row, two
  passes: amax, then quantize).
- inside the kernel that produces the activation: RMSNorm (kernels/rmsnorm.py) and SiLU-and-mul
  (kernels/activation.py) take ``quant=ActQuant(scale_ub)`` and return an ``Fp8Act`` instead of
  the bf16 tensor. They round the activation to its dtype first, as the unfused pair would, so
  the result is bit for bit ``per_token_quant`` of the unfused output, and the bf16 tensor is
  never written nor read back: at a 65,536-token prefill of llama3-8b that pass was 80 ms of
  1,027 (one H100, benchmarks/results/profile_fp8_bs128_h100.log).

A linear layer says which form it wants (``input_quant`` in runtime/models/parallel.py); the
FP8 linear takes either.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = ["FP8_DTYPE", "FP8_MAX", "ActQuant", "Fp8Act", "per_token_quant", "per_token_quant_ref"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
MIN_SCALE = 1e-12  # an all-zero row gets this scale (its values quantize to 0)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class ActQuant(NamedTuple):
    """A request to hand a linear layer its input quantized per token (a hint: a producer that
    cannot fuse it returns the plain tensor, which the layer also takes)."""
    scale_ub: float | None = None  # amax cap before the scale is taken (fbgemm_fp8's activation_scale_ub)


class Fp8Act(NamedTuple):
    """Activations quantized per token: ``q`` [M, K] float8_e4m3fn, ``scale`` [M] fp32, and the
    dtype they were computed in (the linear's output dtype)."""
    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype = torch.bfloat16

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def is_cuda(self) -> bool:
        return self.q.is_cuda

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.q.float() * self.scale[:, None]).to(dtype)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def round_to_e4m3_grid(v):
    # RTNE onto float8_e4m3fn's values, in fp32 (|v| <= 448): 3 mantissa bits for normals
    # (|v| >= 2^-6), a fixed 2^-9 step below. Only for the interpreter, whose fp8 cast rounds
    # up without carrying into the exponent (124.7 becomes 64, not 128): values already on the
    # grid cast exactly. The GPU's cvt.rn.satfinite rounds correctly by itself.
    bits = v.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = ((v * 512.0 + 12582912.0) - 12582912.0) / 512.0  # 1.5 * 2^23: fp32 addition rounds to an integer
    return tl.where(tl.abs(v) >= 0.015625, normal, sub)


@triton.jit
def token_scale(amax, scale_ub, HAS_UB: tl.constexpr):
    # one row's scale from its amax (fp32 scalar)
    if HAS_UB:
        amax = tl.minimum(amax, scale_ub)
    return tl.maximum(amax / 448.0, 1e-12)


@triton.jit
def quantize(x, scale, GRID_ROUND: tl.constexpr):
    # fp32 values over their row's scale, clamped and rounded: still fp32 (the caller casts to e4m3)
    q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
    if GRID_ROUND:
        q = round_to_e4m3_grid(q)
    return q


@triton.jit
def _per_token_quant_kernel(
    x_ptr, xq_ptr, s_ptr,
    K, scale_ub,
    stride_xm, stride_qm,
    HAS_UB: tl.constexpr, BLOCK_K: tl.constexpr, GRID_ROUND: tl.constexpr,
):
    # grid: (M,); one program = one token row
    m = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + m * stride_xm + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = token_scale(tl.max(amax, axis=0), scale_ub, HAS_UB)
    tl.store(s_ptr + m, scale)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + m * stride_xm + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        q = quantize(x, scale, GRID_ROUND)
        tl.store(xq_ptr + m * stride_qm + k0 + cols, q.to(xq_ptr.dtype.element_ty), mask=k0 + cols < K)


def check_quant(quant: ActQuant | None) -> None:
    """A producer's `quant` argument: an ActQuant or None."""
    if quant is not None and not isinstance(quant, ActQuant):
        raise ValueError(f"quant must be an ActQuant or None, got {type(quant).__name__}")


def check_x(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a [M, K] tensor")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x must be fp32/fp16/bf16, got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError("x must have a unit last stride")


def empty_act(m: int, k: int, device: torch.device, dtype: torch.dtype) -> Fp8Act:
    """Uninitialised outputs for a kernel that quantizes m rows of k values computed in dtype."""
    return Fp8Act(torch.empty((m, k), dtype=FP8_DTYPE, device=device),
                  torch.empty((m,), dtype=torch.float32, device=device), dtype)


def per_token_quant(x: torch.Tensor, scale_ub: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq [M, K] float8_e4m3fn, x_scale [M] fp32), amax clamped to scale_ub."""
    check_x(x)
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"tensors must be on a CUDA device (got {x.device}); use per_token_quant_ref on CPU")
    m, k = x.shape
    xq, scale, _ = empty_act(m, k, x.device, x.dtype)
    if m:
        block_k = min(1024, triton.next_power_of_2(max(k, 16)))
        _per_token_quant_kernel[(m,)](x, xq, scale, k, float(scale_ub or 0.0), x.stride(0), xq.stride(0),
                                      HAS_UB=scale_ub is not None, BLOCK_K=block_k,
                                      GRID_ROUND=interpreting(), num_warps=4)
    return xq, scale


def per_token_quant_ref(x: torch.Tensor, scale_ub: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch `per_token_quant` (any device)."""
    check_x(x)
    amax = x.float().abs().amax(dim=1) if x.shape[1] else x.new_zeros(x.shape[0], dtype=torch.float32)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub)
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    xq = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return xq, scale

"""FP8 linear: weight-only at decode (a few rows), W8A8 above: ``y = x @ (w_fp8 * w_scale).T (+ bias)``.

Shapes:
    x        [M, K]  fp32 / fp16 / bf16 activations
    w        [N, K]  float8_e4m3fn weight (an ``nn.Linear`` layout), row-major
    w_scale  [N]     fp32, one scale per output row (a per-tensor scale is expanded to rows)
    xq, x_scale      [M, K] float8_e4m3fn and [M] fp32: x's dynamic per-token quantization,
                     ``x_scale[m] = min(amax|x[m]|, scale_ub) / 448`` and ``xq = x / x_scale``

Three ops, each with a pure-torch ``*_ref`` of the same signature:
- ``per_token_quant``: one program per row, two passes over the row (amax, then quantize).
- ``fp8_gemv``: for a few rows (decode), weight-only: kernels/gemv.py's GEMV reading one
  byte an element, each output times its row's scale. cuBLAS's FP8 matmul is no faster than
  bf16 at these sizes (145 vs 139 us for M = 1 on the H200, issue #34), and quantizing x
  would cost a launch a linear, so decode takes this one.
- ``fp8_linear``: ``fp8_gemv`` for M <= GEMV_MAX_M rows, else quantize x and
  ``torch._scaled_mm`` with row-wise scales (cuBLAS FP8 tensor cores: 2,860 vs 5,080 us
  against bf16 at M = 8192). ``fp8_linear_ref`` does the same in fp32 torch
  (``fp8_gemv_ref`` / ``scaled_mm_ref``). ``Fp8Config`` names a launch (the GEMV's tile, or
  _scaled_mm) for benchmarks/bench_quant_linear.py --sweep.

A W8A8 Triton kernel for up to 16 rows (x quantized per token inside it, e4m3 ``tl.dot``) was
tried and removed: on an H100 it streamed the weights at 27-79% of the copy bandwidth against
this GEMV's 66-93% at one row, and matched _scaled_mm at 16 rows
(benchmarks/results/quant_linear_sweep_fp8_h100.json, commit 8c3a494).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from treadle.kernels.gemv import MAX_M as GEMV_MAX, gemv, gemv_ref
from treadle.kernels.gemv import pick_config as gemv_pick_config

__all__ = ["FP8_MAX", "FP8_DTYPE", "GEMV_MAX_M", "Fp8Config", "pick_config", "candidate_configs", "per_token_quant",
           "per_token_quant_ref",
           "fp8_gemv", "fp8_gemv_ref", "scaled_mm_ref", "fp8_linear", "fp8_linear_ref", "quantize_weight_ref"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
GEMV_MAX_M = 1  # (kernels/gemv.py takes up to 4 rows; at 4, 222 us against _scaled_mm's ~130 on the H200)
_MIN_SCALE = 1e-12  # an all-zero row gets this scale (its values quantize to 0)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _on_kernel_device(t: torch.Tensor, ref_name: str) -> None:
    if t.device.type != "cuda" and not _interpreting():
        raise ValueError(f"tensors must be on a CUDA device (got {t.device}); use {ref_name} on CPU")


# ------------------------------------------------------------------------- per-token quant

@triton.jit
def _round_to_e4m3_grid(v):
    # RTNE onto float8_e4m3fn's values, in fp32 (|v| <= 448): 3 mantissa bits for normals
    # (|v| >= 2^-6), a fixed 2^-9 step below. Only for the interpreter, whose fp8 cast rounds
    # up without carrying into the exponent (124.7 becomes 64, not 128): values already on the
    # grid cast exactly. The GPU's cvt.rn.satfinite rounds correctly by itself.
    bits = v.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = ((v * 512.0 + 12582912.0) - 12582912.0) / 512.0  # 1.5 * 2^23: fp32 addition rounds to an integer
    return tl.where(tl.abs(v) >= 0.015625, normal, sub)


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
    top = tl.max(amax, axis=0)
    if HAS_UB:
        top = tl.minimum(top, scale_ub)
    scale = tl.maximum(top / 448.0, 1e-12)
    tl.store(s_ptr + m, scale)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + m * stride_xm + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        if GRID_ROUND:
            q = _round_to_e4m3_grid(q)
        tl.store(xq_ptr + m * stride_qm + k0 + cols, q.to(xq_ptr.dtype.element_ty), mask=k0 + cols < K)


def _check_x(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a [M, K] tensor")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x must be fp32/fp16/bf16, got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError("x must have a unit last stride")


def per_token_quant(x: torch.Tensor, scale_ub: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq [M, K] float8_e4m3fn, x_scale [M] fp32), amax clamped to scale_ub."""
    _check_x(x)
    _on_kernel_device(x, "per_token_quant_ref")
    m, k = x.shape
    xq = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        block_k = min(1024, triton.next_power_of_2(max(k, 16)))
        _per_token_quant_kernel[(m,)](x, xq, scale, k, float(scale_ub or 0.0), x.stride(0), xq.stride(0),
                                      HAS_UB=scale_ub is not None, BLOCK_K=block_k,
                                      GRID_ROUND=_interpreting(), num_warps=4)
    return xq, scale


def per_token_quant_ref(x: torch.Tensor, scale_ub: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch `per_token_quant` (any device)."""
    _check_x(x)
    amax = x.float().abs().amax(dim=1) if x.shape[1] else x.new_zeros(x.shape[0], dtype=torch.float32)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub)
    scale = (amax / FP8_MAX).clamp(min=_MIN_SCALE)
    xq = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return xq, scale


def quantize_weight_ref(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] -> (float8_e4m3fn [N, K], per-row scale [N] fp32): quantizing at
    load (``--quantization fp8``) is the per-token quantization of the weight's rows."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"need a float [N, K] weight, got {tuple(w.shape)} {w.dtype}")
    return per_token_quant_ref(w.contiguous() if w.dtype in _DTYPES else w.float())


# ------------------------------------------------------------------------- GEMV

def _check_gemv(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype) -> None:
    """The W8A8 product's arguments: xq and w float8_e4m3fn, x_scale [M] and w_scale [N] fp32."""
    if xq.dtype != FP8_DTYPE or w.dtype != FP8_DTYPE:
        raise ValueError(f"xq and w must be float8_e4m3fn, got {xq.dtype} and {w.dtype}")
    if xq.dim() != 2 or w.dim() != 2 or xq.shape[1] != w.shape[1]:
        raise ValueError(f"need xq [M, K] and w [N, K], got {tuple(xq.shape)} and {tuple(w.shape)}")
    if x_scale.shape != (xq.shape[0],) or w_scale.shape != (w.shape[0],):
        raise ValueError(f"need x_scale [M] and w_scale [N], got {tuple(x_scale.shape)} and {tuple(w_scale.shape)}")
    if x_scale.dtype != torch.float32 or w_scale.dtype != torch.float32:
        raise ValueError("x_scale and w_scale must be fp32")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"bias must be [N={w.shape[0]}], got {tuple(bias.shape)}")
    if out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype must be fp32/fp16/bf16, got {out_dtype}")
    for name, t in (("x_scale", x_scale), ("w", w), ("w_scale", w_scale)) + ((("bias", bias),) if bias is not None else ()):
        if t.device != xq.device:
            raise ValueError(f"{name} is on {t.device} but xq is on {xq.device}")


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
             out_dtype: torch.dtype | None = None, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Decode (M <= GEMV_MAX_M rows): ``x @ (w * w_scale[:, None]).T (+ bias)`` with x as it is
    (weight-only FP8: at a few rows the cost is the weight's bytes, and quantizing x would be
    one more launch a linear for no speed). kernels/gemv.py's kernel, one byte an element."""
    _on_kernel_device(x, "fp8_gemv_ref")
    return gemv(x, w, bias, out_dtype=out_dtype, config=config, w_scale=w_scale)


def fp8_gemv_ref(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
                 out_dtype: torch.dtype | None = None, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Pure-torch `fp8_gemv`: w dequantized, fp32 matmul, rounded once."""
    return gemv_ref(x, w, bias, out_dtype=out_dtype, w_scale=w_scale)


def scaled_mm_ref(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                  bias: torch.Tensor | None = None, *, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The W8A8 product in torch: both sides dequantized to fp32, multiplied, rounded once."""
    _check_gemv(xq, x_scale, w, w_scale, bias, out_dtype)
    y = (xq.float() @ w.float().T) * x_scale[:, None] * w_scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


# ------------------------------------------------------------------------- launches

class Fp8Config(NamedTuple):
    """A launch of fp8_linear: ``path`` "gemv" (the weight-only GEMV with this tile: kernels/gemv.py's
    BLOCK_N, BLOCK_K, num_warps) or "scaled_mm" (per_token_quant + torch._scaled_mm)."""
    path: str
    block_n: int = 4
    block_k: int = 1024
    warps: int = 2


def pick_config(m: int, n: int, k: int) -> Fp8Config:
    """The GEMV up to GEMV_MAX_M rows with kernels/gemv.py's tile, _scaled_mm above."""
    if m > GEMV_MAX_M:
        return Fp8Config("scaled_mm")
    block_n, block_k, warps, _ = gemv_pick_config(m, n, k)
    return Fp8Config("gemv", block_n, block_k, warps)


def candidate_configs(m: int, n: int, k: int) -> list[Fp8Config]:
    """Launches worth timing for one shape (bench_quant_linear.py --sweep): GEMV tiles of 2-8 rows
    by 512-2048 columns on 2 or 4 warps (up to kernels/gemv.py's MAX_M rows), and _scaled_mm."""
    out = [Fp8Config("scaled_mm")]
    if m <= GEMV_MAX:
        out += [Fp8Config("gemv", bn, bk, w) for bn in (2, 4, 8) for bk in (512, 1024, 2048) for w in (2, 4)
                if bn * bk <= 8192]
    return out


# ------------------------------------------------------------------------- linear

def _check_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> None:
    _check_x(x)
    if w.dtype != FP8_DTYPE or w.dim() != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"w must be float8_e4m3fn [N, K={x.shape[1]}], got {w.dtype} {tuple(w.shape)}")


def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
               scale_ub: float | None = None, out_dtype: torch.dtype | None = None,
               config: Fp8Config | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N] in out_dtype (default x's), by `pick_config`'s launch unless given: for
    M <= GEMV_MAX_M the weight-only GEMV (x as it is), else x quantized per token (Triton) and
    torch._scaled_mm (K and N multiples of 16)."""
    _check_linear(x, w, w_scale)
    out_dtype = out_dtype or x.dtype
    cfg = config or pick_config(x.shape[0], w.shape[0], x.shape[1])
    if cfg.path == "gemv":
        return fp8_gemv(x, w, w_scale, bias, out_dtype=out_dtype, config=(cfg.block_n, cfg.block_k, cfg.warps, 1))
    if cfg.path != "scaled_mm":
        raise ValueError(f"unknown fp8 launch path {cfg.path!r} (gemv, scaled_mm)")
    xq, sx = per_token_quant(x, scale_ub)
    _check_gemv(xq, sx, w, w_scale, bias, out_dtype)
    if w.shape[0] % 16 or w.shape[1] % 16:
        raise ValueError(f"torch._scaled_mm needs N and K multiples of 16, got w {tuple(w.shape)}")
    # row-wise scales: a [M, 1] and b [1, N]; b = w.T is column-major as cuBLAS wants
    # (cuBLAS's row-wise scaled matmul writes bf16 only; the CPU's takes fp32)
    mm_dtype = torch.bfloat16 if xq.is_cuda else torch.float32
    y = torch._scaled_mm(xq, w.T, scale_a=sx[:, None], scale_b=w_scale[None, :], out_dtype=mm_dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(out_dtype)


def fp8_linear_ref(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
                   scale_ub: float | None = None, out_dtype: torch.dtype | None = None,
                   config: Fp8Config | None = None) -> torch.Tensor:
    """Pure-torch `fp8_linear` (same launch choice): for the GEMV w dequantized and x as it is,
    else x quantized per token; both sides dequantized, fp32 matmul."""
    _check_linear(x, w, w_scale)
    if (config or pick_config(x.shape[0], w.shape[0], x.shape[1])).path == "gemv":
        return fp8_gemv_ref(x, w, w_scale, bias, out_dtype=out_dtype or x.dtype)
    xq, sx = per_token_quant_ref(x, scale_ub)
    return scaled_mm_ref(xq, sx, w, w_scale, bias, out_dtype=out_dtype or x.dtype)

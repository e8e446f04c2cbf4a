"""FP8 linear, W8A8: ``y = x @ (w_fp8 * w_scale).T (+ bias)`` with x quantized per token.

Shapes:
    x        [M, K]  fp32 / fp16 / bf16 activations
    w        [N, K]  float8_e4m3fn weight (an ``nn.Linear`` layout), row-major
    w_scale  [N]     fp32, one scale per output row (a per-tensor scale is expanded to rows)
    xq, x_scale      [M, K] float8_e4m3fn and [M] fp32: x's dynamic per-token quantization,
                     ``x_scale[m] = min(amax|x[m]|, scale_ub) / 448`` and ``xq = x / x_scale``

Ops, each with a pure-torch ``*_ref`` of the same signature:
- ``per_token_quant``: one program per row, two passes over the row (amax, then quantize).
- ``fp8_tc``: for a few rows (decode, M <= TC_MAX_M), W8A8 on the tensor cores with x quantized
  per token inside the kernel: each program first takes the amax of its rows of x (x is tiny
  and sits in L2), then walks K quantizing each chunk of x to e4m3 on the fly and feeding
  ``tl.dot(xq, w.T)`` (mma e4m3, fp32 accumulate) with the weight tiles pipelined in. No
  element of the weight goes through the CUDA cores: the weight-only GEMV below converts
  every byte to fp32 (e4m3 -> f16 -> f32, two conversions an element on a unit that does 16
  a clock per SM) and could not stream more than ~3 TB/s of the H200's 4.2 for that alone.
  Its reference is the W8A8 product of ``per_token_quant_ref`` and ``scaled_mm_ref``.
- ``fp8_gemv``: weight-only, kernels/gemv.py's GEMV reading one byte an element (GPUs
  without FP8 tensor cores, below sm_89, and a config to compare against).
- ``fp8_linear``: ``fp8_tc`` for M <= TC_MAX_M rows, else quantize x and ``torch._scaled_mm``
  with row-wise scales (cuBLAS FP8 tensor cores: 2,860 vs 5,080 us against bf16 at M = 8192;
  at a few rows cuBLAS's FP8 is no faster than bf16, 145 vs 139 us at M = 1 on the H200,
  issue #34). ``fp8_linear_ref`` is the same W8A8 product in fp32 torch.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from treadle.kernels.gemv import gemv, gemv_ref
from treadle.kernels.gemv import pick_config as gemv_pick_config

__all__ = ["FP8_MAX", "FP8_DTYPE", "TC_MAX_M", "Fp8Config", "pick_config", "candidate_configs", "per_token_quant",
           "per_token_quant_ref", "fp8_tc", "fp8_gemv", "fp8_gemv_ref", "scaled_mm_ref", "fp8_linear", "fp8_linear_ref",
           "quantize_weight_ref"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
TC_MAX_M = 16  # rows of x fp8_tc takes: one 16-row tensor-core tile
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


# ------------------------------------------------------------------------- small M, tensor cores

class Fp8Config(NamedTuple):
    """How fp8_linear runs: ``path`` "tc" (fp8_tc), "gemv" (the weight-only fp8_gemv: block_n,
    block_k and warps are its tile) or "scaled_mm" (per_token_quant + torch._scaled_mm).
    ``swap`` puts the weight on the dot's left ([BLOCK_N, BLOCK_K] x [BLOCK_K, 16] rows of x),
    which lets Hopper use its warp-group MMA with the weight as the 64-row operand."""
    path: str = "tc"
    block_n: int = 32
    block_k: int = 256
    warps: int = 4
    stages: int = 4
    swap: bool = False


@triton.jit
def _rows_amax(x_ptr, ms, mmask, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # max |x[m, :]| of each of the program's rows (x is a few rows and stays in L2)
    cols = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_M], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + ms[:, None] * stride_xm + (k0 + cols)[None, :],
                    mask=mmask[:, None] & (k0 + cols < K)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=1))
    return amax


@triton.jit
def _fp8_tc_kernel(
    x_ptr, w_ptr, ws_ptr, b_ptr, y_ptr,
    M, N, K, scale_ub,
    stride_xm, stride_wn, stride_ym,
    HAS_UB: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, SWAP: tl.constexpr, EVEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # grid: (cdiv(N, BLOCK_N),); one program = BLOCK_N outputs of all M (<= BLOCK_M) rows
    ms = tl.arange(0, BLOCK_M)
    mmask = ms < M
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    ks = tl.arange(0, BLOCK_K)
    amax = _rows_amax(x_ptr, ms, mmask, K, stride_xm, BLOCK_M, BLOCK_K)
    if HAS_UB:
        amax = tl.minimum(amax, scale_ub)
    sx = tl.maximum(amax / 448.0, 1e-12)  # per_token_quant's scale
    x_ptrs = x_ptr + ms[:, None] * stride_xm + ks[None, :]
    w_ptrs = w_ptr + ns.to(tl.int64)[:, None] * stride_wn + ks[None, :]
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN:
            x = tl.load(x_ptrs, mask=mmask[:, None], other=0.0)
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            kmask = (k0 + ks < K)[None, :]
            x = tl.load(x_ptrs, mask=mmask[:, None] & kmask, other=0.0)
            w = tl.load(w_ptrs, mask=nmask[:, None] & kmask, other=0.0, eviction_policy="evict_first")
        q = tl.minimum(tl.maximum(x.to(tl.float32) / sx[:, None], -448.0), 448.0)
        if IEEE:  # the interpreter: no fp8 dot, and its fp8 cast rounds wrongly (see _round_to_e4m3_grid)
            q = _round_to_e4m3_grid(q)
            wf = w.to(tl.float32)
            if SWAP:
                acc += tl.dot(wf, tl.trans(q), input_precision="ieee")
            else:
                acc += tl.dot(q, tl.trans(wf), input_precision="ieee")
        else:
            q = q.to(w_ptr.dtype.element_ty)
            if SWAP:
                acc = tl.dot(w, tl.trans(q), acc)
            else:
                acc = tl.dot(q, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    ws = tl.load(ws_ptr + ns, mask=nmask, other=0.0)
    bias = tl.zeros([BLOCK_N], tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + ns, mask=nmask, other=0.0).to(tl.float32)
    if SWAP:  # acc[n, m]
        y = acc * ws[:, None] * sx[None, :] + bias[:, None]
        tl.store(y_ptr + ms[None, :] * stride_ym + ns[:, None], y.to(y_ptr.dtype.element_ty),
                 mask=nmask[:, None] & mmask[None, :])
    else:
        y = acc * sx[:, None] * ws[None, :] + bias[None, :]
        tl.store(y_ptr + ms[:, None] * stride_ym + ns[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=mmask[:, None] & nmask[None, :])


def _fp8_tensor_cores(dev: torch.device) -> bool:
    """FP8 mma needs sm_89 (Ada) or later; the interpreter runs the kernel's fp32 branch."""
    return dev.type == "cuda" and torch.cuda.get_device_capability(dev) >= (8, 9)


def pick_config(m: int, n: int, k: int, dev: torch.device | None = None) -> Fp8Config:
    """The launch for an [m, k] x [n, k]^T product. Up to TC_MAX_M rows: fp8_tc (the weight-only
    GEMV where FP8 tensor cores are missing), narrowing the column blocks until there are about
    two programs a multiprocessor (264 on the H200's 132); above: torch._scaled_mm."""
    if m > TC_MAX_M:
        return Fp8Config("scaled_mm")
    if dev is not None and dev.type == "cuda" and not _fp8_tensor_cores(dev):
        return Fp8Config("gemv", *_gemv_tile(m, n, k))
    block_n = 64
    while block_n > 16 and triton.cdiv(n, block_n) < 264:
        block_n //= 2
    return Fp8Config("tc", block_n, 256 if k >= 256 else max(16, triton.next_power_of_2(k)), 4, 4)


def candidate_configs(m: int, n: int, k: int) -> list[Fp8Config]:
    """Launches worth timing for one shape (benchmarks/sweep_quant_kernels.py): fp8_tc's tiles
    both ways round, the weight-only GEMV, and _scaled_mm."""
    out = [Fp8Config("gemv", *_gemv_tile(m, n, k)), Fp8Config("scaled_mm")]
    for swap in (False, True):
        for block_n in (16, 32, 64, 128):
            if swap and block_n < 64 or triton.cdiv(n, block_n) < 64:
                continue
            for block_k in (256, 512) if k > 256 else (max(16, triton.next_power_of_2(k)),):
                for stages in (3, 5):
                    out.append(Fp8Config("tc", block_n, block_k, 4, stages, swap))
    return out


def _gemv_tile(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    block_n, block_k, warps, _ = gemv_pick_config(m, n, k)
    return block_n, block_k, warps, 1


def fp8_tc(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
           scale_ub: float | None = None, out_dtype: torch.dtype | None = None,
           config: Fp8Config | None = None) -> torch.Tensor:
    """x [M <= TC_MAX_M, K] -> [M, N]: W8A8 with x quantized per token inside the kernel."""
    _check_linear(x, w, w_scale)
    _on_kernel_device(x, "fp8_linear_ref")
    m, k = x.shape
    n = w.shape[0]
    if not 1 <= m <= TC_MAX_M:
        raise ValueError(f"fp8_tc takes 1..{TC_MAX_M} rows of x, got {m}")
    _check_w_side(x.device, w, w_scale, bias, out_dtype or x.dtype)
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError("x must have a unit last stride and w must be contiguous")
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if n == 0:
        return y
    cfg = config or pick_config(m, n, k)
    _fp8_tc_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, w, w_scale, bias if bias is not None else w_scale, y,
        m, n, k, float(scale_ub or 0.0), x.stride(0), w.stride(0), y.stride(0),
        HAS_UB=scale_ub is not None, HAS_BIAS=bias is not None, IEEE=not x.is_cuda, SWAP=cfg.swap,
        EVEN=k % cfg.block_k == 0 and n % cfg.block_n == 0, BLOCK_M=TC_MAX_M, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, num_warps=cfg.warps, num_stages=cfg.stages,
    )
    return y


# ------------------------------------------------------------------------- GEMV (weight-only)

def _check_gemv(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype) -> None:
    """The W8A8 product's arguments: xq and w float8_e4m3fn, x_scale [M] and w_scale [N] fp32."""
    if xq.dtype != FP8_DTYPE or w.dtype != FP8_DTYPE:
        raise ValueError(f"xq and w must be float8_e4m3fn, got {xq.dtype} and {w.dtype}")
    if xq.dim() != 2 or w.dim() != 2 or xq.shape[1] != w.shape[1]:
        raise ValueError(f"need xq [M, K] and w [N, K], got {tuple(xq.shape)} and {tuple(w.shape)}")
    if x_scale.shape != (xq.shape[0],) or x_scale.dtype != torch.float32 or x_scale.device != xq.device:
        raise ValueError(f"need x_scale fp32 [M] on xq's device, got {x_scale.dtype} {tuple(x_scale.shape)}")
    _check_w_side(xq.device, w, w_scale, bias, out_dtype)


def _check_w_side(dev: torch.device, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                  out_dtype: torch.dtype) -> None:
    """w_scale fp32 [N], bias [N], w and both on the activations' device, a float out_dtype."""
    if not isinstance(w_scale, torch.Tensor) or w_scale.shape != (w.shape[0],) or w_scale.dtype != torch.float32:
        raise ValueError(f"need w_scale fp32 [N={w.shape[0]}], got {getattr(w_scale, 'dtype', None)} "
                         f"{tuple(getattr(w_scale, 'shape', ()))}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"bias must be [N={w.shape[0]}], got {tuple(bias.shape)}")
    if out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype must be fp32/fp16/bf16, got {out_dtype}")
    for name, t in (("w", w), ("w_scale", w_scale)) + ((("bias", bias),) if bias is not None else ()):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but the activations are on {dev}")


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
             out_dtype: torch.dtype | None = None, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Weight-only, up to kernels/gemv.py's MAX_M rows: ``x @ (w * w_scale[:, None]).T (+ bias)``
    with x as it is; kernels/gemv.py's kernel, one byte an element."""
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


# ------------------------------------------------------------------------- linear

def _check_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> None:
    _check_x(x)
    if w.dtype != FP8_DTYPE or w.dim() != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"w must be float8_e4m3fn [N, K={x.shape[1]}], got {w.dtype} {tuple(w.shape)}")


def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
               scale_ub: float | None = None, out_dtype: torch.dtype | None = None,
               config: Fp8Config | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N] in out_dtype (default x's), the launch `pick_config`'s unless given:
    fp8_tc up to TC_MAX_M rows, else x quantized per token (Triton) and torch._scaled_mm (K and
    N multiples of 16); "gemv" is the weight-only GEMV (x as it is)."""
    _check_linear(x, w, w_scale)
    out_dtype = out_dtype or x.dtype
    cfg = config or pick_config(x.shape[0], w.shape[0], x.shape[1], x.device)
    if cfg.path == "tc":
        return fp8_tc(x, w, w_scale, bias, scale_ub, out_dtype, cfg)
    if cfg.path == "gemv":
        return fp8_gemv(x, w, w_scale, bias, out_dtype=out_dtype, config=(cfg.block_n, cfg.block_k, cfg.warps, 1))
    if cfg.path != "scaled_mm":
        raise ValueError(f"unknown fp8 path {cfg.path!r}")
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
    """Pure-torch `fp8_linear`: x quantized per token, both sides dequantized, fp32 matmul
    (the "gemv" config's is weight-only: w dequantized, x as it is)."""
    _check_linear(x, w, w_scale)
    if config is not None and config.path == "gemv":
        return fp8_gemv_ref(x, w, w_scale, bias, out_dtype=out_dtype or x.dtype)
    xq, sx = per_token_quant_ref(x, scale_ub)
    return scaled_mm_ref(xq, sx, w, w_scale, bias, out_dtype=out_dtype or x.dtype)

"""FP8 linear: weight-only at decode (a few rows), W8A8 above: ``y = x @ (w_fp8 * w_scale).T (+ bias)``.

Shapes:
    x        [M, K]  fp32 / fp16 / bf16 activations
    w        [N, K]  float8_e4m3fn weight (an ``nn.Linear`` layout), row-major
    w_scale  [N]     fp32, one scale per output row (a per-tensor scale is expanded to rows),
             or [N, KB] fp32, one per row and per ``scale_block_k(K, KB)`` inputs: a block-
             quantized checkpoint's (e.g. 128 x 128 blocks) scales repeated down their rows
    xq, x_scale      [M, K] float8_e4m3fn and [M] fp32: x's dynamic per-token quantization,
                     ``x_scale[m] = min(amax|x[m]|, scale_ub) / 448`` and ``xq = x / x_scale``

The ops, each with a pure-torch ``*_ref`` of the same signature:
- ``per_token_quant`` (kernels/fp8_quant.py): x's quantization, its own launch; a kernel that
  produces x can do it instead and hand over an ``Fp8Act`` (``wants_quantized_input`` says when).
- ``fp8_gemv``: for a few rows (decode), weight-only: kernels/gemv.py's GEMV reading one
  byte an element, each output times its row's scale. cuBLAS's FP8 matmul is no faster than
  bf16 at these sizes (145 vs 139 us for M = 1 on the H200, issue #34), and quantizing x
  would cost a launch a linear, so decode takes this one.
- ``fp8_mm``: W8A8 for a decode batch (up to MM_MAX_M rows), x quantized per token, e4m3
  ``tl.dot`` over K cut into SPLIT parts, each part's fp32 tile written to a workspace and the
  parts added by a second launch that also adds the bias and rounds (one part: the tile is the
  output, one launch). cuBLAS's FP8 matmul at
  128 rows gives a [128, N] output only N / 128 tiles, 32 for llama3-8b's o and down
  projections on a 132-SM GPU: it streamed those weights at 33% and 42% of the copy
  bandwidth on an H100 (benchmarks/results/quant_linear_sweep_h100.json). Splitting K puts
  every SM to work. The split is deterministic (no atomics).
- Block-scaled weights ([N, KB] scales) take the same GEMV (each chunk times its scales) and
  ``fp8_mm`` at every other size (each K block's partial product times its column's scales
  before it is added; BLOCK_K at most the scale block): cuBLAS's row-wise scaled matmul has
  no per-block scales.
- ``fp8_linear``: ``fp8_gemv`` for M <= GEMV_MAX_M rows, ``fp8_mm`` up to MM_MAX_M, else
  quantize x (unless given an Fp8Act) and ``torch._scaled_mm`` with row-wise scales (cuBLAS FP8 tensor cores: 2,860
  vs 5,080 us against bf16 at M = 8192). ``fp8_linear_ref`` does the same in fp32 torch
  (``fp8_gemv_ref`` / ``scaled_mm_ref``). ``Fp8Config`` names a launch (the GEMV's tile,
  fp8_mm's tile and split, or _scaled_mm) for benchmarks/bench_quant_linear.py --sweep.

A W8A8 Triton kernel for up to 16 rows (x quantized per token inside it, e4m3 ``tl.dot``) was
tried and removed: on an H100 it streamed the weights at 27-79% of the copy bandwidth against
this GEMV's 66-93% at one row, and matched _scaled_mm at 16 rows
(benchmarks/results/quant_linear_sweep_fp8_h100.json, commit 8c3a494).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl

from treadle.kernels.fp8_quant import (
    FP8_DTYPE, FP8_MAX, ActQuant, Fp8Act, check_x as _check_x, interpreting as _interpreting, per_token_quant,
    per_token_quant_ref,
)
from treadle.kernels.gemv import MAX_M as GEMV_MAX, dequantize_blocks, gemv, gemv_ref, scale_block_k
from treadle.kernels.gemv import pick_config as gemv_pick_config

__all__ = ["FP8_MAX", "FP8_DTYPE", "GEMV_MAX_M", "MM_MAX_M", "ActQuant", "Fp8Act", "Fp8Config", "fp8_mm", "pick_config",
           "candidate_configs", "per_token_quant", "per_token_quant_ref", "fp8_gemv", "fp8_gemv_ref", "scaled_mm_ref",
           "fp8_linear", "fp8_linear_ref", "quantize_weight_ref", "wants_quantized_input"]

GEMV_MAX_M = 1  # (kernels/gemv.py takes up to 4 rows; at 4, 222 us against _scaled_mm's ~130 on the H200)
MM_MAX_M = 256  # fp8_mm by default up to here (a decode batch) where cuBLAS's tiles are few; _scaled_mm above
MM_MAX_TILES = 40
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _on_kernel_device(t: torch.Tensor, ref_name: str) -> None:
    if t.device.type != "cuda" and not _interpreting():
        raise ValueError(f"tensors must be on a CUDA device (got {t.device}); use {ref_name} on CPU")


# ------------------------------------------------------------------------- weights

def quantize_weight_ref(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] -> (float8_e4m3fn [N, K], per-row scale [N] fp32): quantizing at
    load (``--quantization fp8``) is the per-token quantization of the weight's rows."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"need a float [N, K] weight, got {tuple(w.shape)} {w.dtype}")
    return per_token_quant_ref(w.contiguous() if w.dtype in _DTYPES else w.float())


# ------------------------------------------------------------------------- GEMV

def _check_gemv(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype) -> None:
    """The W8A8 product's arguments: xq and w float8_e4m3fn, x_scale [M] and w_scale [N] (or
    [N, KB], block-scaled) fp32."""
    if xq.dtype != FP8_DTYPE or w.dtype != FP8_DTYPE:
        raise ValueError(f"xq and w must be float8_e4m3fn, got {xq.dtype} and {w.dtype}")
    if xq.dim() != 2 or w.dim() != 2 or xq.shape[1] != w.shape[1]:
        raise ValueError(f"need xq [M, K] and w [N, K], got {tuple(xq.shape)} and {tuple(w.shape)}")
    if x_scale.shape != (xq.shape[0],) or w_scale.shape[:1] != (w.shape[0],) or w_scale.dim() > 2:
        raise ValueError(f"need x_scale [M] and w_scale [N] or [N, KB], got {tuple(x_scale.shape)} and "
                         f"{tuple(w_scale.shape)}")
    if w_scale.dim() == 2:
        scale_block_k(w.shape[1], w_scale.shape[1])  # raises when the columns do not fit K
        if not w_scale.is_contiguous():
            raise ValueError("a block-scaled w_scale [N, KB] must be contiguous")
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
    """Decode (kernels/gemv.py's up to MAX_M rows; fp8_linear takes it for GEMV_MAX_M):
    ``x @ (w * w_scale[:, None]).T (+ bias)`` with x as it is
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
    if w_scale.dim() == 2:
        y = (xq.float() @ dequantize_blocks(w, w_scale).T) * x_scale[:, None]
    else:
        y = (xq.float() @ w.float().T) * x_scale[:, None] * w_scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


# ------------------------------------------------------------------------- split-K W8A8

@triton.jit
def _fp8_mm_kernel(
    xq_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, part_ptr,
    M, N, K, k_per,
    stride_xm, stride_wn, stride_ym, stride_ps, stride_pm, stride_sn,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    SCALE_K: tl.constexpr = 0,
):
    # grid: (cdiv(N, BLOCK_N), SPLIT, cdiv(M, BLOCK_M)); one program = a [BLOCK_M, BLOCK_N] tile
    # of the product over K's part [split * k_per, (split + 1) * k_per), scaled: with one part
    # the output itself (bias added, rounded), with several into part[split] for _sum_parts_kernel.
    # SCALE_K > 0: w_scale is [N, cdiv(K, SCALE_K)] and each BLOCK_K step (within one scale
    # block: BLOCK_K divides SCALE_K) is scaled by its column before it is added
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    ms = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    nmask = ns < N
    mmask = ms < M
    k_lo = split * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    if SCALE_K == 0:
        ws = tl.load(ws_ptr + ns, mask=nmask, other=0.0)
    pdl.wait(PDL)  # (kernels/pdl.py)
    pdl.launch_dependents(PDL)
    x_ptrs = xq_ptr + ms.to(tl.int64)[:, None] * stride_xm + (k_lo + ks)[None, :]
    w_ptrs = w_ptr + ns.to(tl.int64)[:, None] * stride_wn + (k_lo + ks)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kmask = (k0 + ks < k_hi)[None, :]
        x = tl.load(x_ptrs, mask=mmask[:, None] & kmask, other=0.0)
        w = tl.load(w_ptrs, mask=nmask[:, None] & kmask, other=0.0, eviction_policy="evict_first")
        if SCALE_K > 0:
            wsk = tl.load(ws_ptr + ns.to(tl.int64) * stride_sn + k0 // SCALE_K, mask=nmask, other=0.0)
            if IEEE:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee") * wsk[None, :]
            else:
                acc += tl.dot(x, tl.trans(w)) * wsk[None, :]
        elif IEEE:  # the interpreter has no fp8 dot: exact in fp32 (e4m3 products fit its mantissa)
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:  # Hopper's e4m3 MMA adds in less than fp32: promote to the fp32 tile each BLOCK_K
            acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=BLOCK_K)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    xs = tl.load(xs_ptr + ms, mask=mmask, other=0.0)
    if SCALE_K == 0:
        acc = acc * ws[None, :]
    acc = acc * xs[:, None]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + ns, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + ms.to(tl.int64)[:, None] * stride_ym + ns[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=omask)
    else:
        tl.store(part_ptr + split * stride_ps + ms.to(tl.int64)[:, None] * stride_pm + ns[None, :], acc, mask=omask)


@triton.jit
def _sum_parts_kernel(
    part_ptr, b_ptr, y_ptr,
    N, stride_ps, stride_pm, stride_ym,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (M, cdiv(N, BLOCK)); y[m, n] = sum_s part[s, m, n] (+ bias[n]), in y's dtype
    m = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    nmask = ns < N
    acc = tl.zeros([BLOCK], tl.float32)
    if HAS_BIAS:
        acc = tl.load(b_ptr + ns, mask=nmask, other=0.0).to(tl.float32)
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * stride_ps + m * stride_pm + ns, mask=nmask, other=0.0)
    tl.store(y_ptr + m * stride_ym + ns, acc.to(y_ptr.dtype.element_ty), mask=nmask)


def mm_split(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int) -> int:
    """K parts that give about one program an SM of an H100/H200 (132 SMs), each part at least 4
    K blocks long (at 128 rows, 8 warps a program: one a program an SM beat two on every
    llama3-8b shape, benchmarks/results/quant_linear_sweep_fp8_mm2_h100.json)."""
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    return max(1, min(132 // max(tiles, 1), triton.cdiv(k, 4 * block_k), 16))


def fp8_mm(xq: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
           bias: torch.Tensor | None = None, *, out_dtype: torch.dtype = torch.bfloat16,
           config: "Fp8Config | None" = None) -> torch.Tensor:
    """The W8A8 product ``(xq * x_scale[:, None]) @ (w * w_scale[:, None]).T (+ bias)`` of
    per_token_quant's output, for a decode batch: tiles of config.block_m rows x block_n
    outputs, K in config.split parts (Triton; a second launch adds the parts when there are several)."""
    _check_gemv(xq, x_scale, w, w_scale, bias, out_dtype)
    _on_kernel_device(xq, "scaled_mm_ref")
    m, k = xq.shape
    n = w.shape[0]
    cfg = config or pick_config(m, n, k)
    if cfg.path != "mm":
        raise ValueError(f"fp8_mm takes an 'mm' launch, got {cfg.path!r}")
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.copy_(bias.expand(m, n) if bias is not None else torch.zeros_like(y))
    scale_k = scale_block_k(k, w_scale.shape[1]) if w_scale.dim() == 2 else 0
    block_k = min(cfg.block_k, scale_k) if scale_k else cfg.block_k
    split = cfg.split or mm_split(m, n, k, cfg.block_m, cfg.block_n, block_k)
    k_per = triton.cdiv(triton.cdiv(k, block_k), split) * block_k
    split = triton.cdiv(k, k_per)  # no empty part
    part = torch.empty((split, m, n), dtype=torch.float32, device=xq.device) if split > 1 else y[None]
    launch = dict(num_warps=cfg.warps) if _interpreting() else dict(num_warps=cfg.warps, num_stages=cfg.stages)
    _fp8_mm_kernel[(triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m))](
        xq, x_scale, w, w_scale, bias if bias is not None else w_scale, y, part, m, n, k, k_per,
        xq.stride(0), w.stride(0), y.stride(0), part.stride(0), part.stride(1), w_scale.stride(0) if scale_k else 0,
        SPLIT=split, HAS_BIAS=bias is not None, IEEE=_interpreting(), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=block_k, SCALE_K=scale_k, **launch, **pdl.options(xq))
    if split > 1:
        block = min(1024, triton.next_power_of_2(n))
        _sum_parts_kernel[(m, triton.cdiv(n, block))](
            part, bias if bias is not None else part, y, n, part.stride(0), part.stride(1), y.stride(0),
            SPLIT=split, HAS_BIAS=bias is not None, BLOCK=block, num_warps=4, **pdl.options(xq))
    return y


# ------------------------------------------------------------------------- launches

class Fp8Config(NamedTuple):
    """A launch of fp8_linear: ``path`` "gemv" (the weight-only GEMV with this tile: kernels/gemv.py's
    BLOCK_N, BLOCK_K, num_warps), "mm" (per_token_quant + fp8_mm with tiles of block_m x block_n
    x block_k, K in ``split`` parts (0: mm_split's choice), num_stages ``stages``) or "scaled_mm"
    (per_token_quant + torch._scaled_mm)."""
    path: str
    block_n: int = 4
    block_k: int = 1024
    warps: int = 2
    block_m: int = 0
    split: int = 1
    stages: int = 1


def _mm_config(m: int, n: int, k: int, block_n: int | None = None, block_k: int | None = None,
               stages: int | None = None, warps: int = 8) -> Fp8Config:
    """fp8_mm's launch: 32 x 128 tiles on 5 stages, or 64 x 256 on 4 past K = 8,192 (unless given),
    mm_split's parts."""
    long_k = k > 8192
    block_n = block_n or (64 if long_k else 32)
    block_k = block_k or (256 if long_k else 128)
    stages = stages or (3 if block_n * block_k >= 32768 else 4 if block_k >= 256 else 5)  # within 227 KB of shared memory
    block_m = 64 if m <= 64 else 128
    return Fp8Config("mm", block_n, block_k, warps, block_m, mm_split(m, n, k, block_m, block_n, block_k), stages)


def pick_config(m: int, n: int, k: int, blocked: bool = False) -> Fp8Config:
    """The GEMV up to GEMV_MAX_M rows with kernels/gemv.py's tile; up to MM_MAX_M rows fp8_mm where
    cuBLAS's 128 x 128 output tiles would be too few for the GPU (at most MM_MAX_TILES), else
    _scaled_mm. On an H100 at 128 rows, each with x quantized in the same launch, fp8_mm took
    14.5 / 38.7 us for llama3-8b's o / down (32 of cuBLAS's tiles) against _scaled_mm's ~17 / 47,
    and tied on qkv (48 tiles: 17.5 vs 17.7); _scaled_mm won gate_up (224: 53.8 against 54.5)
    (benchmarks/results/quant_linear_sweep_fp8_mm2_h100.json).
    `blocked` (a block-scaled weight): fp8_mm at every size above the GEMV's, 128 x 128 tiles
    past MM_MAX_M rows (cuBLAS's row-wise scaled matmul has no per-block scales)."""
    if m > GEMV_MAX_M and blocked:
        if m <= MM_MAX_M:
            return _mm_config(m, n, k)
        return Fp8Config("mm", 128, 128, 8, 128, 1, 3)
    if m > GEMV_MAX_M:
        if m <= MM_MAX_M and triton.cdiv(n, 128) * triton.cdiv(m, 128) <= MM_MAX_TILES:
            return _mm_config(m, n, k)
        return Fp8Config("scaled_mm")
    block_n, block_k, warps, _ = gemv_pick_config(m, n, k)
    return Fp8Config("gemv", block_n, block_k, warps)


def candidate_configs(m: int, n: int, k: int) -> list[Fp8Config]:
    """Launches worth timing for one shape (bench_quant_linear.py --sweep): fp8_mm's tiles on 4 or
    8 warps with mm_split's parts, half and twice that (up to MM_MAX_M rows), GEMV tiles of 2-8
    rows by 512-2048 columns on 2 or 4 warps (up to kernels/gemv.py's MAX_M rows), and _scaled_mm."""
    out = [Fp8Config("scaled_mm")]
    if m <= MM_MAX_M:
        for bn in (32, 64, 128):
            for bk in (128, 256):
                for warps in (4, 8):
                    cfg = _mm_config(m, n, k, bn, bk, None, warps)
                    out += [cfg, cfg._replace(split=max(1, cfg.split // 2)), cfg._replace(split=2 * cfg.split)]
        out = list(dict.fromkeys(out))
    if m <= GEMV_MAX:
        out += [Fp8Config("gemv", bn, bk, w) for bn in (2, 4, 8) for bk in (512, 1024, 2048) for w in (2, 4)
                if bn * bk <= 8192]
    return out


# ------------------------------------------------------------------------- linear

def _check_linear(x: "torch.Tensor | Fp8Act", w: torch.Tensor, w_scale: torch.Tensor) -> None:
    if isinstance(x, Fp8Act):
        if x.q.dtype != FP8_DTYPE or x.q.dim() != 2 or x.scale.shape != (x.q.shape[0],):
            raise ValueError("an Fp8Act must hold q [M, K] float8_e4m3fn and scale [M]")
    else:
        _check_x(x)
    if w.dtype != FP8_DTYPE or w.dim() != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"w must be float8_e4m3fn [N, K={x.shape[1]}], got {w.dtype} {tuple(w.shape)}")


def wants_quantized_input(m: int, n: int, k: int) -> bool:
    """Whether `fp8_linear` quantizes an m-row input for an [n, k] weight (every path but the
    weight-only GEMV): a kernel producing that input may then hand it over as an Fp8Act."""
    return pick_config(m, n, k).path != "gemv"


def fp8_linear(x: "torch.Tensor | Fp8Act", w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
               scale_ub: float | None = None, out_dtype: torch.dtype | None = None,
               config: Fp8Config | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N] in out_dtype (default x's, an Fp8Act's its own), by `pick_config`'s launch
    unless given: for M <= GEMV_MAX_M the weight-only GEMV (x as it is), else x quantized per
    token (Triton; or already, an Fp8Act) and fp8_mm or torch._scaled_mm (K and N multiples of 16)."""
    _check_linear(x, w, w_scale)
    out_dtype = out_dtype or x.dtype
    blocked = w_scale.dim() == 2
    cfg = config or pick_config(x.shape[0], w.shape[0], x.shape[1], blocked)
    if cfg.path == "gemv":
        if isinstance(x, Fp8Act):
            raise ValueError("the weight-only GEMV takes x unquantized (see wants_quantized_input)")
        return fp8_gemv(x, w, w_scale, bias, out_dtype=out_dtype, config=(cfg.block_n, cfg.block_k, cfg.warps, 1))
    if cfg.path not in ("mm", "scaled_mm"):
        raise ValueError(f"unknown fp8 launch path {cfg.path!r} (gemv, mm, scaled_mm)")
    xq, sx = (x.q, x.scale) if isinstance(x, Fp8Act) else per_token_quant(x, scale_ub)
    if cfg.path == "mm":
        return fp8_mm(xq, sx, w, w_scale, bias, out_dtype=out_dtype, config=cfg)
    if blocked:
        raise ValueError("torch._scaled_mm has no per-block weight scales: a block-scaled weight takes fp8_mm")
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


def fp8_linear_ref(x: "torch.Tensor | Fp8Act", w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
                   scale_ub: float | None = None, out_dtype: torch.dtype | None = None,
                   config: Fp8Config | None = None) -> torch.Tensor:
    """Pure-torch `fp8_linear` (same launch choice): for the GEMV w dequantized and x as it is,
    else x quantized per token (unless an Fp8Act already); both sides dequantized, fp32 matmul."""
    _check_linear(x, w, w_scale)
    if isinstance(x, Fp8Act):
        return scaled_mm_ref(x.q, x.scale, w, w_scale, bias, out_dtype=out_dtype or x.dtype)
    if (config or pick_config(x.shape[0], w.shape[0], x.shape[1], w_scale.dim() == 2)).path == "gemv":
        return fp8_gemv_ref(x, w, w_scale, bias, out_dtype=out_dtype or x.dtype)
    xq, sx = per_token_quant_ref(x, scale_ub)
    return scaled_mm_ref(xq, sx, w, w_scale, bias, out_dtype=out_dtype or x.dtype)

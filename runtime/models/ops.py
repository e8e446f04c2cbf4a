"""Elementwise ops for the model: the Triton kernel on CUDA, a C pass on float32 CPU tensors
(runtime/cpu_ops.py), its pure-torch `*_ref` elsewhere.
Chosen per call from the tensor's device, so importing this works on any machine."""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from treadle.kernels import activation, gemv as gemv_k, rmsnorm as rmsnorm_k, rope
from treadle.kernels.fp8_quant import ActQuant, Fp8Act
from treadle.kernels.rmsnorm import NormedInput
from treadle.runtime import cpu_ops  # float32 CPU: one C pass an op (runtime/cpu_ops.c)

# tests set True to take fuses_norm's path on CPU tensors, with TRITON_INTERPRET=1
FUSE_NORM_WITHOUT_CUDA = False


def fusion(name: str) -> str:
    """The setting of a decode-step fusion (TREADLE_FUSED_NORM, TREADLE_FUSED_ROPE): "0" off,
    "1" on wherever a kernel can take it, "auto" (unset, or any other value) on where it was
    measured faster (docs/performance.md: bf16 projections, not FP8 ones or a MoE router)."""
    value = os.environ.get(name, "auto")
    return value if value in ("0", "1") else "auto"


def fuses_norm(x: torch.Tensor) -> bool:
    """Whether the RMSNorm before a projection of x may be left to the projection's own kernel (a
    NormedInput, kernels/rmsnorm.py) rather than launched: one row of x (batch-1 decode) captured
    into a CUDA graph, where `linear` runs the Triton GEMV anyway. The projection must say yes
    too (its weight's format, and `fusion("TREADLE_FUSED_NORM")`). TREADLE_FUSED_NORM=0 turns it off."""
    if x.dim() != 2 or x.shape[0] != 1 or not x.is_contiguous():
        return False
    if not x.is_cuda and not FUSE_NORM_WITHOUT_CUDA:  # a CPU decode step: no environment read a layer
        return False
    if fusion("TREADLE_FUSED_NORM") == "0":
        return False
    if not x.is_cuda:
        return True
    return x.dtype in (torch.bfloat16, torch.float16) and torch.cuda.is_current_stream_capturing()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """RMSNorm of x's rows; with `quant` (a linear layer's `input_quant`) the CUDA kernel may
    return them quantized per token instead (elsewhere the plain tensor, which that layer takes too)."""
    if x.is_cuda:
        return rmsnorm_k.rmsnorm(x, weight, eps, quant)
    if cpu_ops.usable(x, weight):
        return cpu_ops.rmsnorm(x, weight, eps)
    return rmsnorm_k.rmsnorm_ref(x, weight, eps)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """In place: residual += x; x = rmsnorm(residual). Returns x, or with `quant` on CUDA the
    normed rows quantized per token (as `rmsnorm`)."""
    if x.is_cuda:
        return rmsnorm_k.fused_add_rmsnorm(x, residual, weight, eps, quant)
    if cpu_ops.usable(x, residual, weight) and x.is_contiguous() and residual.is_contiguous():
        cpu_ops.fused_add_rmsnorm(x, residual, weight, eps)
    else:
        rmsnorm_k.fused_add_rmsnorm_ref(x, residual, weight, eps)
    return x


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
               qk_norm: tuple | None = None) -> None:
    """In place: q and k [T, heads, D] (views of qkv) rotated, each head RMS-normalised first with
    qk_norm = (q_weight, k_weight, eps) (Qwen3): one kernel on the GPU."""
    if q.is_cuda:
        rope.apply_rope(q, k, positions, cos_sin, qk_norm)
        return
    if qk_norm is not None:
        for x, w in ((q, qk_norm[0]), (k, qk_norm[1])):
            x.copy_(rmsnorm(x.reshape(-1, x.shape[-1]).contiguous(), w, qk_norm[2]).view(x.shape))
    if cpu_ops.usable(q, k, cos_sin) and cpu_ops.rope_layout_ok(q, k):
        cpu_ops.apply_rope(q, k, positions, cos_sin)
    else:
        rope.apply_rope_ref(q, k, positions, cos_sin)


def silu_and_mul(x: torch.Tensor, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
    """silu(gate) * up; with `quant` the CUDA kernel may return it quantized per token (as `rmsnorm`)."""
    if x.is_cuda:
        return activation.silu_and_mul(x, quant)
    if cpu_ops.usable(x) and x.dim() == 2:
        return cpu_ops.silu_and_mul(x)
    return activation.silu_and_mul_ref(x)


def _has_onednn_linear() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = _has_onednn_linear()


def linear(x: torch.Tensor | NormedInput, w: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, act: str | None = None) -> torch.Tensor:
    """``x @ w.T (+ bias)``, in ``out_dtype`` if given.

    x a NormedInput (where `fuses_norm` said so): the GEMV normalises it, and with act "silu"
    gives silu(gate) * up of a gate/up weight (kernels/gemv.py).

    CUDA: a one-token product captured into a CUDA graph (batch-1 decode) runs the Triton
    GEMV, which streams the weight faster than cuBLAS's small-batch kernels on the H200
    (3.67 vs 4.00 ms for llama3-8b's matmuls, benchmarks/bench_gemv.py); outside a capture
    its higher launch cost would be paid on every call, so cuBLAS keeps those.
    CPU fp32: oneDNN's matmul (see below) where torch has it, else F.linear."""
    if isinstance(x, NormedInput):
        return gemv_k.gemv(x, w, bias, out_dtype=out_dtype, act=act)
    if act is not None:
        raise ValueError("linear's act is for a NormedInput x")
    if (x.is_cuda and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16) and x.stride(1) == 1
            and w.is_contiguous() and w.dtype == x.dtype and torch.cuda.is_current_stream_capturing()):
        return gemv_k.gemv(x, w, bias, out_dtype=out_dtype)
    if _ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] > 0:
        # oneDNN's fp32 matmul: 30-40% faster than F.linear's BLAS at the row counts of a
        # decode step (1..32) and ~12% at 512, on the 2-core AVX-512 dev box, for SmolLM2's
        # shapes (weights streamed from DRAM); same fp32 math, another summation order
        y = torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
        return y if out_dtype is None else y.to(out_dtype)
    y = F.linear(x, w, bias)
    return y if out_dtype is None else y.to(out_dtype)


build_cos_sin_cache = rope.build_cos_sin_cache

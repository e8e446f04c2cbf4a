"""4-bit weight-only (W4A16) linear layers: AWQ and GPTQ checkpoints, and round-to-nearest
quantization at load in either layout. Both are repacked at load into the one layout
kernels/int4_linear.py reads (q packed along K, zeros along N, fp16 scales, groups in order).

AWQ (version gemm), per [K, N] weight with G-wide groups along K:
    qweight [K, N/8]     nibble j of qweight[k, c] = q[k, 8c + AWQ_ORDER[j]]
    qzeros  [K/G, N/8]   the same interleave;   scales [K/G, N] fp16
    w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]
GPTQ:
    qweight [K/8, N]     nibble j of qweight[r, n] = q[8r + j, n]
    qzeros  [K/G, N/8]   nibble j of qzeros[g, c] = z[g, 8c + j] - zero_offset (1 in format "gptq")
    scales  [K/G, N] fp16;   g_idx [K]: the group of input k (act-order: not k // G)
    w[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]
Act-order weights are sorted by group at load (perm = argsort(g_idx)), which the layer
applies to x's columns before the kernel: x[:, perm] @ w[perm] = x @ w.

On a CUDA device where NVRTC is at hand (kernels/cuda_jit.py) and the shape allows (N a
multiple of 16, K of 64, groups a multiple of 64), q is kept instead in the mma layout of
kernels/int4_mma.py (``layer.int4_layout == "mma"``): the tensor-core GEMV for up to 64 rows,
the weight dequantized for cuBLAS past that. ``TREADLE_INT4_MMA=0`` keeps the Triton layout.
A SwiGLU gate/up pair (``layer.act_and_mul == "silu"``) is then stored interleaved by 8
outputs (``layer.gate_up_interleaved``), so that its GEMV writes silu(gate) * up itself
(``apply_silu_and_mul``); its plain ``apply`` puts the outputs back in order.

On the CPU the weight is dequantized and multiplied in the activations' dtype.
"""
from __future__ import annotations

import functools
import logging
import os

import torch
from torch import nn

from treadle.kernels import cuda_jit, int4_mma
from treadle.kernels.int4_linear import (
    dequantize_ref, gemv_counters, int4_linear, pack_cols, pack_rows, unpack_cols, unpack_rows,
)
from treadle.runtime.models import ops
from treadle.runtime.quantization.base import QuantMethod, new_param, replace_param

logger = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of an AWQ int holds column 8c + AWQ_ORDER[j]
_AWQ_INVERSE = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a block sits in nibble _AWQ_INVERSE[j]
SCALE_DTYPE = torch.float16


def awq_pack(q: torch.Tensor) -> torch.Tensor:
    """Values [R, N] in [0, 15] -> AWQ's int32 [R, N/8] (interleaved columns)."""
    r, n = q.shape
    return pack_cols(q.reshape(r, n // 8, 8)[:, :, list(AWQ_ORDER)].reshape(r, n))


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """AWQ's int32 [R, N/8] -> values [R, N] (int32)."""
    v = unpack_cols(packed)
    r, n = v.shape
    return v.reshape(r, n // 8, 8)[:, :, list(_AWQ_INVERSE)].reshape(r, n)


def quantize_rtn(w: torch.Tensor, group: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round to nearest: a float weight [N, K] -> (q [K, N], zeros [K/G, N], scales [K/G, N] fp16)
    with w.T ~ (q - zeros) * scales per group. Asymmetric (AWQ's): the group's range over 15
    steps; symmetric (GPTQ's sym): zero 8, its largest magnitude over 7.5 steps."""
    k, n = w.shape[1], w.shape[0]
    wg = w.float().T.reshape(k // group, group, n)  # [groups, G, N]
    if sym:
        scale = (wg.abs().amax(dim=1) / 7.5).clamp(min=1e-8)
        zero = torch.full_like(scale, 8.0)
    else:
        lo, hi = wg.amin(dim=1).clamp(max=0), wg.amax(dim=1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-8)
        zero = (-lo / scale).round().clamp(0, 15)
    scale = scale.to(SCALE_DTYPE)  # stored as fp16: quantize against the rounded scale
    q = (wg / scale.float()[:, None, :] + zero[:, None, :]).round().clamp(0, 15)
    return q.reshape(k, n).to(torch.uint8), zero.to(torch.uint8), scale


@functools.lru_cache(maxsize=None)
def _mma_ready(device: torch.device) -> bool:
    """Compile and load the mma kernels for `device` now (not inside a CUDA-graph capture)."""
    try:
        int4_mma.prepare(device, SCALE_DTYPE)
    except cuda_jit.CudaJitError as e:
        logger.warning("the 4-bit tensor-core kernels do not build on %s, the Triton ones serve instead: %s", device, e)
        return False
    return True


class Int4Method(QuantMethod):
    name = "int4"

    def _group(self, layer: nn.Module) -> int:
        return self.qc.group_size or layer.in_local  # 0: one group over the whole row (GPTQ's -1)

    def create_weights(self, layer: nn.Module) -> None:
        n, k, g = layer.out_local, layer.in_local, self._group(layer)
        if self.qc.method == "awq":
            new_param(layer, "qweight", (k, n // 8), torch.int32, input_dim=0, output_dim=1, output_pack=8)
        else:
            new_param(layer, "qweight", (k // 8, n), torch.int32, input_dim=0, input_pack=8, output_dim=1)
            new_param(layer, "g_idx", (k,), torch.int32, input_dim=0)
        new_param(layer, "qzeros", (k // g, n // 8), torch.int32, input_dim=0, input_pack=g, output_dim=1,
                  output_pack=8)
        new_param(layer, "scales", (k // g, n), SCALE_DTYPE, input_dim=0, input_pack=g, output_dim=1)
        if hasattr(layer, "weight"):
            delattr(layer, "weight")

    def process_after_loading(self, layer: nn.Module) -> None:
        g = self._group(layer)
        if self.qc.method == "awq":
            q, z = awq_unpack(layer.qweight.data), awq_unpack(layer.qzeros.data)
        else:
            q = unpack_rows(layer.qweight.data)
            z = (unpack_cols(layer.qzeros.data) + self.qc.zero_offset) & 0xF
            g_idx = layer.g_idx.data.long()
            g_idx = g_idx - g_idx.min()  # a row-parallel rank's inputs start at group rank * K_local / G
            delattr(layer, "g_idx")
            sequential = torch.arange(q.shape[0], device=q.device) // g
            if not torch.equal(g_idx, sequential):  # act-order: sort the inputs by group
                perm = torch.argsort(g_idx, stable=True)
                if not torch.equal(g_idx[perm], sequential):
                    raise ValueError(f"g_idx does not give every group exactly {g} inputs; not a GPTQ layout treadle reads")
                q = q[perm]
                layer.register_buffer("perm", perm, persistent=False)
        self._store(layer, q, z, layer.scales.data)

    def _use_mma(self, q: torch.Tensor, group: int) -> bool:
        """The mma layout where its kernels compile and load here (once a device: a failure, say an
        NVRTC newer than the driver, is logged and the Triton layout kept)."""
        k, n = q.shape
        if not (q.is_cuda and os.environ.get("TREADLE_INT4_MMA", "1") != "0"
                and int4_mma.supports(n, k, group, torch.bfloat16, SCALE_DTYPE) and int4_mma.available(q.device)):
            return False
        return _mma_ready(q.device)

    def _store(self, layer: nn.Module, q: torch.Tensor, z: torch.Tensor, scales: torch.Tensor) -> None:
        group = self._group(layer)
        mma = self._use_mma(q, group)
        # a gate/up pair whose caller takes silu(gate) * up: interleaved, the GEMV fuses the SwiGLU
        interleave = (mma and getattr(layer, "act_and_mul", None) == "silu" and len(layer.shard_sizes) == 2
                      and layer.shard_sizes[0] == layer.shard_sizes[1] and q.shape[1] % 16 == 0)
        if interleave:
            q, z, scales = (int4_mma.interleave_gate_up(t) for t in (q, z, scales))
        replace_param(layer, "qweight", int4_mma.pack_mma(q) if mma else pack_rows(q).contiguous())
        replace_param(layer, "qzeros", pack_cols(z).contiguous())
        replace_param(layer, "scales", scales.to(SCALE_DTYPE).contiguous())
        layer.group_size = group
        layer.int4_layout = "mma" if mma else "rows"
        layer.gate_up_interleaved = interleave
        if not mma and layer.qweight.is_cuda:  # the GEMV's split-K counters, made before any CUDA-graph capture
            gemv_counters(layer.qweight.device, 0)

    def quantize_loaded(self, layer: nn.Module) -> None:
        """Round to nearest with the format's zero convention (AWQ asymmetric, GPTQ symmetric),
        stored straight in the run-time layout (the checkpoint layouts' round trips are the
        loaders' tests)."""
        q, z, s = quantize_rtn(layer.weight.data, self._group(layer), self.qc.sym)
        delattr(layer, "weight")
        self._store(layer, q, z, s)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.kernels(x):
            perm = getattr(layer, "perm", None)
            if perm is not None:
                x = x.index_select(1, perm)
            if getattr(layer, "int4_layout", "rows") == "mma":
                if x.dtype in (torch.bfloat16, torch.float16):
                    y = int4_mma.int4_mma_linear(x, layer.qweight, layer.scales, layer.qzeros, layer.group_size,
                                                 None if bias is None else bias.to(x.dtype))
                    return int4_mma.deinterleave_gate_up(y) if layer.gate_up_interleaved else y
                # fp32 activations: the exact fp32 weight (slow; GPU models run in bf16 / fp16)
                return ops.linear(x, self.dequantize(layer, sorted_inputs=True).to(x.dtype), bias)
            return int4_linear(x, layer.qweight, layer.scales, layer.qzeros, layer.group_size, bias)
        # the float path's own matmul, so a float model of the dequantized weights is exact
        return ops.linear(x, self.dequantize(layer).to(x.dtype), bias)

    def apply_silu_and_mul(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                           quant: object = None) -> torch.Tensor:
        if (getattr(layer, "gate_up_interleaved", False) and bias is None and self.kernels(x)
                and x.dtype in (torch.bfloat16, torch.float16)):
            perm = getattr(layer, "perm", None)
            if perm is not None:
                x = x.index_select(1, perm)
            return int4_mma.int4_mma_linear(x, layer.qweight, layer.scales, layer.qzeros, layer.group_size,
                                            gated=True)
        return super().apply_silu_and_mul(layer, x, bias, quant)

    def dequantize(self, layer: nn.Module, sorted_inputs: bool = False) -> torch.Tensor:
        """The fp32 weight [N, K], its inputs in their own order (or, with `sorted_inputs`, in
        the act-order sort the kernels read them in), its outputs in their own order."""
        rows = int4_mma.mma_to_rows(layer.qweight) if getattr(layer, "int4_layout", "rows") == "mma" else layer.qweight
        w = dequantize_ref(rows, layer.scales, layer.qzeros, layer.group_size)  # [K, N], sorted inputs
        if getattr(layer, "gate_up_interleaved", False):
            w = int4_mma.deinterleave_gate_up(w)
        perm = getattr(layer, "perm", None)
        if perm is not None and not sorted_inputs:
            w = torch.empty_like(w).index_copy_(0, perm, w)  # back to the inputs' own order
        return w.T.contiguous()

"""FP8 (W8A8) linear layers: float8_e4m3fn weights with a scale per output row, activations
quantized per token as they arrive (kernels/fp8_linear.py).

Checkpoint parameters (compressed-tensors, fp8 and fbgemm_fp8 alike): `weight` [N, K] fp8, and
`weight_scale` [N, 1] (per channel) or one value per checkpoint tensor (per tensor: a merged
q/k/v layer gets three, expanded to its rows at load, which computes the same products), or
block scales [cdiv(N, bn), cdiv(K, bk)] (named `weight_scale_inv` in the fp8 format), each
block row's scales repeated down its rows as they load (so merged parts and tensor-parallel
slices need not start on a block); `input_scale` too for static-activation checkpoints (read,
unused). Run time: `weight` [N, K] fp8 and `weight_scale` [N] fp32, or [N, cdiv(K, bk)] for
blocks (1/32 of the weight's bytes at bk 128).

On the GPU the matmul is W8A8 (per-token activation scales). On the CPU the weight is
dequantized and multiplied in the activations' dtype (weight-only): the CPU has no FP8
matmul worth having, and the dequantized-fp32 model is then the exact reference.
"""
from __future__ import annotations

import torch
from torch import nn

from treadle.kernels.fp8_linear import (
    FP8_DTYPE, ActQuant, Fp8Act, fp8_linear, quantize_weight_ref, wants_quantized_input,
)
from treadle.kernels.gemv import dequantize_blocks, gemv
from treadle.kernels.rmsnorm import NormedInput
from treadle.runtime.models import ops
from treadle.runtime.models.parallel import RowParallelLinear
from treadle.runtime.quantization.base import QuantMethod, new_param, replace_param


class Fp8Method(QuantMethod):
    name = "fp8"

    def create_weights(self, layer: nn.Module) -> None:
        n, k, parts = layer.out_local, layer.in_local, len(layer.shard_sizes)
        new_param(layer, "weight", (n, k), FP8_DTYPE, output_dim=0, input_dim=1)
        if self.qc.weight_block is not None:
            bn, bk = self.qc.weight_block
            p = new_param(layer, self.qc.scale_name, (n, -(-k // bk)), torch.float32, output_dim=0, input_dim=1,
                          input_pack=bk)
            p.weight_loader = _block_scale_loader(layer, bn, bk)  # type: ignore[attr-defined]
        elif self.qc.weight_strategy == "channel":
            new_param(layer, "weight_scale", (n, 1), torch.float32, output_dim=0)
        else:
            new_param(layer, "weight_scale", (parts,), torch.float32, per_shard=True)
        if self.qc.static_input_scale:
            new_param(layer, "input_scale", (parts,), torch.float32, per_shard=True)

    def process_after_loading(self, layer: nn.Module) -> None:
        if self.qc.weight_block is not None:
            scale = getattr(layer, self.qc.scale_name).data.float().contiguous()
            if self.qc.scale_name != "weight_scale":
                delattr(layer, self.qc.scale_name)
            replace_param(layer, "weight_scale", scale)
            if self.qc.static_input_scale:
                delattr(layer, "input_scale")
            replace_param(layer, "weight", layer.weight.data.contiguous())
            return
        scale = layer.weight_scale.data
        if self.qc.weight_strategy == "channel":
            scale = scale.reshape(-1)
        else:  # each merged part's scale over its rows
            sizes = torch.tensor(layer.shard_sizes, device=scale.device)
            scale = scale.repeat_interleave(sizes)
        replace_param(layer, "weight_scale", scale.float().contiguous())
        if self.qc.static_input_scale:
            delattr(layer, "input_scale")  # dynamic per-token scales are used instead
        replace_param(layer, "weight", layer.weight.data.contiguous())

    def quantize_loaded(self, layer: nn.Module) -> None:
        if self.qc.weight_block is not None:
            raise ValueError("block-wise FP8 is read from checkpoints; --quantization fp8 quantizes per channel")
        w, scale = quantize_weight_ref(layer.weight.data)
        replace_param(layer, "weight", w)
        replace_param(layer, "weight_scale", scale)

    def input_quant(self, layer: nn.Module, x: torch.Tensor | Fp8Act) -> ActQuant | None:
        if self.kernels(x) and wants_quantized_input(x.shape[0], layer.out_local, layer.in_local):
            return ActQuant(self.qc.activation_scale_ub)
        return None

    def fuses_norm(self, layer: nn.Module, x: torch.Tensor) -> bool:
        # the weight-only GEMV of one row normalises its input as it loads it (kernels/gemv.py);
        # only where asked for: on one H100 it was 2-3% slower a decode step than the norm's launch
        return (ops.fusion("TREADLE_FUSED_NORM") == "1" and self.kernels(x)
                and not wants_quantized_input(1, layer.out_local, layer.in_local))

    def apply(self, layer: nn.Module, x: torch.Tensor | Fp8Act | NormedInput, bias: torch.Tensor | None
              ) -> torch.Tensor:
        """x as it is, or (on the GPU, from a kernel that fused `input_quant`'s quantization) an
        Fp8Act, or a NormedInput where `fuses_norm` said so."""
        if isinstance(x, NormedInput):
            return gemv(x, layer.weight, bias, w_scale=layer.weight_scale)
        if self.kernels(x):
            return fp8_linear(x, layer.weight, layer.weight_scale, bias, self.qc.activation_scale_ub)
        if isinstance(x, Fp8Act):
            x = x.dequantize(x.dtype)
        # the float path's own matmul, so a float model of the dequantized weights is exact
        return ops.linear(x, self.dequantize(layer).to(x.dtype), bias)

    def apply_silu_and_mul(self, layer: nn.Module, x: torch.Tensor | Fp8Act | NormedInput,
                           bias: torch.Tensor | None, quant: ActQuant | None = None) -> torch.Tensor | Fp8Act:
        if isinstance(x, NormedInput):  # one GEMV: norm, gate, up and the product
            return gemv(x, layer.weight, bias, w_scale=layer.weight_scale, act="silu")
        if (quant is None and isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] == 1 and x.stride(1) == 1
                and self.kernels(x) and ops.fusion("TREADLE_FUSED_SILU") != "0"
                and not wants_quantized_input(1, layer.out_local, layer.in_local)):
            # one row, weight-only (the GEMV) and a down projection that takes it as it is: the GEMV
            # writes silu(gate) * up, no SiLU launch (TREADLE_FUSED_SILU=0 launches it:
            # docs/performance.md has the measurement)
            return gemv(x, layer.weight, bias, w_scale=layer.weight_scale, act="silu")
        return super().apply_silu_and_mul(layer, x, bias, quant)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        if layer.weight_scale.dim() == 2:
            return dequantize_blocks(layer.weight, layer.weight_scale)
        return layer.weight.float() * layer.weight_scale[:, None]


def _block_scale_loader(layer: nn.Module, bn: int, bk: int):
    """The loader of a block-scale parameter [out_local, cdiv(in_local, bk)]: a checkpoint tensor
    [cdiv(N, bn), cdiv(K, bk)] has each block row repeated bn times (one row of scales an output
    row), then the layer's own loader cuts its rank's outputs (column-parallel, merged parts
    included) or this code its rank's input blocks (row-parallel)."""
    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if loaded.dim() != 2:
            raise ValueError(f"block scales must be [row blocks, input blocks], got {tuple(loaded.shape)}")
        rows = loaded.float().repeat_interleave(bn, dim=0)
        if isinstance(layer, RowParallelLinear):
            cols = param.shape[1]
            start = layer.ctx.rank * layer.local_in // bk
            if rows.shape[0] < layer.out_local or start + cols > rows.shape[1]:
                raise ValueError(f"block scales {tuple(loaded.shape)} do not cover a [{layer.out_local}, "
                                 f"{layer.local_in * layer.ctx.size}] weight in {bn} x {bk} blocks")
            param.data.copy_(rows[:layer.out_local, start:start + cols])
            return
        layer._load(param, rows, shard_id)
    return load

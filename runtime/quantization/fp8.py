"""FP8 (W8A8) linear layers: float8_e4m3fn weights with a scale per output row, activations
quantized per token as they arrive (kernels/fp8_linear.py).

Checkpoint parameters (compressed-tensors and fbgemm_fp8 alike): `weight` [N, K] fp8, and
`weight_scale` [N, 1] (per channel) or one value per checkpoint tensor (per tensor: a merged
q/k/v layer gets three, expanded to its rows at load, which computes the same products);
`input_scale` too for static-activation checkpoints (read, unused). Run time: `weight`
[N, K] fp8 and `weight_scale` [N] fp32.

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
from treadle.runtime.models import ops
from treadle.runtime.quantization.base import QuantMethod, new_param, replace_param


class Fp8Method(QuantMethod):
    name = "fp8"

    def create_weights(self, layer: nn.Module) -> None:
        n, k, parts = layer.out_local, layer.in_local, len(layer.shard_sizes)
        new_param(layer, "weight", (n, k), FP8_DTYPE, output_dim=0, input_dim=1)
        if self.qc.weight_strategy == "channel":
            new_param(layer, "weight_scale", (n, 1), torch.float32, output_dim=0)
        else:
            new_param(layer, "weight_scale", (parts,), torch.float32, per_shard=True)
        if self.qc.static_input_scale:
            new_param(layer, "input_scale", (parts,), torch.float32, per_shard=True)

    def process_after_loading(self, layer: nn.Module) -> None:
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
        w, scale = quantize_weight_ref(layer.weight.data)
        replace_param(layer, "weight", w)
        replace_param(layer, "weight_scale", scale)

    def input_quant(self, layer: nn.Module, x: torch.Tensor | Fp8Act) -> ActQuant | None:
        if self.kernels(x) and wants_quantized_input(x.shape[0], layer.out_local, layer.in_local):
            return ActQuant(self.qc.activation_scale_ub)
        return None

    def apply(self, layer: nn.Module, x: torch.Tensor | Fp8Act, bias: torch.Tensor | None) -> torch.Tensor:
        """x as it is, or (on the GPU, from a kernel that fused `input_quant`'s quantization) an Fp8Act."""
        if self.kernels(x):
            return fp8_linear(x, layer.weight, layer.weight_scale, bias, self.qc.activation_scale_ub)
        if isinstance(x, Fp8Act):
            x = x.dequantize(x.dtype)
        # the float path's own matmul, so a float model of the dequantized weights is exact
        return ops.linear(x, self.dequantize(layer).to(x.dtype), bias)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return layer.weight.float() * layer.weight_scale[:, None]

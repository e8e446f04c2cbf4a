"""A merged linear layer quantized the way a model's are, for the quantization tests (imported by
test_quantization_kernels and test_int4_mma)."""
from __future__ import annotations

import torch

from treadle.kernels.int4_linear import pack_cols, pack_rows


def quantized_linear(method: str, k: int, outs: list[int], group: int, g: torch.Generator, device: str,
                     bias: bool = True, act_and_mul: str | None = None):
    """ColumnParallelLinear(k, outs) with a bias (unless `bias` is False) and random weights on
    `device`, quantized as `method`: "gptq-act" loads a random GPTQ act-order checkpoint (a
    shuffled g_idx, so the layer sorts its inputs: `layer.perm`) through the loader's path; any
    other method (fp8, awq, gptq) quantizes the float weight at load. act_and_mul "silu": a
    SwiGLU gate/up pair, as LlamaMLP marks its gate_up_proj."""
    from treadle.runtime.models.parallel import ColumnParallelLinear
    from treadle.runtime.quantization.base import make_method
    from treadle.runtime.quantization.config import QuantConfig

    n = sum(outs)
    layer = ColumnParallelLinear(k, outs, bias=bias)
    layer.act_and_mul = act_and_mul
    with torch.no_grad():
        layer.weight.normal_(0, 0.1, generator=g)
        if bias:
            layer.bias.normal_(generator=g)
    layer = layer.to(device)
    if method != "gptq-act":
        layer.quant = make_method(QuantConfig(method, "load", group_size=group))
        layer.quant.quantize_loaded(layer)
        return layer
    layer.quant = make_method(QuantConfig("gptq", "gptq", group_size=group, desc_act=True, sym=True, zero_offset=1))
    layer.quant.create_weights(layer)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[torch.randperm(k, generator=g)] = torch.arange(k, dtype=torch.int32) // group
    with torch.no_grad():
        layer.qweight.copy_(pack_rows(torch.randint(0, 16, (k, n), generator=g)))
        layer.qzeros.copy_(pack_cols(torch.randint(0, 16, (k // group, n), generator=g)))
        layer.scales.copy_(torch.rand(k // group, n, generator=g) * 0.05)
        layer.g_idx.copy_(g_idx)
    layer.quant.process_after_loading(layer)
    assert layer.perm is not None
    return layer

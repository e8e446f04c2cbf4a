"""Per-token FP8 quantization fused into the kernels that produce a linear's input
(kernels/fp8_quant.py): RMSNorm, the residual-add RMSNorm and SiLU-and-mul hand an FP8 linear
exactly what `per_token_quant` of their unfused output would (TRITON_INTERPRET=1 on CPU, CUDA on
the GPU), and the FP8 layers of a Llama MLP take it (gpu marker)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.activation import silu_and_mul, silu_and_mul_ref
from treadle.kernels.fp8_linear import fp8_linear, fp8_linear_ref, quantize_weight_ref
from treadle.kernels.fp8_quant import FP8_DTYPE, ActQuant, Fp8Act, per_token_quant, per_token_quant_ref
from treadle.kernels.rmsnorm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _rows(t: int, h: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    # rows from 1e-3 to 1e2 in scale (subnormal and normal fp8 values after the scale), one zero row
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g) * torch.logspace(-3, 2, t)[:, None]
    x[1] = 0
    return x.to(dtype).to(DEV)


def _same(act: Fp8Act, q: torch.Tensor, s: torch.Tensor) -> None:
    assert isinstance(act, Fp8Act) and act.q.dtype == FP8_DTYPE and act.q.shape == q.shape
    assert torch.equal(act.q.view(torch.uint8), q.view(torch.uint8)), "quantized values differ"
    assert torch.equal(act.scale, s), "scales differ"


def _close(act: Fp8Act, ref: Fp8Act) -> None:
    # the torch reference normalises with another rsqrt and summation order, so its x.dtype rows
    # may differ by an ulp, which can move a value to the next fp8 step (2^-3 relative)
    assert isinstance(ref, Fp8Act)
    torch.testing.assert_close(act.scale, ref.scale, rtol=1e-2, atol=0)
    torch.testing.assert_close(act.dequantize(), ref.dequantize(), rtol=0.13,
                               atol=float(ref.scale.max()) * 2 ** -8)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("h", [300, 512])
@pytest.mark.parametrize("ub", [None, 0.5])
def test_rmsnorm_with_quant_is_bit_for_bit_per_token_quant_of_the_norm(dtype, h, ub) -> None:
    x = _rows(6, h, dtype, 0)
    w = (torch.rand(h, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype).to(DEV)
    act = rmsnorm(x, w, 1e-6, ActQuant(ub))
    assert act.dtype == dtype  # what the linear taking it writes
    _same(act, *per_token_quant(rmsnorm(x, w, 1e-6), ub))
    _close(act, rmsnorm_ref(x, w, 1e-6, ActQuant(ub)))  # and the reference agrees


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_add_rmsnorm_with_quant_updates_the_residual_and_leaves_x(dtype) -> None:
    x, res = _rows(5, 384, dtype, 2), _rows(5, 384, dtype, 3)
    w = (torch.rand(384, generator=torch.Generator().manual_seed(4)) + 0.5).to(dtype).to(DEV)
    x_plain, res_plain = x.clone(), res.clone()
    fused_add_rmsnorm(x_plain, res_plain, w, 1e-5)  # the unfused pair: norm in x's dtype, then quantize
    x_in = x.clone()
    act = fused_add_rmsnorm(x, res, w, 1e-5, ActQuant())
    assert torch.equal(res, res_plain), "the residual must be updated as without quant"
    assert torch.equal(x, x_in), "with quant the normed rows go to the Fp8Act, not into x"
    _same(act, *per_token_quant(x_plain))
    x_ref, res_ref = x_in.clone(), _rows(5, 384, dtype, 3)
    _close(act, fused_add_rmsnorm_ref(x_ref, res_ref, w, 1e-5, ActQuant()))
    torch.testing.assert_close(res_ref, res)  # (the interpreter's bf16 rounding is not torch's)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("inter", [300, 2500])  # one block; several (the kernel's two loops)
@pytest.mark.parametrize("ub", [None, 1.0])
def test_silu_and_mul_with_quant_is_bit_for_bit_per_token_quant_of_the_product(dtype, inter, ub) -> None:
    x = _rows(4, 2 * inter, dtype, 5)
    act = silu_and_mul(x, ActQuant(ub))
    assert act.shape == (4, inter) and act.dtype == dtype
    _same(act, *per_token_quant(silu_and_mul(x), ub))
    _close(act, silu_and_mul_ref(x, ActQuant(ub)))
    assert torch.equal(act.scale[1], torch.tensor(1e-12, device=DEV)), "a zero row takes the smallest scale"


@needs_kernel
def test_fp8_linear_takes_an_fp8_act_as_its_own_quantization() -> None:
    g = torch.Generator().manual_seed(6)
    w, ws = quantize_weight_ref(torch.randn(48, 64, generator=g).to(DEV))
    x = torch.randn(33, 64, generator=g).to(torch.bfloat16).to(DEV)
    act = Fp8Act(*per_token_quant(x), x.dtype)
    assert torch.equal(fp8_linear(act, w, ws), fp8_linear(x, w, ws))
    assert torch.equal(fp8_linear_ref(act, w, ws), fp8_linear_ref(x, w, ws))
    # the output takes the dtype the activations were computed in (an fp16 model's stays fp16)
    assert fp8_linear(act._replace(dtype=torch.float16), w, ws).dtype == torch.float16
    with pytest.raises(ValueError, match="unquantized"):  # one row runs the weight-only GEMV
        fp8_linear(Fp8Act(*per_token_quant(x[:1])), w, ws)


def test_fused_quant_rejects_what_is_not_an_act_quant() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="ActQuant"):
        rmsnorm_ref(x, torch.ones(8), 1e-6, quant=0.5)
    with pytest.raises(ValueError, match="ActQuant"):
        silu_and_mul_ref(x, quant="fp8")
    q, s = per_token_quant_ref(x)
    assert torch.equal(Fp8Act(q, s).dequantize(), q.float() * s[:, None])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused path runs on CUDA only")
@pytest.mark.parametrize("m", [1, 16, 200])
def test_fp8_llama_layer_hands_its_projections_fused_quantized_inputs(m) -> None:
    from treadle.runtime.model_config import ModelConfig
    from treadle.runtime.models import ops
    from treadle.runtime.models.llama import LlamaDecoderLayer
    from treadle.runtime.models.parallel import SINGLE
    from treadle.runtime.quantization.base import make_method
    from treadle.runtime.quantization.config import QuantConfig

    cfg = ModelConfig.from_hf_dict(dict(architectures=["LlamaForCausalLM"], hidden_size=256, intermediate_size=640,
                                        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                                        vocab_size=64, rms_norm_eps=1e-5))
    torch.manual_seed(7)
    layer = LlamaDecoderLayer(cfg, 0, SINGLE)
    for p in layer.parameters():
        p.data.normal_(0, 0.05)
    layer = layer.to("cuda", torch.bfloat16)
    for lin in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        lin.quant = make_method(QuantConfig("fp8", "load"))
        lin.quant.quantize_loaded(lin)
    x = torch.randn(m, 256, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, 256, device="cuda", dtype=torch.bfloat16)
    mlp, norm = layer.mlp, layer.post_attention_layernorm
    want_quant = m > 1  # one row: the weight-only GEMV takes bf16 rows
    hint = mlp.input_quant(x)
    assert (hint is not None) == want_quant
    # the norm and the SiLU return Fp8Acts exactly when the next projection quantizes
    r1, r2 = res.clone(), res.clone()
    fused = ops.fused_add_rmsnorm(x.clone(), r1, norm.weight, norm.eps, hint)
    plain = ops.fused_add_rmsnorm(x.clone(), r2, norm.weight, norm.eps)
    assert isinstance(fused, Fp8Act) == want_quant and torch.equal(r1, r2)
    h = mlp.gate_up_proj.silu_and_mul(plain, mlp.down_proj.input_quant(plain))
    assert isinstance(h, Fp8Act) == want_quant
    # and the layer computes bit for bit what the unfused ops do
    unfused = mlp.down_proj(ops.silu_and_mul(mlp.gate_up_proj(plain)))
    assert torch.equal(mlp(fused), unfused)
    assert torch.equal(layer.self_attn.qkv_proj(fused), layer.self_attn.qkv_proj(plain))

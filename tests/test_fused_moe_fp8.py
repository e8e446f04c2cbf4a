"""FP8 experts in kernels/fused_moe.py (weight-only: float8_e4m3fn w13 / w2 with a scale per
output row and per block of inputs, per channel or a checkpoint's 128-wide blocks): both paths
(decode GEMV, sorted grouped GEMM) against fused_moe_ref, and fused_moe_ref against the
definition written out pair by pair over the dequantized weights; bad scales refused."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.fused_moe import fused_moe, fused_moe_ref, moe_route_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
FP8 = torch.float8_e4m3fn


def quantize_experts(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] float -> fp8 [E, N, K] and scales [E, N, cdiv(K, block)] (amax / 448 a row's block)."""
    e, n, k = w.shape
    kb = -(-k // block)
    padded = torch.zeros(e, n, kb * block)
    padded[..., :k] = w
    scale = padded.reshape(e, n, kb, block).abs().amax(-1).clamp(min=1e-8) / 448.0
    q = (padded.reshape(e, n, kb, block) / scale[..., None]).reshape(e, n, kb * block)[..., :k]
    return q.to(FP8).contiguous(), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    return q.float() * scale.repeat_interleave(block, dim=2)[..., :q.shape[2]]


def _case(t, e, k, h, inter, block, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5
    w2 = torch.randn(e, h, inter, generator=g) * inter ** -0.5
    q13, s13 = quantize_experts(w13, block if block else h)
    q2, s2 = quantize_experts(w2, block if block else inter)
    weights, ids = moe_route_ref(torch.randn(t, e, generator=g), k, True)
    return x, q13, s13, q2, s2, weights, ids


def _per_pair(x, w13, w2, weights, ids):
    """The definition over float64 weights, one (token, k) pair at a time."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = w13.shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gu = w13[e].double() @ x[t].double()
            out[t] += float(weights[t, j]) * (w2[e].double() @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:]))
    return out


def test_reference_is_the_definition_over_dequantized_experts():
    x, q13, s13, q2, s2, wts, ids = _case(5, 6, 2, 64, 96, 32, 0, torch.float32)
    got = fused_moe_ref(x, q13, q2, wts, ids, w13_scale=s13, w2_scale=s2)
    want = _per_pair(x, dequantize(q13, s13, 32), dequantize(q2, s2, 32), wts, ids)
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("block", [0, 32], ids=["per-channel", "block32"])
@pytest.mark.parametrize("t,decode", [(1, True), (3, True), (24, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_experts_match_the_reference_on_both_paths(block, t, decode, dtype):
    if dtype == torch.bfloat16 and not decode and not torch.cuda.is_available():
        pytest.skip("GPU-only case: the Triton interpreter's bf16 tl.dot gives garbage (bf16 experts unquantized too)")
    e, k, h, inter = 8, 2, 64, 96  # inter 96: a partial last chunk on the GEMV's 64-wide down steps
    x, q13, s13, q2, s2, wts, ids = _case(t, e, k, h, inter, block, 10 * t + block, dtype)
    x, q13, s13, q2, s2, wts, ids = (v.to(DEV) for v in (x, q13, s13, q2, s2, wts, ids))
    got = fused_moe(x, q13, q2, wts, ids, decode_path=decode, w13_scale=s13, w2_scale=s2).float()
    want = fused_moe_ref(x.float(), q13, q2, wts, ids, w13_scale=s13, w2_scale=s2)
    tol = (2e-4 if dtype == torch.float32 else 2e-2) * want.abs().amax(dim=1, keepdim=True).clamp(min=1e-3)
    assert ((got - want).abs() <= tol).all(), (got - want).abs().max()


def test_bad_expert_scales_are_refused():
    x, q13, s13, q2, s2, wts, ids = _case(2, 4, 2, 64, 64, 32, 1, torch.float32)
    with pytest.raises(ValueError, match="both w13_scale and w2_scale"):
        fused_moe_ref(x, q13, q2, wts, ids, w13_scale=s13)
    with pytest.raises(ValueError, match="w2_scale must be"):
        fused_moe_ref(x, q13, q2, wts, ids, w13_scale=s13, w2_scale=s2[:, :, :1].transpose(1, 2))
    with pytest.raises(ValueError, match="do not cover"):
        fused_moe_ref(x, q13, q2, wts, ids, w13_scale=torch.ones(4, 128, 3), w2_scale=s2)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fused_moe_ref(x, q13.float(), q2, wts, ids, w13_scale=s13, w2_scale=s2)

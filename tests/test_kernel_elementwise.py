"""rmsnorm / rope / silu_and_mul kernels vs their references (CPU: TRITON_INTERPRET=1)."""
from __future__ import annotations

import os

import pytest
import torch

from treadle.kernels.activation import silu_and_mul, silu_and_mul_ref
from treadle.kernels.rmsnorm import fused_add_rmsnorm, fused_add_rmsnorm_ref, rmsnorm, rmsnorm_ref
from treadle.kernels.rope import apply_rope, apply_rope_ref, build_cos_sin_cache

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}


def _rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEV)


# ---------------------------------------------------------------------------- rmsnorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H", [64, 96])
def test_rmsnorm_matches_ref_and_hf_formula(dtype: torch.dtype, H: int) -> None:
    x, w = _rand(5, H, dtype=dtype), _rand(H, dtype=dtype, seed=1)
    out = rmsnorm(x, w, 1e-6)
    torch.testing.assert_close(out, rmsnorm_ref(x, w, 1e-6), **TOL[dtype])
    # HF LlamaRMSNorm: weight * (x32 * rsqrt(mean(x32^2) + eps)).to(dtype)
    x32 = x.float()
    hf = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    torch.testing.assert_close(out, hf, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rmsnorm_in_place(dtype: torch.dtype) -> None:
    x, r, w = _rand(4, 64, dtype=dtype), _rand(4, 64, dtype=dtype, seed=1), _rand(64, dtype=dtype, seed=2)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    fused_add_rmsnorm(x1, r1, w, 1e-5)
    fused_add_rmsnorm_ref(x2, r2, w, 1e-5)
    torch.testing.assert_close(r1, (r.float() + x.float()).to(dtype))
    torch.testing.assert_close(r1, r2)
    torch.testing.assert_close(x1, x2, **TOL[dtype])
    torch.testing.assert_close(x1, rmsnorm_ref(r2, w, 1e-5), **TOL[dtype])


def test_rmsnorm_rejects_bad_arguments() -> None:
    x, w = _rand(4, 64), _rand(64)
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(x, _rand(32), 1e-6)
    with pytest.raises(ValueError, match="x must be"):
        rmsnorm(x.to(torch.int32), w, 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        rmsnorm(_rand(64, 4).t(), _rand(4), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rmsnorm(x, _rand(4, 32), w, 1e-6)
    with pytest.raises(ValueError, match="eps"):
        rmsnorm(x, w, 0.0)
    with pytest.raises(ValueError, match="weight is on"):
        rmsnorm(x, torch.ones(64, device="meta"), 1e-6)


# ---------------------------------------------------------------------------- rope


@pytest.mark.parametrize("D", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope_matches_ref_and_hf_rotate_half(D: int, dtype: torch.dtype) -> None:
    T, Hq, Hk = 5, 4, 2
    cache = build_cos_sin_cache(D, 64, 10000.0, None, DEV)
    pos = torch.tensor([0, 3, 17, 63, 5], device=DEV)
    # q and k as strided views of one fused qkv buffer, as the attention layer produces them
    qkv = _rand(T, (Hq + 2 * Hk) * D, dtype=dtype)
    q, k = qkv[:, : Hq * D].view(T, Hq, D), qkv[:, Hq * D: (Hq + Hk) * D].view(T, Hk, D)
    q0, k0 = q.clone(), k.clone()
    q2, k2 = q.clone(), k.clone()
    apply_rope(q, k, pos, cache)
    apply_rope_ref(q2, k2, pos, cache)
    torch.testing.assert_close(q, q2, **TOL[dtype])
    torch.testing.assert_close(k, k2, **TOL[dtype])
    # HF: x * cos + rotate_half(x) * sin with cos = cat(freqs, freqs).cos()
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    freqs = pos.cpu().float()[:, None] * inv[None]
    cos, sin = torch.cat((freqs, freqs), -1).cos()[:, None], torch.cat((freqs, freqs), -1).sin()[:, None]
    x = q0.float().cpu()
    rot = torch.cat((-x[..., D // 2:], x[..., : D // 2]), -1)
    torch.testing.assert_close(q.float().cpu(), x * cos + rot * sin, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope_with_qk_norm_is_rmsnorm_then_rope(dtype: torch.dtype) -> None:
    # Qwen3's q_norm / k_norm fused into the rotation: each head of the qkv views normalised by
    # its own weight, then rotated; v untouched
    T, Hq, Hk, D = 5, 4, 2, 64
    cache = build_cos_sin_cache(D, 64, 10000.0, None, DEV)
    pos = torch.tensor([0, 3, 17, 63, 5], device=DEV)
    qkv = _rand(T, (Hq + 2 * Hk) * D, dtype=dtype, seed=3) * 3
    before = qkv.clone()
    qw, kw = _rand(D, dtype=dtype, seed=4), _rand(D, dtype=dtype, seed=5)
    q, k = qkv[:, : Hq * D].view(T, Hq, D), qkv[:, Hq * D: (Hq + Hk) * D].view(T, Hk, D)
    # the two-launch path, written out: rmsnorm of every head, then rope
    qn = rmsnorm_ref(q.reshape(-1, D).contiguous(), qw, 1e-6).view(T, Hq, D)
    kn = rmsnorm_ref(k.reshape(-1, D).contiguous(), kw, 1e-6).view(T, Hk, D)
    apply_rope_ref(qn, kn, pos, cache)
    apply_rope(q, k, pos, cache, qk_norm=(qw, kw, 1e-6))
    torch.testing.assert_close(q, qn, **TOL[dtype])
    torch.testing.assert_close(k, kn, **TOL[dtype])
    assert torch.equal(qkv[:, (Hq + Hk) * D:], before[:, (Hq + Hk) * D:])
    q2, k2 = before[:, : Hq * D].view(T, Hq, D).clone(), before[:, Hq * D: (Hq + Hk) * D].view(T, Hk, D).clone()
    apply_rope_ref(q2, k2, pos, cache, qk_norm=(qw, kw, 1e-6))
    torch.testing.assert_close(q2, qn, **TOL[dtype])
    with pytest.raises(ValueError, match="q_weight"):
        apply_rope(q, k, pos, cache, qk_norm=(qw[:8], kw, 1e-6))


def test_apply_rope_leaves_v_alone() -> None:
    D, T = 32, 3
    qkv = _rand(T, 3 * 2 * D)
    before = qkv.clone()
    q, k = qkv[:, : 2 * D].view(T, 2, D), qkv[:, 2 * D: 4 * D].view(T, 2, D)
    apply_rope(q, k, torch.arange(T, device=DEV) + 1, build_cos_sin_cache(D, 8, 10000.0, None, DEV))
    assert torch.equal(qkv[:, 4 * D:], before[:, 4 * D:])
    assert not torch.equal(qkv[:, : 4 * D], before[:, : 4 * D])


@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float8_e5m2])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_apply_rope_with_kv_store_writes_the_rotated_k_and_v_into_their_slots(pool_dtype, qk_norm) -> None:
    # the attention backends' rotate-and-store: the pool rows hold what rope then store_kv
    # would write (k rotated, v as it is, cast to the pool dtype); other rows are untouched
    from treadle.kernels.kv_store import store_kv

    T, Hq, Hk, D, slots_n = 4, 4, 2, 64, 16
    cache = build_cos_sin_cache(D, 64, 10000.0, None, DEV)
    pos = torch.tensor([0, 3, 17, 63], device=DEV)
    slots = torch.tensor([9, 2, 15, 4], device=DEV)
    qkv = _rand(T, (Hq + 2 * Hk) * D, dtype=torch.bfloat16, seed=6) * 2
    norm = (_rand(D, dtype=torch.bfloat16, seed=7), _rand(D, dtype=torch.bfloat16, seed=8), 1e-6) if qk_norm else None

    def views(t):
        return (t[:, : Hq * D].view(T, Hq, D), t[:, Hq * D: (Hq + Hk) * D].view(T, Hk, D),
                t[:, (Hq + Hk) * D:].view(T, Hk, D))

    pools = [(torch.full((slots_n, Hk, D), 0.5, device=DEV).to(pool_dtype),
              torch.full((slots_n, Hk, D), 0.25, device=DEV).to(pool_dtype)) for _ in range(2)]
    ref = qkv.clone()
    q, k, v = views(ref)
    apply_rope_ref(q, k, pos, cache, qk_norm=norm)
    q2, k2, v2 = views(qkv)
    apply_rope(q2, k2, pos, cache, qk_norm=norm, kv_store=(*pools[1], slots, v2))
    torch.testing.assert_close(qkv, ref, **TOL[torch.bfloat16])
    # bit for bit what store_kv (the launch this one replaces) writes from the rotated k and the v
    store_kv(*pools[0], slots, k2, v2)
    for got, want in zip(pools[1], pools[0]):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    fill = torch.full((T, Hk, D), 0.5, device=DEV)
    assert not torch.equal(pools[1][0][slots].float(), fill)
    with pytest.raises(ValueError, match="kv_store"):
        apply_rope(q2, k2, pos, cache, kv_store=(pools[1][0], slots, v2))
    with pytest.raises(ValueError, match=r"k must have shape \[T=2"):  # two slots for four tokens
        apply_rope(q2, k2, pos, cache, kv_store=(*pools[1], slots[:2], v2))


@pytest.mark.parametrize("scaling", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
])
def test_cos_sin_cache_matches_transformers(scaling: dict | None) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    D, theta, n = 64, 500000.0, 300
    params = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
    cfg = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, head_dim=D, max_position_embeddings=512,
                      rope_parameters=params)
    cos, sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1, n, D), torch.arange(n)[None])
    cache = build_cos_sin_cache(D, n, theta, scaling, "cpu")
    torch.testing.assert_close(cache[:, : D // 2], cos[0, :, : D // 2], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cache[:, D // 2:], sin[0, :, : D // 2], atol=1e-6, rtol=1e-6)
    if scaling and scaling["rope_type"] == "llama3":  # the scaling changed something
        assert not torch.allclose(cache, build_cos_sin_cache(D, n, theta, None, "cpu"))


def test_rope_rejects_bad_arguments() -> None:
    cache = build_cos_sin_cache(32, 16, 10000.0, None, DEV)
    q, k, pos = _rand(3, 2, 32), _rand(3, 1, 32), torch.arange(3, device=DEV)
    with pytest.raises(ValueError, match="positions"):
        apply_rope(q, k, pos.int(), cache)
    with pytest.raises(ValueError, match="k must be"):
        apply_rope(q, _rand(3, 1, 16), pos, cache)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        apply_rope(q, k, pos, cache.double())
    with pytest.raises(ValueError, match="head dim"):
        apply_rope(_rand(3, 2, 64)[..., ::2], _rand(3, 1, 64)[..., ::2], pos, cache)
    with pytest.raises(ValueError, match="not supported"):
        build_cos_sin_cache(32, 16, 10000.0, {"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="missing"):
        build_cos_sin_cache(32, 16, 10000.0, {"rope_type": "llama3", "factor": 2.0})


# ---------------------------------------------------------------------------- silu_and_mul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("I", [64, 100])
def test_silu_and_mul_matches_ref(dtype: torch.dtype, I: int) -> None:
    x = _rand(5, 2 * I, dtype=dtype)
    out = silu_and_mul(x)
    assert out.shape == (5, I) and out.dtype == dtype
    torch.testing.assert_close(out, silu_and_mul_ref(x), **TOL[dtype])
    expect = torch.nn.functional.silu(x[:, :I].float()) * x[:, I:].float()
    torch.testing.assert_close(out.float(), expect, **TOL[dtype])


def test_silu_and_mul_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(_rand(3, 7))
    with pytest.raises(ValueError, match="contiguous"):
        silu_and_mul(_rand(8, 3).t())
    with pytest.raises(ValueError, match="fp32"):
        silu_and_mul(_rand(3, 8).to(torch.int64))

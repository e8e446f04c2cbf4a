"""Rotary position embedding, NeoX / HF "rotate_half" layout, applied in place.

For head dim ``D`` the pairs are ``(i, i + D/2)``::

    x = [x1 | x2]                  # x1 = x[..., :D/2], x2 = x[..., D/2:]
    out = [x1*cos - x2*sin | x2*cos + x1*sin]

``cos_sin_cache: [max_pos, D]`` fp32 holds ``cos(pos * inv_freq)`` in its first ``D/2``
columns and ``sin(pos * inv_freq)`` in the last ``D/2``. ``build_cos_sin_cache`` follows
the HF ``rope_type`` formulas for ``default``, ``linear`` and ``llama3``.
Positions must lie in ``[0, max_pos)``: the kernel does not check them (that would need a
host sync); the reference raises an IndexError.

``qk_norm=(q_weight, k_weight, eps)`` first RMS-normalises each head of q and k over its
``D`` values (Qwen3's q_norm / k_norm) in the same pass, with kernels/rmsnorm.py's rounding:
the normalised head is rounded to the dtype, multiplied by its weight, rounded again, then
rotated. It equals rmsnorm then rope as two launches, without the two copies and three
launches that costs a layer at decode.

``kv_store=(k_buffer, v_buffer, slots, v)`` also writes each token's rotated k and its v into
the KV pool rows ``slots[t]`` (cast to the pool dtype, as kernels/kv_store.py's ``store_kv``):
the attention backends' rotate-and-store, one launch a layer instead of two.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from treadle.kernels import pdl
from treadle.kernels.kv_store import check_store, store_kv_ref

__all__ = ["apply_rope", "apply_rope_ref", "build_cos_sin_cache"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def norm_half(x, rstd, w_ptr, d, dtype):
    # kernels/rmsnorm.py's rounding: normalised, rounded, times the weight, rounded
    w = tl.load(w_ptr + d).to(tl.float32)
    return ((x * rstd[:, None]).to(dtype).to(tl.float32) * w[None, :]).to(dtype).to(tl.float32)


@triton.jit
def _rotate_heads(
    x_ptr, cos, sin, w_ptr, eps,
    num_heads, token,
    stride_t, stride_h, dst_ptr,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr, STORE: tl.constexpr,
):
    # Rotates all heads of one token in tiles of [BLOCK_H, HALF]; cos/sin are [HALF] fp32.
    # NORM: each head RMS-normalised by the weight at w_ptr first. STORE: the rotated heads
    # are also written to dst_ptr, a pool row of contiguous [heads, 2 * HALF] (in its dtype).
    d = tl.arange(0, HALF)
    for h0 in range(0, num_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        ptr = x_ptr + token * stride_t + h[:, None] * stride_h + d[None, :]
        mask = (h < num_heads)[:, None]
        x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        if NORM:
            rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
            x1 = norm_half(x1, rstd, w_ptr, d, x_ptr.dtype.element_ty)
            x2 = norm_half(x2, rstd, w_ptr + HALF, d, x_ptr.dtype.element_ty)
        o1 = x1 * cos[None, :] - x2 * sin[None, :]
        o2 = x2 * cos[None, :] + x1 * sin[None, :]
        tl.store(ptr, o1.to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(ptr + HALF, o2.to(x_ptr.dtype.element_ty), mask=mask)
        if STORE:
            # through x's dtype first: the pool holds what store_kv would copy from x
            dst = dst_ptr + h[:, None] * (2 * HALF) + d[None, :]
            tl.store(dst, o1.to(x_ptr.dtype.element_ty).to(dst_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + HALF, o2.to(x_ptr.dtype.element_ty).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr, qw_ptr, kw_ptr, eps,
    v_ptr, k_buf, v_buf, slots_ptr,  # STORE only
    num_q_heads, num_k_heads,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache, stride_vt, stride_buf,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr, STORE: tl.constexpr,
    BLOCK_V: tl.constexpr, PDL: tl.constexpr,
):
    # grid: (T,); one program (normalises and) rotates every q and k head of one token and,
    # with STORE, writes its k and v into the pool row slots[token].
    token = tl.program_id(0).to(tl.int64)
    # positions and slots are written before the step starts, never by a kernel of it, and the
    # table is constant: read before the wait (kernels/pdl.py); q, k and v after it
    pos = tl.load(pos_ptr + token)
    d = tl.arange(0, HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + d)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + d)
    k_dst = k_buf
    if STORE:
        slot = tl.load(slots_ptr + token).to(tl.int64)
        k_dst = k_buf + slot * stride_buf
    pdl.wait(PDL)
    pdl.launch_dependents(PDL)
    if STORE:
        row = num_k_heads * 2 * HALF  # v's [Hk, D] row is contiguous in v and in the pool
        for start in range(0, row, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            vals = tl.load(v_ptr + token * stride_vt + offs, mask=offs < row)
            tl.store(v_buf + slot * stride_buf + offs, vals.to(v_buf.dtype.element_ty), mask=offs < row)
    _rotate_heads(q_ptr, cos, sin, qw_ptr, eps, num_q_heads, token, stride_qt, stride_qh, q_ptr,
                  HALF, BLOCK_H, NORM, False)
    _rotate_heads(k_ptr, cos, sin, kw_ptr, eps, num_k_heads, token, stride_kt, stride_kh, k_dst,
                  HALF, BLOCK_H, NORM, STORE)


def check_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
               qk_norm: tuple | None = None) -> None:
    """apply_rope's argument checks (also decode attention's, which rotates the newest token itself)."""
    if qk_norm is not None:
        _check_norm(q, qk_norm)
    for name, t in (("q", q), ("k", k), ("positions", positions), ("cos_sin_cache", cos_sin_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q and k must be [T, heads, D], got {tuple(q.shape)} and {tuple(k.shape)}")
    T, _, D = q.shape
    if k.shape[0] != T or k.shape[2] != D:
        raise ValueError(f"k must be [T={T}, Hk, D={D}], got {tuple(k.shape)}")
    if D % 2 != 0 or D & (D - 1) != 0:
        raise ValueError(f"head dim must be a power of two, got {D}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype:
        raise ValueError(f"q and k must share one of fp32/fp16/bf16, got {q.dtype} and {k.dtype}")
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("q and k must be contiguous in the head dim (stride(-1) == 1)")
    if positions.dim() != 1 or positions.shape[0] != T or positions.dtype != torch.int64:
        raise ValueError(f"positions must be int64 [T={T}], got {positions.dtype} {tuple(positions.shape)}")
    if not positions.is_contiguous():
        raise ValueError("positions must be contiguous")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != D or cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"cos_sin_cache must be fp32 [max_pos, D={D}], got {cos_sin_cache.dtype} {tuple(cos_sin_cache.shape)}")
    if not cos_sin_cache.is_contiguous():
        raise ValueError("cos_sin_cache must be contiguous")


def _check_norm(q: torch.Tensor, qk_norm: tuple) -> None:
    if not isinstance(qk_norm, tuple) or len(qk_norm) != 3:
        raise ValueError("qk_norm must be (q_weight, k_weight, eps)")
    for name, w in zip(("q_weight", "k_weight"), qk_norm[:2]):
        if not isinstance(w, torch.Tensor) or w.shape != (q.shape[-1],) or not w.is_contiguous():
            raise ValueError(f"{name} must be a contiguous [D={q.shape[-1]}] tensor")
        if w.device != q.device or w.dtype not in _DTYPES:
            raise ValueError(f"{name} must be fp32/fp16/bf16 on q's device")


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
               qk_norm: tuple | None = None, kv_store: tuple | None = None) -> None:
    """Rotate ``q: [T, Hq, D]`` and ``k: [T, Hk, D]`` in place by ``positions: [T]`` (Triton),
    each head RMS-normalised first with ``qk_norm=(q_weight [D], k_weight [D], eps)``; with
    ``kv_store=(k_buffer, v_buffer, slots, v)``, also store the rotated k and ``v: [T, Hk, D]``
    at the pool rows ``slots: [T]`` (store_kv's rules and checks).

    q/k may be strided views (e.g. slices of a fused qkv buffer) as long as the head dim is
    contiguous.
    """
    check_rope(q, k, positions, cos_sin_cache, qk_norm)
    if kv_store is not None:
        check_kv_store(k, kv_store)
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"q must be on a CUDA device (got {q.device}); use apply_rope_ref on CPU")
    T, Hq, D = q.shape
    if T == 0:
        return
    half = D // 2
    block_h = max(1, min(triton.next_power_of_2(max(Hq, k.shape[1])), max(1, 4096 // half)))
    qw, kw, eps = qk_norm if qk_norm is not None else (cos_sin_cache, cos_sin_cache, 0.0)
    k_buf, v_buf, slots, v = kv_store if kv_store is not None else (k, k, positions, k)
    row = k.shape[1] * D
    _rope_kernel[(T,)](
        q, k, positions, cos_sin_cache, qw, kw, float(eps),
        v, k_buf, v_buf, slots,
        Hq, k.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0), v.stride(0),
        k_buf.stride(0),
        HALF=half, BLOCK_H=block_h, NORM=qk_norm is not None, STORE=kv_store is not None,
        BLOCK_V=min(triton.next_power_of_2(row), 4096), num_warps=4, **pdl.options(q),
    )


def check_kv_store(k: torch.Tensor, kv_store: tuple) -> None:
    if not isinstance(kv_store, tuple) or len(kv_store) != 4:
        raise ValueError("kv_store must be (k_buffer, v_buffer, slots, v)")
    k_buffer, v_buffer, slots, v = kv_store
    check_store(k_buffer, v_buffer, slots, k, v)
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer), ("slots", slots), ("v", v)):
        if t.device != k.device:
            raise ValueError(f"{name} is on {t.device} but k is on {k.device}")
    if v.dtype != k.dtype:
        raise ValueError(f"v must have k's dtype {k.dtype}, got {v.dtype}")


def apply_rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                   qk_norm: tuple | None = None, kv_store: tuple | None = None) -> None:
    """Pure-torch reference of :func:`apply_rope` (in place, any device, fp32 math)."""
    check_rope(q, k, positions, cos_sin_cache, qk_norm)
    if kv_store is not None:
        check_kv_store(k, kv_store)
    if qk_norm is not None:
        from treadle.kernels.rmsnorm import rmsnorm_ref

        for x, w in ((q, qk_norm[0]), (k, qk_norm[1])):
            x.copy_(rmsnorm_ref(x.reshape(-1, x.shape[-1]), w, qk_norm[2]).view(x.shape))
    half = q.shape[2] // 2
    cs = cos_sin_cache[positions]  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]  # [T, 1, D/2]
    for x in (q, k):
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:]
        x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype))
    if kv_store is not None:
        k_buffer, v_buffer, slots, v = kv_store
        store_kv_ref(k_buffer, v_buffer, slots, k, v)


def _inv_freq(head_dim: int, theta: float, rope_scaling: dict | None) -> torch.Tensor:
    # [D/2] fp32, computed as HF does: 1 / theta ** (arange(0, D, 2) / D)
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponent)
    rope_type = "default" if not rope_scaling else rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(_need(rope_scaling, "factor"))
    if rope_type == "llama3":
        factor = float(_need(rope_scaling, "factor"))
        low = float(_need(rope_scaling, "low_freq_factor"))
        high = float(_need(rope_scaling, "high_freq_factor"))
        old_len = float(_need(rope_scaling, "original_max_position_embeddings"))
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths (low frequencies) are slowed down by `factor`, short ones kept,
        # and the band between is interpolated linearly in old_len / wavelen.
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        ramp = (old_len / wavelen - low) / (high - low)
        blended = (1 - ramp) * scaled / factor + ramp * scaled
        in_band = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(in_band, blended, scaled)
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported (default, linear, llama3)")


def _need(cfg: dict, key: str):
    if key not in cfg:
        raise ValueError(f"rope_scaling is missing {key!r}: {cfg}")
    return cfg[key]


def build_cos_sin_cache(
    head_dim: int,
    max_positions: int,
    theta: float,
    rope_scaling: dict | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``[max_positions, head_dim]`` fp32: cos(pos * inv_freq) | sin(pos * inv_freq).

    ``rope_scaling`` is the HF config dict (``rope_type`` or legacy ``type``): ``default``,
    ``linear`` (``factor``) or ``llama3`` (``factor``, ``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position_embeddings``).
    """
    if head_dim <= 0 or head_dim % 2 != 0:
        raise ValueError(f"head_dim must be a positive even number, got {head_dim}")
    if max_positions <= 0:
        raise ValueError(f"max_positions must be positive, got {max_positions}")
    inv_freq = _inv_freq(head_dim, float(theta), rope_scaling)
    pos = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # [max_pos, D/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device=device)

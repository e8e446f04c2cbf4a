"""Attention backends behind one interface: `plan` (host-side metadata, outside any CUDA
graph) and `forward` (rotates q and k when given `rope`, stores the new K/V into the pool, then
attends; graph-safe on GPU; the Triton backend rotates and stores in one kernel, and at decode
inside the attention kernel itself).

`torch` works on any device (the kernels' *_ref functions); `triton` is the GPU default.
Both take the pool in the model dtype or as an fp8_e5m2 KV cache (`kv_cache_dtype`): new K/V
are cast on store, and gathered K/V are upcast before the dot products (the refs compute in
fp32, the kernels in the dot operand dtype), so q and the output stay in the model dtype.
"""
from __future__ import annotations

from typing import Protocol

import torch

from treadle.kernels import decode_attention as dec
from treadle.kernels import extend_attention as ext
from treadle.kernels import kv_store
from treadle.kernels import rope as rope_k
from treadle.radix_cache import TokenToKVPool
from treadle.runtime import cpu_ops
from treadle.runtime.forward_batch import ForwardBatch, ForwardMode
from treadle.runtime.models import ops


class AttentionBackend(Protocol):
    def plan(self, fb: ForwardBatch) -> None:
        """Prepare per-batch metadata (host work). Called once per step before the forward."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                fb: ForwardBatch, scale: float, rope: tuple | None = None) -> torch.Tensor:
        """Store k, v [T, Hk, D] at fb.out_cache_loc in `layer`'s pool, then return the
        attention output [T, Hq, D] of q [T, Hq, D] over each request's cached + new keys.
        rope = (positions [T], cos_sin, qk_norm or None): q and k are first rotated in place
        (models/ops.apply_rope's arguments)."""


class TorchAttentionBackend:
    def __init__(self, kv_pool: TokenToKVPool, req_to_token: torch.Tensor) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token

    def plan(self, fb: ForwardBatch) -> None:
        pass

    def forward(self, q, k, v, layer, fb, scale, rope=None):
        if rope is not None:
            ops.apply_rope(q, k, *rope)
        k_buf, v_buf = self.kv_pool.get_kv(layer)
        kv_store.store_kv_ref(k_buf, v_buf, fb.out_cache_loc, k, v)
        o = torch.empty_like(q)
        if fb.mode is ForwardMode.DECODE and cpu_ops.usable(q, k_buf) and q.stride(1) == q.shape[2] \
                and q.stride(2) == 1 and self.req_to_token.dtype == torch.int32:
            # float32 CPU: one C pass (runtime/cpu_ops.c) instead of the ref's dozen tensor ops
            cpu_ops.decode_attention(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                     fb.seq_lens, scale)
        elif fb.mode is ForwardMode.DECODE:
            dec.decode_attention_ref(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                     fb.seq_lens, scale)
        else:
            ext.extend_attention_ref(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                     fb.prefix_lens, fb.extend_lens, fb.extend_start_loc, scale)
        return o


class TritonAttentionBackend:
    """Triton kernels; the decode workspace is allocated once so CUDA graphs can replay it."""

    def __init__(self, kv_pool: TokenToKVPool, req_to_token: torch.Tensor) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token

    def plan(self, fb: ForwardBatch) -> None:
        # Lengths come from the host lists, so no layer has to read them back from the GPU
        # (a device sync per layer would serialise CPU launch work with GPU compute).
        max_seq = max(fb.seq_lens_cpu) if fb.seq_lens_cpu else 1
        num_kv_heads = self.kv_pool.k_buffers[0].shape[1]
        fb.attn_meta = {
            "max_seq_len": max_seq,
            "max_extend_len": max(fb.extend_lens_cpu) if fb.extend_lens_cpu else 1,
            "kv_splits": dec.default_kv_splits(fb.batch_size, num_kv_heads, max_seq, q_device(self.kv_pool)),
        }

    def forward(self, q, k, v, layer, fb, scale, rope=None):
        k_buf, v_buf = self.kv_pool.get_kv(layer)
        if (rope is not None and fb.mode is ForwardMode.DECODE and fused_rope()
                and q.shape[-1] >= dec.NEW_TOKEN_MIN_HEAD_DIM):
            # stage 1 of the decode attention rotates q and the new key and stores it: no rope launch
            positions, cos_sin, qk_norm = rope
            o = torch.empty_like(q)
            meta = fb.attn_meta
            dec.decode_attention(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices, fb.seq_lens, scale,
                                 max_kv_splits=meta["kv_splits"], max_seq_len=meta["max_seq_len"],
                                 new=dec.NewToken(k, v, fb.out_cache_loc, positions, cos_sin, qk_norm))
            return o
        if rope is not None:
            positions, cos_sin, qk_norm = rope
            rope_k.apply_rope(q, k, positions, cos_sin, qk_norm, kv_store=(k_buf, v_buf, fb.out_cache_loc, v))
        else:
            kv_store.store_kv(k_buf, v_buf, fb.out_cache_loc, k, v)
        o = torch.empty_like(q)
        if fb.mode is ForwardMode.DECODE:
            meta = fb.attn_meta
            dec.decode_attention(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                 fb.seq_lens, scale, max_kv_splits=meta["kv_splits"],
                                 max_seq_len=meta["max_seq_len"])
        else:
            ext.extend_attention(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                 fb.prefix_lens, fb.extend_lens, fb.extend_start_loc, scale,
                                 max_extend_len=fb.attn_meta["max_extend_len"])
        return o


def fused_rope() -> bool:
    """Whether decode steps rotate and store the new token inside the attention kernel
    (kernels/decode_attention.py's NewToken): on unless TREADLE_FUSED_ROPE=0."""
    return ops.fusion("TREADLE_FUSED_ROPE") != "0"


def q_device(kv_pool: TokenToKVPool) -> torch.device:
    return kv_pool.k_buffers[0].device


def create_attention_backend(name: str, device: torch.device, kv_pool: TokenToKVPool,
                             req_to_token: torch.Tensor) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttentionBackend(kv_pool, req_to_token)
    if name == "triton":
        if device.type != "cuda":
            raise ValueError("attention_backend 'triton' needs a CUDA device; use 'torch' on CPU")
        return TritonAttentionBackend(kv_pool, req_to_token)
    raise ValueError(f"unknown attention backend {name!r}; choose auto, torch or triton")

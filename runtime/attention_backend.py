"""Attention backends behind one interface: `plan` (host-side metadata, outside any CUDA
graph) and `forward` (stores the new K/V into the pool, then attends; graph-safe on GPU).

`torch` works on any device (the kernels' *_ref functions); `triton` is the GPU default.
"""
from __future__ import annotations

from typing import Protocol

import torch

from treadle.kernels import decode_attention as dec
from treadle.kernels import extend_attention as ext
from treadle.kernels import kv_store
from treadle.radix_cache import TokenToKVPool
from treadle.runtime.forward_batch import ForwardBatch, ForwardMode


class AttentionBackend(Protocol):
    def plan(self, fb: ForwardBatch) -> None:
        """Prepare per-batch metadata (host work). Called once per step before the forward."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                fb: ForwardBatch, scale: float) -> torch.Tensor:
        """Store k, v [T, Hk, D] at fb.out_cache_loc in `layer`'s pool, then return the
        attention output [T, Hq, D] of q [T, Hq, D] over each request's cached + new keys."""


class TorchAttentionBackend:
    def __init__(self, kv_pool: TokenToKVPool, req_to_token: torch.Tensor) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token

    def plan(self, fb: ForwardBatch) -> None:
        pass

    def forward(self, q, k, v, layer, fb, scale):
        k_buf, v_buf = self.kv_pool.get_kv(layer)
        kv_store.store_kv_ref(k_buf, v_buf, fb.out_cache_loc, k, v)
        o = torch.empty_like(q)
        if fb.mode is ForwardMode.DECODE:
            dec.decode_attention_ref(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                     fb.seq_lens, scale)
        else:
            ext.extend_attention_ref(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                     fb.prefix_lens, fb.extend_lens, fb.extend_start_loc, scale)
        return o


class TritonAttentionBackend:
    """Triton kernels; the decode workspace is allocated once so CUDA graphs can replay it."""

    def __init__(self, kv_pool: TokenToKVPool, req_to_token: torch.Tensor, max_kv_splits: int = 16) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.max_kv_splits = max_kv_splits

    def plan(self, fb: ForwardBatch) -> None:
        pass

    def forward(self, q, k, v, layer, fb, scale):
        k_buf, v_buf = self.kv_pool.get_kv(layer)
        kv_store.store_kv(k_buf, v_buf, fb.out_cache_loc, k, v)
        o = torch.empty_like(q)
        if fb.mode is ForwardMode.DECODE:
            dec.decode_attention(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                 fb.seq_lens, scale, max_kv_splits=self.max_kv_splits)
        else:
            ext.extend_attention(q, k_buf, v_buf, o, self.req_to_token, fb.req_pool_indices,
                                 fb.prefix_lens, fb.extend_lens, fb.extend_start_loc, scale)
        return o


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

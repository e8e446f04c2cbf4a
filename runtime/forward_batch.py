"""ForwardBatch: everything one model forward needs, built by the scheduler for one step.

An EXTEND batch computes `extend_lens[b]` new tokens for request b on top of `prefix_lens[b]`
tokens whose KV is already in the pool (a prefill chunk, a cache-hit remainder, or the forced
tokens of a jump-forward). A DECODE batch computes exactly one token per request.

    req_to_token[req_pool_indices[b], 0 : seq_lens[b]]  = the request's KV slots after this step
    out_cache_loc[extend_start_loc[b] : + extend_lens[b]] = the slots its new tokens write
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch


class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64 KV slots to write
    req_pool_indices: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64, after this step
    prefix_lens: torch.Tensor  # [B] int64 (decode: seq_lens - 1)
    extend_lens: torch.Tensor  # [B] int64 (decode: ones)
    extend_start_loc: torch.Tensor  # [B] int64
    logits_indices: torch.Tensor  # [N] rows of the hidden states whose logits are needed
    # host copies for planning without a device sync
    seq_lens_cpu: list[int] = field(default_factory=list)
    extend_lens_cpu: list[int] = field(default_factory=list)
    attn_backend: Any = None  # set by the model runner
    attn_meta: Any = None  # backend-specific plan

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def build(cls, mode: ForwardMode, input_ids: list[int] | torch.Tensor, positions: list[int],
              out_cache_loc: torch.Tensor, req_pool_indices: list[int], prefix_lens: list[int],
              extend_lens: list[int], logits_indices: list[int], device: torch.device) -> "ForwardBatch":
        """Build from host lists with one host->device copy (from pinned memory on CUDA, so
        it does not wait for the GPU). ``input_ids`` may already be a device tensor (the
        overlap scheduler feeds the previous step's sampled tokens without a host round trip)."""
        starts, acc = [], 0
        for n in extend_lens:
            starts.append(acc)
            acc += n
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
        on_device = isinstance(input_ids, torch.Tensor)
        head = positions if on_device else list(input_ids) + positions
        tail = list(req_pool_indices) + seq_lens + list(prefix_lens) + list(extend_lens) + starts + list(logits_indices)
        host = torch.cat((torch.tensor(head, dtype=torch.int64), out_cache_loc.to(device="cpu", dtype=torch.int64),
                          torch.tensor(tail, dtype=torch.int64)))
        sizes = ([] if on_device else [len(input_ids)]) + [len(positions), len(out_cache_loc)] + [len(extend_lens)] * 5 \
            + [len(logits_indices)]
        views = list(to_device(host, device).split(sizes))
        ids = input_ids.to(device=device, dtype=torch.int64) if on_device else views.pop(0)
        pos, loc, rows, seq, prefix, ext, start, logit_rows = views
        return cls(mode=mode, input_ids=ids, positions=pos, out_cache_loc=loc, req_pool_indices=rows,
                   seq_lens=seq, prefix_lens=prefix, extend_lens=ext, extend_start_loc=start,
                   logits_indices=logit_rows,
                   seq_lens_cpu=seq_lens, extend_lens_cpu=list(extend_lens))


def to_device(values: list | torch.Tensor, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Host values (a list, or a CPU tensor) as a tensor on ``device``. On CUDA the copy is
    staged in pinned memory and does not block the host (a copy from pageable memory waits
    for the GPU's queued work)."""
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)

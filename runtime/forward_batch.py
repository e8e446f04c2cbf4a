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
    def build(cls, mode: ForwardMode, input_ids: list[int], positions: list[int],
              out_cache_loc: torch.Tensor, req_pool_indices: list[int], prefix_lens: list[int],
              extend_lens: list[int], logits_indices: list[int], device: torch.device) -> "ForwardBatch":
        """Build from host lists; one host->device copy per field."""
        starts, acc = [], 0
        for n in extend_lens:
            starts.append(acc)
            acc += n
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64).to(device, non_blocking=True)

        return cls(mode=mode, input_ids=t(input_ids), positions=t(positions),
                   out_cache_loc=out_cache_loc.to(device, non_blocking=True),
                   req_pool_indices=t(req_pool_indices), seq_lens=t(seq_lens),
                   prefix_lens=t(prefix_lens), extend_lens=t(extend_lens),
                   extend_start_loc=t(starts), logits_indices=t(logits_indices),
                   seq_lens_cpu=seq_lens, extend_lens_cpu=list(extend_lens))

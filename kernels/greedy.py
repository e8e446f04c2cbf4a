"""The greedy answer of a batch of logits in one launch: each row's first argmax and whether the
row holds only values below +inf (no NaN, no +inf: a row that fails that has no distribution,
and its request fails alone, runtime/sampler.py).

    logits [B, V] fp32  ->  ids [B] int64 (the first index of the row's max), ok [B] bool

torch's way is three launches a step (argmax, the comparison, its all-reduce); on an H100 they
took 46 us a decode step for llama3-8b's 128,256-token rows, 1-2% of a batch-1 step
(benchmarks/results/profile_decode_llama3-8b_awq_bs1_nopdl_h100.log). Here each program takes
BLOCK tokens of a row (grid (B, cdiv(V, BLOCK))), writes its max, the first index of it and
whether its tokens are all below +inf, then takes a ticket of its row: the program that takes
the last one reduces the row's parts (kernels/fused_moe.py's router hands over the same way).
A row with a NaN or +inf has ok False and an id that means nothing (the sampler replaces it).
`greedy_argmax_ref` is the torch version: the reference and the CPU path.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["greedy_argmax", "greedy_argmax_ref", "BLOCK"]

BLOCK = 2048


@triton.jit
def _greedy_kernel(logits_ptr, ids_ptr, ok_ptr, part_max_ptr, part_idx_ptr, part_bad_ptr, tickets_ptr,
                   V, stride_b, BLOCK: tl.constexpr, PARTS: tl.constexpr):
    # grid: (B, cdiv(V, BLOCK))
    b = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    offs = p * BLOCK + tl.arange(0, BLOCK)
    mask = offs < V
    x = tl.load(logits_ptr + b * stride_b + offs, mask=mask, other=float("-inf"))
    bad = tl.max((~(x < float("inf"))).to(tl.int32), axis=0)  # a NaN or +inf in this part
    m = tl.max(tl.where(x == x, x, float("-inf")), axis=0)  # NaN aside (the row is bad anyway)
    idx = tl.min(tl.where(x == m, offs, V), axis=0)  # the first index of the part's max
    part = b * PARTS + p
    tl.store(part_max_ptr + part, m)
    tl.store(part_idx_ptr + part, idx)
    tl.store(part_bad_ptr + part, bad)
    tl.debug_barrier()
    ticket = tl.atomic_add(tickets_ptr + b, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(1) - 1:
        tl.debug_barrier()
        ps = tl.arange(0, PARTS)
        pmask = ps < tl.num_programs(1)
        pm = tl.load(part_max_ptr + b * PARTS + ps, mask=pmask, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(part_idx_ptr + b * PARTS + ps, mask=pmask, other=V, cache_modifier=".cg")
        pb = tl.load(part_bad_ptr + b * PARTS + ps, mask=pmask, other=0, cache_modifier=".cg")
        best = tl.max(pm, axis=0)
        first = tl.min(tl.where(pm == best, pi, V), axis=0)  # parts cover increasing ranges
        tl.store(ids_ptr + b, tl.minimum(first, V - 1).to(tl.int64))
        tl.store(ok_ptr + b, (tl.max(pb, axis=0) == 0).to(tl.int8))
        tl.atomic_xchg(tickets_ptr + b, 0, sem="relaxed", scope="gpu")  # ready for the next launch


_TICKETS: dict[torch.device, torch.Tensor] = {}


def _tickets(rows: int, device: torch.device) -> torch.Tensor:
    """int32 zeros (the kernel leaves them zero), one a row, kept per device and grown as needed."""
    t = _TICKETS.get(device)
    if t is None or t.numel() < rows:
        t = torch.zeros(max(rows, 256), dtype=torch.int32, device=device)
        _TICKETS[device] = t
    return t


def greedy_argmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B] int64, ok [B] bool) of fp32 logits [B, V] (Triton: CUDA, or TRITON_INTERPRET=1)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError("logits must be a float32 [B, V] tensor")
    if logits.shape[1] == 0 or logits.stride(1) != 1:
        raise ValueError("logits need at least one column, contiguous along V")
    if logits.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"logits must be on a CUDA device (got {logits.device}); use greedy_argmax_ref on CPU")
    b, v = logits.shape
    ids = torch.empty(b, dtype=torch.int64, device=logits.device)
    ok = torch.empty(b, dtype=torch.bool, device=logits.device)
    if b == 0:
        return ids, ok
    parts = triton.cdiv(v, BLOCK)
    pad = triton.next_power_of_2(parts)
    part_max = torch.empty(b * pad, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(b * pad, dtype=torch.int32, device=logits.device)
    part_bad = torch.empty(b * pad, dtype=torch.int32, device=logits.device)
    _greedy_kernel[(b, parts)](logits, ids, ok.view(torch.int8), part_max, part_idx, part_bad,
                               _tickets(b, logits.device), v, logits.stride(0), BLOCK=BLOCK, PARTS=pad, num_warps=4)
    return ids, ok


def greedy_argmax_ref(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's three launches: (logits.argmax(-1), (logits < inf).all(-1))."""
    return logits.argmax(dim=-1), (logits < float("inf")).all(dim=-1)

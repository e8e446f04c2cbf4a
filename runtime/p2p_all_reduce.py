"""All-reduce of small tensors between the GPUs of one host through peer (NVLink) memory.

A decode step all-reduces two activations per layer, 8 KB at batch 1 and 2 MB at batch 256
for llama3-8b. NCCL takes 14-38 us for each of those inside a CUDA graph on two H200s; with a
buffer that every rank has mapped (torch's symmetric memory) the same sums take 7-19 us
(`benchmarks/bench_all_reduce.py`, results/all_reduce_cuda.json). Each call copies the input
into this rank's buffer and runs one kernel that waits for the peers at a barrier, then either
  - one-shot (small tensors): every rank reads all ranks' buffers and sums the whole tensor, or
  - two-shot (larger): every rank sums one slice, then gathers the others' slices,
writing a new tensor. Anything larger than the buffer (prefill chunks) stays on NCCL, whose
ring is bandwidth-optimal there. No NVLink multicast (multimem) is used.

The sums are in fp32 and rounded once, like NCCL's, so for two ranks they are bit-identical.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from treadle.runtime.distributed import min_across_ranks
from treadle.runtime.models.parallel import ParallelContext

log = logging.getLogger(__name__)

_OPS = ("one_shot_all_reduce_copy_out", "two_shot_all_reduce_out")
DTYPES = (torch.bfloat16, torch.float32)  # torch 2.11 has no fp16 one-shot kernel


class P2PAllReduce:
    """Sum-all-reduce over a symmetric-memory buffer of `max_bytes`; build it on every rank of
    `group` at once (the buffer's rendezvous is collective). Call `fits(x)` first."""

    # one-shot reads (size - 1) whole peer copies; past this two-shot's extra pass pays off
    # (two H200s: 6.7 vs 10.2 us at 8 KB, 14.8 vs 16.0 at 1 MB, 21.5 vs 19.1 at 2 MB)
    ONE_SHOT_MAX_BYTES = 1 << 20

    def __init__(self, group: dist.ProcessGroup, device: torch.device, max_bytes: int = 4 << 20) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = group.group_name
        self.max_bytes = max_bytes
        self.buf = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self.buf, self.group_name)

    def fits(self, x: torch.Tensor) -> bool:
        nbytes = x.numel() * x.element_size()
        # the kernels move 16-byte vectors (torch refuses sizes that are not 4-byte multiples)
        return (x.is_cuda and x.dtype in DTYPES and x.is_contiguous()
                and 0 < nbytes <= self.max_bytes and nbytes % 16 == 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of `x` over the ranks, as a new tensor (`x` is left as it was)."""
        n = x.numel()
        buf = self.buf.view(x.dtype)[:n]
        out = torch.empty_like(x)
        if n * x.element_size() <= self.ONE_SHOT_MAX_BYTES:
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf, x.view(-1), "sum", self.group_name, out.view(-1))
        else:
            buf.copy_(x.view(-1))
            torch.ops.symm_mem.two_shot_all_reduce_out(buf, "sum", self.group_name, out.view(-1))
        return out


def unavailable_reason(device: torch.device) -> str | None:
    """Why this rank's GPU cannot use peer memory (None: it can)."""
    if not hasattr(torch.ops, "symm_mem") or not all(hasattr(torch.ops.symm_mem, op) for op in _OPS):
        return f"torch {torch.__version__} lacks symm_mem.{'/'.join(_OPS)}"
    me = device.index if device.index is not None else torch.cuda.current_device()
    for other in range(torch.cuda.device_count()):
        if other != me and not torch.cuda.can_device_access_peer(me, other):
            return f"GPU {me} cannot access GPU {other}'s memory (no P2P)"
    return None


def create_p2p_all_reduce(ctx: ParallelContext, device: torch.device, nnodes: int) -> P2PAllReduce | None:
    """Every rank of `ctx.group` calls this together; all get a P2PAllReduce or all get None (a
    rank that cannot map its peers' memory makes every rank keep NCCL, so that their
    collectives stay matched). None at once off CUDA or across hosts (NCCL / gloo only)."""
    if device.type != "cuda" or nnodes != 1 or dist.get_backend(ctx.group) != "nccl":
        return None
    why = unavailable_reason(device)
    if not min_across_ranks(int(why is None), ctx, device):
        log.info("tensor parallel: all-reduce through NCCL only (%s)", why or "a peer rank cannot use peer memory")
        return None
    comm, err = None, None
    try:
        comm = P2PAllReduce(ctx.group, device)
    except Exception as e:  # no peer mapping in this driver/container: keep NCCL
        err = e
    if not min_across_ranks(int(comm is not None), ctx, device):
        log.warning("tensor parallel: peer-memory all-reduce unavailable (%s); using NCCL",
                    f"{type(err).__name__}: {err}" if err else "failed on a peer rank")
        return None
    assert comm is not None
    log.info("tensor parallel: all-reduce of up to %d KiB through peer memory, NCCL above", comm.max_bytes >> 10)
    return comm

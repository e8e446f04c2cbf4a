"""Process-group setup for tensor parallelism.

Every rank of a TP group meets at one TCP rendezvous (`--dist-init-addr host:port`, served by
global rank 0) and joins one `torch.distributed` group: NCCL for the model's collectives on
CUDA, gloo on CPU. A gloo group hands out the endpoints of the scheduler's control channel
(tp_control.py) at startup, so that never touches the GPU. Every wait is bounded by
`dist_timeout_s`: a rank that cannot reach the rendezvous, or a peer that died, raises instead
of hanging.

Ranks are numbered node-major: global rank = node_rank * (tp_size // nnodes) + local rank.
"""
from __future__ import annotations

import socket
from datetime import timedelta
from typing import Iterator, NamedTuple

import torch
import torch.distributed as dist

from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.model_config import ModelConfig
from treadle.runtime.models.parallel import SINGLE, ParallelContext


class TPGroup(NamedTuple):
    """This process's membership: `ctx` for the model's collectives, `control` (a gloo
    group) for setting up the scheduler's control channel."""
    ctx: ParallelContext
    control: object


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"dist_init_addr must be host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the rendezvous binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def local_ranks(args: EngineArgs) -> range:
    """The global ranks this node runs."""
    per_node = args.tp_size // args.nnodes
    return range(args.node_rank * per_node, (args.node_rank + 1) * per_node)


def check_tp_config(cfg: ModelConfig, tp_size: int) -> None:
    """Raise ValueError before any process starts when the model cannot be split tp_size ways
    (the layers would raise too, but by then the other ranks are waiting in a collective)."""
    if tp_size == 1:
        return
    if cfg.num_heads % tp_size:
        raise ValueError(
            f"tp_size {tp_size} must divide num_attention_heads {cfg.num_heads} "
            f"(num_key_value_heads {cfg.num_kv_heads}); try one of {_divisors(cfg.num_heads)}")
    kv = cfg.num_kv_heads
    if (kv >= tp_size and kv % tp_size) or (kv < tp_size and tp_size % kv):
        raise ValueError(
            f"tp_size {tp_size} must divide num_key_value_heads {kv} or be a multiple of it "
            f"(num_attention_heads {cfg.num_heads})")
    if cfg.intermediate_size % tp_size:
        raise ValueError(f"tp_size {tp_size} must divide intermediate_size {cfg.intermediate_size}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def init_tp_group(rank: int, args: EngineArgs, device_type: str) -> TPGroup:
    """Join the TP group as global `rank` (blocking until all tp_size ranks arrive, at most
    dist_timeout_s). Raises RuntimeError naming the rendezvous address on failure."""
    assert args.dist_init_addr, "the Engine or tp_worker.main fills dist_init_addr in"
    host, port = parse_addr(args.dist_init_addr)
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a torch.distributed group: shut the other "
                           "tensor-parallel Engine down first")
    timeout = timedelta(seconds=args.dist_timeout_s)
    backend = "nccl" if device_type == "cuda" else "gloo"
    joined = False
    try:
        store = dist.TCPStore(host, port, args.tp_size, is_master=rank == 0, timeout=timeout,
                              wait_for_workers=False)
        # wait for every rank on the store first: an init_process_group that times out leaves
        # torch's group counter advanced, and the next group's ranks would not find each other
        if store.add("treadle/arrived", 1) == args.tp_size:
            store.set("treadle/all_arrived", "1")
        store.wait(["treadle/all_arrived"], timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=args.tp_size, timeout=timeout)
        joined = True
        control = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    except Exception as e:  # a connect or store timeout: say where and how long
        if joined:
            dist.destroy_process_group()
        raise RuntimeError(
            f"tensor-parallel rank {rank} of {args.tp_size} could not form the process group at "
            f"{host}:{port} within {args.dist_timeout_s:g}s (dist_timeout_s): is every node started and "
            f"is the address reachable from each? ({type(e).__name__}: {e})") from e
    return TPGroup(ParallelContext(rank, args.tp_size, dist.group.WORLD), control)


def destroy_tp_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def min_across_ranks(value: int, ctx: ParallelContext, device: torch.device) -> int:
    """The smallest of every rank's `value`: ranks must agree on sizes the scheduler reads
    (the KV pool), or their schedules, and so their collectives, would diverge."""
    if ctx.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=ctx.group)
    return int(t.item())


def dummy_checkpoint(cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                     seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The random weights a tp_size=1 runner would draw (`init_dummy_weights` on the whole
    model), as HF-named full tensors, so that each rank's weight loaders keep their slice and
    TP runs the very model tp_size=1 runs. Builds the full model once on `device`."""
    from treadle.runtime.models.registry import build_model
    from treadle.runtime.weights import init_dummy_weights

    with torch.device(device):
        full = build_model(cfg, SINGLE).to(dtype)
    init_dummy_weights(full, seed=seed)
    split = {".qkv_proj.": (".q_proj.", ".k_proj.", ".v_proj."), ".gate_up_proj.": (".gate_proj.", ".up_proj.")}
    for name, p in full.named_parameters():
        for merged, parts in split.items():
            if merged in name:
                sizes = full.get_submodule(name.rsplit(".", 1)[0]).local_sizes  # global sizes at size 1
                for part, piece in zip(parts, p.data.split(sizes, dim=0)):
                    yield name.replace(merged, part), piece
                break
        else:
            yield name, p.data

"""Tensor-parallel all-reduce on the GPUs of one host: NCCL against treadle's peer-memory
all-reduce (runtime/p2p_all_reduce.py), one-shot and two-shot, for the activation sizes a
decode step (rows = batch size) and a prefill chunk reduce. Each figure is the time of one
all-reduce, measured as 64 back-to-back calls captured in a CUDA graph (as the decode step
runs them), and every result is checked against NCCL's.

    python benchmarks/bench_all_reduce.py [--world-size 2] [--hidden 4096] [--output FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROWS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048)
CALLS, REPLAYS = 64, 30


def graph_us(fn) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(REPLAYS):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / REPLAYS / CALLS


def worker(rank: int, port: int, out, args: argparse.Namespace) -> None:
    from treadle.runtime.p2p_all_reduce import P2PAllReduce, unavailable_reason

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world_size, device_id=device)
    why = unavailable_reason(device)
    if why:
        raise SystemExit(f"no peer memory here: {why}")
    dtype = getattr(torch, args.dtype)
    esz = torch.tensor([], dtype=dtype).element_size()
    comm = P2PAllReduce(dist.group.WORLD, device, max_bytes=max(ROWS) * args.hidden * esz)
    default_one_shot = comm.ONE_SHOT_MAX_BYTES
    rows_out = []
    for rows in ROWS:
        x = torch.randn(rows, args.hidden, device=device).to(dtype)
        want = x.clone()
        dist.all_reduce(want)
        row = {"figure": "all_reduce", "rows": rows, "kib": rows * args.hidden * esz / 1024}
        y = x.clone()
        row["nccl_us"] = round(graph_us(lambda: dist.all_reduce(y)), 2)
        for name, limit in (("one_shot", 1 << 62), ("two_shot", 0)):
            comm.ONE_SHOT_MAX_BYTES = limit
            got = comm(x)
            torch.cuda.synchronize()
            row[f"{name}_exact"] = bool(torch.equal(got, want))
            row[f"{name}_us"] = round(graph_us(lambda: comm(x)), 2)
        comm.ONE_SHOT_MAX_BYTES = default_one_shot
        row["treadle_path"] = "one_shot" if x.numel() * esz <= default_one_shot else "two_shot"
        row["best_p2p_over_nccl"] = round(row["nccl_us"] / min(row["one_shot_us"], row["two_shot_us"]), 2)
        rows_out.append(row)
    if rank == 0:
        out.put(rows_out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    if torch.cuda.device_count() < args.world_size:
        raise SystemExit(f"needs {args.world_size} GPUs, found {torch.cuda.device_count()}")
    from figures import write_figures
    from machine import machine_info, spawn_ranks

    meta = {"figure": "meta", **machine_info(), "command": "python " + " ".join(sys.argv),
            "world_size": args.world_size, "hidden": args.hidden, "dtype": args.dtype,
            "calls_per_graph": CALLS, "replays": REPLAYS}
    rows = spawn_ranks(worker, args.world_size, args)
    figures = [meta] + rows
    for f in figures:
        print(json.dumps(f))
    print(f"\n{'rows':>6} {'KiB':>8} {'nccl us':>8} {'1-shot':>8} {'2-shot':>8} {'path':>9} {'best x':>7}")
    for r in rows:
        print(f"{r['rows']:>6} {r['kib']:>8.0f} {r['nccl_us']:>8.2f} {r['one_shot_us']:>8.2f} "
              f"{r['two_shot_us']:>8.2f} {r['treadle_path']:>9} {r['best_p2p_over_nccl']:>7.2f}")
    write_figures(figures, args.output)


if __name__ == "__main__":
    main()

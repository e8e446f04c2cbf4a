"""The per-step control message of tensor parallelism (rank 0 -> followers): gloo's
broadcast_object_list (the channel before tp_control.py) against tp_control's ZMQ push, for
an empty step (the common decode case) and one carrying a 512-token request. Reported: rank
0's time per message (what its step waits on) and the time until the follower holds the
message, over 2 processes on this machine (CPU only: the control plane never touches a GPU).

    python benchmarks/bench_tp_control.py [--n 400] [--output FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _msgs():
    from treadle.runtime.io_struct import TokenizedGenerateReq
    from treadle.runtime.sampling_params import SamplingParams
    from treadle.runtime.tp_worker import StepInputs

    req = TokenizedGenerateReq(rid="r0", input_ids=list(range(512)), sampling_params=SamplingParams())
    return {"empty step": StepInputs([], run_step=True), "step adding a 512-token request":
            StepInputs([("add", req, 0.0)], run_step=True)}


def worker(rank: int, port: int, out, n: int) -> None:
    from treadle.runtime.tp_control import ControlReceiver, ControlSender

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    channel = ControlSender(dist.group.WORLD, 2, "127.0.0.1", 1, 60.0) if rank == 0 else \
        ControlReceiver(dist.group.WORLD, 1, 60.0)
    rows = []
    for name, msg in _msgs().items():
        for how in ("gloo broadcast_object_list", "zmq push (tp_control)"):
            send_s, recv_s = [], []
            for _ in range(n):
                dist.barrier()  # both ranks start together; one message in flight, as step-paced
                t0 = time.perf_counter()
                if how.startswith("gloo"):
                    box = [msg if rank == 0 else None]
                    dist.broadcast_object_list(box, src=0)
                elif rank == 0:
                    channel.send(msg)
                else:
                    channel.recv()
                (send_s if rank == 0 else recv_s).append(time.perf_counter() - t0)
            times = sorted(send_s or recv_s)
            rows.append({"figure": "control_message", "message": name, "channel": how,
                         "rank": rank, "median_us": round(times[len(times) // 2] * 1e6, 1),
                         "p90_us": round(times[int(len(times) * 0.9)] * 1e6, 1)})
    out.put(rows)
    dist.barrier()
    channel.close()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    from figures import write_figures
    from machine import machine_info, spawn_ranks

    rows = spawn_ranks(worker, 2, args.n, replies=2, timeout_s=300)
    rows.sort(key=lambda r: (r["message"], r["channel"], r["rank"]))
    figures = [{"figure": "meta", **machine_info(), "command": "python " + " ".join(sys.argv), "n": args.n}] + rows
    for f in figures:
        print(json.dumps(f))
    print()
    for r in rows:
        who = "rank 0 (sends)" if r["rank"] == 0 else "follower (holds it)"
        print(f"{r['message']:<34} {r['channel']:<28} {who:<20} "
              f"median {r['median_us']:>8.1f} us  p90 {r['p90_us']:>8.1f} us")
    write_figures(figures, args.output)


if __name__ == "__main__":
    main()

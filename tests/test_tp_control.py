"""The tensor-parallel control channel (runtime/tp_control.py) between two real processes:
messages arrive whole and in order, rank 0 does not wait for the follower to read them, a
follower that hears nothing for the timeout raises, and a send to a follower that is gone
calls the liveness check instead of hanging."""
from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from datetime import timedelta

import torch.distributed as dist

from treadle.runtime.distributed import free_port


def _rank0(port: int, results) -> None:
    from treadle.runtime.tp_control import ControlSender

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
                                timeout=timedelta(seconds=30))
        ch = ControlSender(dist.group.WORLD, 2, "127.0.0.1", 1, timeout_s=3.0)
        for i in range(200):
            ch.send({"i": i, "payload": list(range(i))})
        dist.barrier()  # all sent before the follower reads one: sends do not wait for it
        dist.barrier()  # the follower has read all 200 and stopped reading
        dist.barrier()  # ... and has closed its socket
        calls = []

        def check() -> None:
            calls.append(1)
            if len(calls) >= 2:
                raise RuntimeError("follower gone")

        big = b"x" * (64 << 10)
        try:
            for _ in range(10_000):  # no reader: the queue fills, then the check decides
                ch.send(big, check=check)
            results.put(("dead_send", "never blocked"))
        except RuntimeError as e:
            results.put(("dead_send", str(e)))
        ch.close()
        dist.destroy_process_group()
    except BaseException:
        results.put(("error0", traceback.format_exc()))


def _follower(port: int, results) -> None:
    from treadle.runtime.tp_control import ControlReceiver

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2,
                                timeout=timedelta(seconds=30))
        ch = ControlReceiver(dist.group.WORLD, 1, timeout_s=0.5)
        dist.barrier()  # rank 0 has sent all 200
        got = [ch.recv() for _ in range(200)]
        results.put(("in_order", all(m == {"i": i, "payload": list(range(i))} for i, m in enumerate(got))))
        t0 = time.monotonic()
        try:
            ch.recv()
            results.put(("timeout", "returned"))
        except RuntimeError as e:
            results.put(("timeout", (str(e), round(time.monotonic() - t0, 2))))
        dist.barrier()
        ch.close()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results.put(("error1", traceback.format_exc()))


def test_control_channel_between_two_processes():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=f, args=(port, results), daemon=True) for f in (_rank0, _follower)]
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < 3 and not any(k.startswith("error") for k in got):
            k, v = results.get(timeout=120)
            got[k] = v
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert not any(k.startswith("error") for k in got), got
    assert got["in_order"] is True
    msg, waited = got["timeout"]
    assert "rank 1 heard nothing from rank 0 for 0.5s" in msg and 0.4 < waited < 5
    assert got["dead_send"] == "follower gone"

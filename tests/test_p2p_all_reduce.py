"""The peer-memory all-reduce on two GPUs of one host: bit-identical to NCCL's for two ranks
(fp32 sums rounded once) in bf16 and fp32, odd and even sizes, both the one-shot and the
two-shot path, eagerly and replayed inside a CUDA graph with new inputs; the input is left
as it was; tensors it cannot take are refused by `fits` (they go to NCCL)."""
from __future__ import annotations

import traceback

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

MAX_BYTES = 2 << 20  # past ONE_SHOT_MAX_BYTES: both paths are taken


def _cases(comm) -> list[str]:
    import torch.distributed as dist

    bad = []
    rank = dist.get_rank()
    g = torch.Generator("cuda").manual_seed(1234 + rank)
    for dtype in (torch.bfloat16, torch.float32):
        esz = torch.tensor([], dtype=dtype).element_size()
        v = 16 // esz  # elements in a 16-byte vector
        one_shot = comm.ONE_SHOT_MAX_BYTES // esz
        for numel in (v, 4096, 4096 + v, 8 * 4096 + 3 * v, one_shot, one_shot + v, 100_000, MAX_BYTES // esz):
            x = torch.randn(numel, generator=g, device="cuda").to(dtype).view(-1, 1) * (rank + 1)
            keep = x.clone()
            want = x.clone()
            dist.all_reduce(want)
            if not comm.fits(x):
                bad.append(f"fits() refused {dtype} x {numel}")
                continue
            got = comm(x)
            torch.cuda.synchronize()
            if got.shape != x.shape or not torch.equal(got, want):
                err = (got.float() - want.float()).abs().max().item()
                bad.append(f"{dtype} x {numel}: max |p2p - nccl| = {err}")
            if not torch.equal(x, keep):
                bad.append(f"{dtype} x {numel}: the input changed")
        for numel in (1, 7, 4097):  # not whole 16-byte vectors in any of the dtypes: NCCL takes them
            if comm.fits(torch.zeros(numel, dtype=dtype, device="cuda")):
                bad.append(f"fits() took {dtype} x {numel}, not a multiple of 16 bytes")
    big = torch.zeros(MAX_BYTES // 2 + 8, dtype=torch.bfloat16, device="cuda")
    refused = {"over max_bytes": big, "float16": torch.zeros(64, dtype=torch.float16, device="cuda"),
               "not contiguous": torch.zeros(64, 64, device="cuda").t(),
               "int32": torch.zeros(64, dtype=torch.int32, device="cuda"), "cpu": torch.zeros(64),
               "empty": torch.zeros(0, device="cuda")}
    bad += [f"fits() took a tensor {why}" for why, t in refused.items() if comm.fits(t)]

    # captured once, replayed with new contents: the graph's barrier and buffers must be reusable
    for rows in (1, 64):
        x = torch.zeros(rows, 4096, dtype=torch.bfloat16, device="cuda")
        comm(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = comm(x)
        for i in range(4):
            x.copy_(torch.randn(rows, 4096, generator=g, device="cuda"))
            want = x.clone()
            dist.all_reduce(want)
            graph.replay()
            torch.cuda.synchronize()
            if not torch.equal(y, want):
                bad.append(f"graph replay {i} at {rows} rows differs from NCCL")
    return bad


def _worker(rank: int, port: int, results) -> None:
    try:
        import torch.distributed as dist

        from treadle.runtime.models.parallel import ParallelContext
        from treadle.runtime.p2p_all_reduce import create_p2p_all_reduce, unavailable_reason

        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                device_id=device)
        why = unavailable_reason(device)
        if why is not None:
            results.put((rank, "skip", why))
            return
        auto = create_p2p_all_reduce(ParallelContext(rank, 2, dist.group.WORLD), device, nnodes=1)
        if auto is None:
            results.put((rank, "fail", ["create_p2p_all_reduce returned None on a host with P2P"]))
            return
        from treadle.runtime.p2p_all_reduce import P2PAllReduce

        comm = P2PAllReduce(dist.group.WORLD, device, max_bytes=MAX_BYTES)
        results.put((rank, "ok", _cases(comm)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, "fail", [traceback.format_exc()]))


def test_p2p_all_reduce_matches_nccl_on_two_gpus():
    from treadle.runtime.distributed import free_port

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, results), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(2):
            rank, kind, detail = results.get(timeout=240)
            got[rank] = (kind, detail)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    if all(kind == "skip" for kind, _ in got.values()):
        pytest.skip(f"needs P2P access between the GPUs: {got[0][1]}")
    for rank, (kind, detail) in sorted(got.items()):
        assert kind == "ok" and not detail, f"rank {rank}: {kind}: {detail}"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

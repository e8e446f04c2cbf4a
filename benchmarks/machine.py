"""What machine a benchmark ran on, for its results JSON, and its measured copy bandwidth
(the roofline's denominator); shared by the benchmark scripts."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import statistics
import time


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def machine_info(packages: tuple[str, ...] = ("torch", "transformers")) -> dict:
    """CPU model and count, torch threads, platform, Python, versions of ``packages``, the GPU
    and CUDA version where there is one, and the load average at the start (the CPU figures
    are only comparable on a quiet machine)."""
    import torch

    info = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "python": platform.python_version()}
    info.update({p.replace("-", "_"): _version(p) for p in packages})
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    info["loadavg_start"] = os.getloadavg()
    return info


def copy_bandwidth(dev, mib: int, reps: int = 10) -> float:
    """Bytes/s of a device-to-device copy, bytes read + bytes written, median of `reps`."""
    import torch

    dev = torch.device(dev)
    n = mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    src.random_(0, 256)  # not zeros
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            dst.copy_(src)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e-3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    if not torch.equal(dst[:4096], src[:4096]):
        raise RuntimeError("copy check failed")
    del src, dst
    return 2 * n / statistics.median(times)


def matmul_flops(dev, dtype, n: int, reps: int = 10) -> float:
    """FLOP/s of one square n x n x n matmul in `dtype` (2 n^3 FLOPs), median of `reps`: the
    compute peak a dense model's prefill can reach on this device, measured, not the data sheet's."""
    import torch

    dev = torch.device(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=dev, dtype=dtype, generator=g)
    for _ in range(3):
        c = a @ b
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            c = a @ b
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e-3)
        else:
            t0 = time.perf_counter()
            c = a @ b
            times.append(time.perf_counter() - t0)
    del a, b, c
    return 2 * n**3 / statistics.median(times)


def spawn_ranks(target, world_size: int, *args, replies: int = 1, timeout_s: float = 600.0) -> list:
    """Run `target(rank, port, queue, *args)` in `world_size` spawned processes (`port`: a free
    one for their process group); return the lists they put on `queue` (`replies` of them),
    concatenated, once every process has exited."""
    import multiprocessing as mp

    from treadle.runtime.distributed import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, port, queue, *args)) for rank in range(world_size)]
    for proc in procs:
        proc.start()
    rows = []
    for _ in range(replies):
        rows += queue.get(timeout=timeout_s)
    for proc in procs:
        proc.join()
    return rows

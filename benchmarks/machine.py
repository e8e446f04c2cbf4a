"""What machine a benchmark ran on, for its results JSON (shared by the CPU benchmarks)."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform


def _cpu_model() -> str:
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
    """CPU model and count, torch threads, platform, Python, versions of ``packages``, and
    the load average at the start (the CPU figures are only comparable on a quiet machine)."""
    import torch

    info = {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "python": platform.python_version()}
    info.update({p.replace("-", "_"): _version(p) for p in packages})
    info["loadavg_start"] = os.getloadavg()
    return info

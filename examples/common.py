"""Shared by the examples: pick the backend from the command line.

Run an example from this folder. With no arguments it starts an in-process Engine with the
embedded model; with `--url http://127.0.0.1:30000` it runs against a treadle server (start
one with `make serve`). examples/README.md lists the examples and what each prints.

    cd examples && ../.venv/bin/python json_extraction.py [--url http://127.0.0.1:30000]
"""
from __future__ import annotations

import argparse
import time

from treadle.lang import Backend, EngineBackend, RuntimeEndpoint, set_default_backend


def setup(description: str) -> tuple[Backend, argparse.Namespace]:
    """Parse --url, build the backend, make it the default; returns (backend, args)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", default=None, help="treadle server URL (default: in-process Engine)")
    args = parser.parse_args()
    t0 = time.time()
    backend = RuntimeEndpoint(args.url) if args.url else EngineBackend(max_total_tokens=16384)
    print(f"[backend ready in {time.time() - t0:.1f}s: {args.url or 'in-process Engine'}]")
    set_default_backend(backend)
    return backend, args


def close(backend: Backend) -> None:
    if isinstance(backend, EngineBackend):
        backend.shutdown()

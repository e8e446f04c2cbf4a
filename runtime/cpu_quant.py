"""Quantized matmuls for the CPU on GGUF's own blocks (Q4_0, Q4_1, Q8_0), kept packed.

A packed weight holds, for N output rows of K inputs (K a multiple of 32, one block = 32
consecutive weights of a row):
  kind "q4" (Q4_0 and Q4_1): qs uint8 [N, K/2], d and m float32 [N, K/32]; w = q * d + m
  kind "q8" (Q8_0):          qs int8 [N, K],    d float32 [N, K/32];       w = q * d
(nibble order as in GGUF: byte j of a block holds weight j low and weight j + 16 high).

The kernels are `cpu_quant.c` (and the per-layer ops of `cpu_ops.c`, same library), compiled at first use with the machine's instruction set
(`gcc -O3 -march=native -fopenmp`, about a second) into `<cache root>/cpu_kernels/` and called
through ctypes; `$CC` picks the compiler. Each kernel has a pure-torch `*_ref` of the same
signature (dequantize, then matmul) that the tests compare against. Where no compiler works,
`library()` returns None and callers take the dense path (see `gguf_packed.py`).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
from typing import NamedTuple

import numpy as np
import torch

log = logging.getLogger("treadle")

_HERE = os.path.dirname(os.path.abspath(__file__))
# (source, extra flags): cpu_ops.c's float sums may be reordered (vectorized); cpu_quant.c's are
# written out in vectors already and keep one order, so each row's result is batch-invariant
_SOURCES = [(os.path.join(_HERE, "cpu_quant.c"), []),
            (os.path.join(_HERE, "cpu_ops.c"), ["-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"])]
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-std=gnu11"]
_lock = threading.Lock()
_cached: dict[str, ctypes.CDLL | None] = {}


class PackedWeight(NamedTuple):
    """One quantized [N, K] weight matrix (see the module docstring for the layouts)."""

    kind: str  # "q4" or "q8"
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None  # q4 only
    shape: tuple[int, int]  # (N, K)

    def narrow_rows(self, start: int, length: int) -> "PackedWeight":
        m = None if self.m is None else self.m.narrow(0, start, length)
        return PackedWeight(self.kind, self.qs.narrow(0, start, length), self.d.narrow(0, start, length), m,
                            (length, self.shape[1]))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)


def cat_rows(parts: list[PackedWeight]) -> PackedWeight:
    """Stack packed weights of one kind and K along their rows (merged q/k/v, gate/up)."""
    kinds = {p.kind for p in parts}
    ks = {p.shape[1] for p in parts}
    assert len(kinds) == 1 and len(ks) == 1, f"cannot merge weights of kinds {kinds} and K {ks}"
    m = None if parts[0].m is None else _cat([p.m for p in parts])
    return PackedWeight(parts[0].kind, _cat([p.qs for p in parts]), _cat([p.d for p in parts]), m,
                        (sum(p.shape[0] for p in parts), parts[0].shape[1]))


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat of CPU tensors as one memcpy each (numpy's): at load, torch.cat's OpenMP region
    waited for a second thread while the server's other processes held the cores (the
    embedded model's 120 merges took 0.6-0.8 s of a server start; now ~30 ms)."""
    return torch.from_numpy(np.concatenate([t.numpy() for t in tensors]))


# ---- building the library ------------------------------------------------------------------

def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "model name", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def library(cc: str | None = None, cache_dir: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernels, built once per (source, compiler, CPU) and cached on disk; None if
    no compiler can build them here (logged once). Thread-safe."""
    from treadle.runtime.gguf_loader import cache_root

    cc = cc or os.environ.get("CC") or "gcc"
    cache_dir = cache_dir or os.path.join(cache_root(), "cpu_kernels")
    key = f"{cc}|{cache_dir}"
    with _lock:
        if key not in _cached:
            _cached[key] = _build(cc, cache_dir)
        return _cached[key]


def _build(cc: str, cache_dir: str) -> ctypes.CDLL | None:
    import torch  # noqa: F401  (loaded first: the kernels then share torch's libgomp and its threads)

    exe = shutil.which(cc)
    if exe is None:
        log.warning("no C compiler %r found: GGUF weights are dequantized to float32 instead of running "
                    "packed (install gcc, or set CC)", cc)
        return None
    try:
        sources = []
        for src, _ in _SOURCES:
            with open(src, "rb") as f:
                sources.append(f.read())
    except OSError as e:
        log.warning("a CPU kernel source is missing (%s): GGUF weights are dequantized to float32", e)
        return None
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("C compiler %r does not run (%s): GGUF weights are dequantized to float32", cc, e)
        return None
    ident = b"|".join([*sources, repr((_FLAGS, _SOURCES)).encode(), version.encode(), _cpu_signature().encode()])
    path = os.path.join(cache_dir, f"cpu_kernels-{hashlib.sha256(ident).hexdigest()[:20]}.so")
    if not os.path.isfile(path) and not _compile(exe, path):
        return None
    lib = ctypes.CDLL(path)
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.q4_matmul.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i32]
    lib.q8_matmul.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i32]
    lib.q4_dequantize.argtypes = [ptr, ptr, ptr, i64, i64, ptr, i32]
    lib.q8_dequantize.argtypes = [ptr, ptr, i64, i64, ptr, i32]
    lib.cpu_rmsnorm.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_float]
    lib.cpu_fused_add_rmsnorm.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_float]
    lib.cpu_silu_and_mul.argtypes = [ptr, ptr, i64, i64]
    lib.cpu_rope.argtypes = [ptr, i64, i64, ptr, i64, i64, i64, i64, ptr, ptr]
    lib.cpu_decode_attention.argtypes = [ptr, i64, ptr, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64,
                                         ctypes.c_float, i32]
    for fn in (lib.q4_matmul, lib.q8_matmul, lib.q4_dequantize, lib.q8_dequantize, lib.cpu_rmsnorm,
               lib.cpu_fused_add_rmsnorm, lib.cpu_silu_and_mul, lib.cpu_rope, lib.cpu_decode_attention):
        fn.restype = None
    return lib


def _compile(exe: str, path: str) -> bool:
    """Build the library at `path` (objects, then link, in a temporary folder beside it; the
    final rename is atomic, as another process may be building the same file). False on failure."""
    import tempfile

    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
        objects = []
        for src, extra in _SOURCES:
            obj = os.path.join(tmp, os.path.basename(src) + ".o")
            cmds = [exe, *_FLAGS, *extra, "-c", "-o", obj, src]
            proc = subprocess.run(cmds, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                log.warning("compiling %s failed: GGUF weights are dequantized to float32 instead.\n%s",
                            src, proc.stderr[-2000:])
                return False
            objects.append(obj)
        lib = os.path.join(tmp, "lib.so")
        proc = subprocess.run([exe, "-shared", "-fopenmp", "-o", lib, *objects], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            log.warning("linking the CPU kernels failed: GGUF weights are dequantized to float32 instead.\n%s",
                        proc.stderr[-2000:])
            return False
        os.replace(lib, path)
    return True


# ---- kernels and their references ------------------------------------------------------------

def _check(x: torch.Tensor, w: PackedWeight) -> None:
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"packed matmul needs a contiguous 2-D float32 CPU input, got {x.dtype} {tuple(x.shape)} "
                         f"on {x.device}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"input has {x.shape[1]} features, the weight {w.shape[1]}")
    for t in (w.qs, w.d, w.m):
        assert t is None or t.is_contiguous(), "packed weight parts must be contiguous"


def matmul(lib: ctypes.CDLL, x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """x [M, K] float32 @ dequantize(w)^T -> [M, N] float32, on the packed blocks."""
    _check(x, w)
    n, k = w.shape
    y = torch.empty(x.shape[0], n, dtype=torch.float32)
    if x.shape[0] == 0:
        return y
    nt = torch.get_num_threads()
    if w.kind == "q4":
        lib.q4_matmul(x.data_ptr(), x.shape[0], k, w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), n,
                      y.data_ptr(), nt)
    else:
        lib.q8_matmul(x.data_ptr(), x.shape[0], k, w.qs.data_ptr(), w.d.data_ptr(), n, y.data_ptr(), nt)
    return y


def dequantize(lib: ctypes.CDLL, w: PackedWeight, out: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 [N, K] weights of `w` (into `out` if given)."""
    n, k = w.shape
    out = torch.empty(n, k, dtype=torch.float32) if out is None else out
    assert out.shape == (n, k) and out.dtype == torch.float32 and out.is_contiguous()
    nt = torch.get_num_threads()
    if w.kind == "q4":
        lib.q4_dequantize(w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), n, k, out.data_ptr(), nt)
    else:
        lib.q8_dequantize(w.qs.data_ptr(), w.d.data_ptr(), n, k, out.data_ptr(), nt)
    return out


def dequantize_ref(w: PackedWeight) -> torch.Tensor:
    """Pure-torch reference of `dequantize`: the float32 [N, K] weights."""
    n, k = w.shape
    if w.kind == "q4":
        qs = w.qs.view(n, k // 32, 16)
        q = torch.cat([qs & 15, qs >> 4], dim=-1).float()  # [N, K/32, 32]: low nibbles first
        return (q * w.d.unsqueeze(-1) + w.m.unsqueeze(-1)).reshape(n, k)
    return (w.qs.view(n, k // 32, 32).float() * w.d.unsqueeze(-1)).reshape(n, k)


def matmul_ref(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """Pure-torch reference of `matmul`: dequantize, then x @ W^T."""
    _check(x, w)
    return x @ dequantize_ref(w).T


def embedding_ref(ids: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """Rows `ids` of a packed [vocab, hidden] table, dequantized: [T, hidden] float32."""
    sub = PackedWeight(w.kind, w.qs[ids], w.d[ids], None if w.m is None else w.m[ids], (ids.numel(), w.shape[1]))
    return dequantize_ref(sub)

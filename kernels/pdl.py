"""Programmatic dependent launch (PDL, Hopper and later): let a kernel start while the kernel
before it on the stream is still finishing.

A decode step at batch 1 is a chain of short kernels, each streaming its weights and each
waiting for the one before it. Between two of them the GPU drains (the last blocks of one
finish, the next is launched, its first loads travel to memory and back): a few microseconds
a kernel, and at batch 1 a 25 MB projection takes only ~8 us at the copy bandwidth. With PDL
the next kernel is launched early, loads what does not depend on its predecessor (its
weights) and only then waits:

    w = tl.load(...)        # the weights: nobody writes them
    pdl.wait(PDL)           # everything the previous kernel wrote is visible after this
    x = tl.load(...)        # the activations: written by the previous kernel
    ...
    tl.store(...)           # only after the wait: the previous kernel may still read it

A kernel launched with ``launch_pdl=True`` must call ``wait`` before it reads anything the
kernel just before it writes and before it writes anything. Constant tables, and what was
written before the step's first kernel (its positions, sequence lengths and slot tables,
copied in first), may be read before the wait: every kernel here calls ``launch_dependents``
only after its own ``wait``, so when a kernel starts, all but the one before it have
finished. Every one of a kernel's programs must call ``wait``, even one with nothing to do:
the next kernel's ``wait`` waits only for this kernel, so this kernel must not finish before
the one before it. ``launch_dependents`` lets the next
kernel launch before this one's blocks have exited (each block calls it once). Both are
no-ops in a kernel launched without PDL, so a kernel can always carry them.

``enabled(t)`` says whether launches for tensor ``t`` use PDL: a CUDA device of compute
capability 9.0 or later, a Triton that has the intrinsics, not the interpreter, and
``TREADLE_PDL`` not set to 0. ``options(t)`` is the launch's keyword arguments:
``kernel[grid](..., **pdl.options(x))`` for a kernel with a ``PDL: tl.constexpr`` parameter.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait
    HAVE_GDC = True
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    HAVE_GDC = False

__all__ = ["enabled", "options", "wait", "launch_dependents", "HAVE_GDC"]


@functools.lru_cache(maxsize=None)
def _device_ok(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Launch kernels over ``t`` with PDL?"""
    if not HAVE_GDC or t.device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if os.environ.get("TREADLE_PDL", "1") == "0":
        return False
    return _device_ok(t.device.index if t.device.index is not None else torch.cuda.current_device())


def options(t: torch.Tensor) -> dict:
    """The ``PDL`` constexpr and, where enabled, Triton's ``launch_pdl`` launch option."""
    return {"PDL": True, "launch_pdl": True} if enabled(t) else {"PDL": False}


@triton.jit
def wait(PDL: tl.constexpr):
    """Wait until the previous kernel on the stream has finished and its writes are visible."""
    if PDL:
        _gdc_wait()


@triton.jit
def launch_dependents(PDL: tl.constexpr):
    """Allow the next kernel on the stream to launch (once every block of this one has called it)."""
    if PDL:
        _gdc_launch_dependents()

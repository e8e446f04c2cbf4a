"""Prefix extraction: the text every run of a program starts with, whatever its arguments.

The program runs once, synchronously, with placeholder arguments on a tracing executor
that sends nothing to the backend. Placeholders are strings holding a NUL marker, so
f-strings and `s += arg` keep working; the constant prefix is the text before the first
marker or before the first part that needs generation (gen, select, reading a variable,
fork). run_batch caches that prefix once before starting the batch.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from treadle.lang.backend import Backend
from treadle.lang.interpreter import StopTracing, StreamExecutor
from treadle.lang.state import ProgramState

log = logging.getLogger("treadle.lang")
_MARK = "\x00"


class Placeholder(str):
    """Stands for an argument while tracing; any text derived from it contains _MARK."""

    def __new__(cls, name: str) -> "Placeholder":
        return super().__new__(cls, f"{_MARK}{name}{_MARK}")


def extract_prefix(fn: Callable, backend: Backend, constants: dict[str, Any] | None = None,
                   varying: set[str] | None = None) -> str:
    """The constant prefix of `fn`'s text ("" when there is none or tracing fails).

    `constants` are arguments with the same value in every run (used as is). Parameters in
    `varying` become placeholders; so do, when `varying` is None, all parameters without a
    default; the rest keep their defaults. A program that cannot run on placeholders (e.g.
    it does arithmetic on an argument) simply has no traced prefix: that only costs the
    batch-level cache warm-up, and the reason is logged."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    kwargs = dict(constants or {})
    for p in params:
        if p.name in kwargs or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if (p.name in varying) if varying is not None else p.default is p.empty:
            kwargs[p.name] = Placeholder(p.name)
    ex = StreamExecutor(backend, threaded=False, tracing=True)
    state = ProgramState(ex)
    try:
        fn(state, **kwargs)
    except StopTracing:
        pass
    except Exception as e:  # the program needs real arguments: no prefix (logged, not hidden)
        log.info("tracing %s found no constant prefix: %r", getattr(fn, "__name__", fn), e)
        return ""
    if ex.error is not None:
        log.info("tracing %s stopped: %r", getattr(fn, "__name__", fn), ex.error)
        return ""
    text = ex.text_
    cut = text.find(_MARK)
    return text if cut < 0 else text[:cut]


def extract_prefix_by_tracing(program: Any, backend: Any = None) -> str:
    """SGLang's name and signature: the constant prefix of a `@function` program (its bound
    arguments used as constants), as `program.trace_prefix(backend)` gives it; `backend` is a
    Backend, an Engine, a Runtime or a URL (None: the default backend). The prefix is the text
    before the first argument or generated part; cache it with `backend.cache_prefix(prefix)`."""
    from treadle.lang.backend import as_backend

    fn = getattr(program, "fn", program)
    return extract_prefix(fn, as_backend(backend), dict(getattr(program, "bound", {}) or {}))


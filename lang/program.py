"""`@function` programs and how they run: run(), run_batch()."""
from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import Any, Callable

from treadle.lang.backend import Backend, as_backend
from treadle.lang.interpreter import StreamExecutor
from treadle.lang.state import ProgramState
from treadle.lang.tracer import extract_prefix

# run()/run_batch() keywords that set default sampling parameters for every gen
SAMPLING_DEFAULTS = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                     "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "seed")


class Program:
    """A DSL program: a function whose first parameter is the state `s`."""

    def __init__(self, fn: Callable, bind: dict[str, Any] | None = None) -> None:
        self.fn = fn
        self.bound = dict(bind or {})
        functools.update_wrapper(self, fn)

    def bind(self, **kwargs: Any) -> "Program":
        """A copy with some arguments fixed (they also count as constant when tracing)."""
        return Program(self.fn, {**self.bound, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call from inside another program: `sub(s, ...)` runs on the same state."""
        return self.fn(*args, **{**self.bound, **kwargs})

    def run(self, *args: Any, backend: Any = None, stream: bool = False, max_new_tokens: int | None = None,
            temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
            min_p: float | None = None, frequency_penalty: float | None = None,
            presence_penalty: float | None = None, repetition_penalty: float | None = None,
            stop: Any = None, stop_token_ids: list[int] | None = None, ignore_eos: bool | None = None,
            seed: int | None = None, **kwargs: Any) -> ProgramState:
        """Run once and return the state; what the function returned is `state.ret_value`.
        Without stream, waits for the program to finish and raises its error if it failed;
        with stream=True it returns at once (read the text with `state.text_iter()`)."""
        defaults = _defaults(locals())
        be = as_backend(backend)
        state = ProgramState(StreamExecutor(be, defaults, stream=stream))
        try:
            state.ret_value = self.fn(state, *args, **{**self.bound, **kwargs})
        finally:
            state._ex.end()
        if not stream:
            state.sync()
        return state

    def run_batch(self, batch_kwargs: list[dict], *, backend: Any = None, num_threads: int | str = "auto",
                  progress_bar: bool = False, max_new_tokens: int | None = None,
                  temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                  min_p: float | None = None, frequency_penalty: float | None = None,
                  presence_penalty: float | None = None, repetition_penalty: float | None = None,
                  stop: Any = None, stop_token_ids: list[int] | None = None, ignore_eos: bool | None = None,
                  seed: int | None = None) -> list[ProgramState]:
        """Run once per kwargs dict, concurrently; returns the states in input order.

        The program's constant prefix (found by tracing) is cached once first. A program
        that fails does not affect the others: its state raises the error when read."""
        defaults = _defaults(locals())
        be = as_backend(backend)
        if not isinstance(batch_kwargs, (list, tuple)) or not all(isinstance(k, dict) for k in batch_kwargs):
            raise ValueError("run_batch takes a list of dicts of keyword arguments, one per run")
        if not batch_kwargs:
            return []
        if num_threads == "auto":
            num_threads = min(len(batch_kwargs), max(64, 4 * (os.cpu_count() or 1)))
        if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1:
            raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
        if len(batch_kwargs) > 1:  # one run has no one to share a prefix with: no tracing run
            constants, varying = _split_args(batch_kwargs)
            prefix = extract_prefix(self.fn, be, {**self.bound, **constants}, varying)
            if prefix:
                be.cache_prefix(prefix)
        states = [ProgramState(StreamExecutor(be, defaults)) for _ in batch_kwargs]

        def one(i: int) -> None:
            s = states[i]
            try:
                s.ret_value = self.fn(s, **{**self.bound, **batch_kwargs[i]})
            except BaseException as e:  # kept on this state only; reading it raises e
                s._ex.fail(e)
            finally:
                s._ex.end()
            s._ex.sync()

        bar = _progress(len(states)) if progress_bar else None
        with concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="treadle-batch") as pool:
            for fut in concurrent.futures.as_completed([pool.submit(one, i) for i in range(len(states))]):
                fut.result()  # `one` never raises; this only propagates interpreter bugs
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return states

    def trace_prefix(self, backend: Backend | Any = None) -> str:
        """The constant text every run starts with (what run_batch caches up front)."""
        return extract_prefix(self.fn, as_backend(backend), self.bound)


def function(fn: Callable | None = None) -> Any:
    """Decorator turning `def prog(s, ...)` into a Program (`@function` or `@function()`)."""
    if fn is None:
        return lambda f: Program(f)
    return Program(fn)


def _split_args(batch_kwargs: list[dict]) -> tuple[dict, set[str]]:
    """Arguments equal in every run of the batch (constants for tracing) and the rest."""
    constants, varying = {}, set()
    first = batch_kwargs[0]
    for kwargs in batch_kwargs:
        varying.update(k for k in kwargs if k not in first)
    for k, v in first.items():
        if all(k in b and _same_value(b[k], v) for b in batch_kwargs[1:]):
            constants[k] = v
        else:
            varying.add(k)
    return constants, varying


def _same_value(a: Any, b: Any) -> bool:
    """Whether two arguments are surely equal: an `==` that does not give a plain bool (a numpy
    array's elementwise answer, a tensor) or raises counts as different (traced as varying)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        eq = a == b
    except Exception:  # noqa: BLE001 - any object may be an argument
        return False
    return eq is True


def _defaults(args: dict) -> dict:
    """run()'s sampling defaults, checked now (ValueError naming the field) rather than by the
    runtime at the first gen that uses them, or never when every gen sets its own."""
    from treadle.runtime.sampling_params import SamplingParams

    given = {k: args[k] for k in SAMPLING_DEFAULTS if args.get(k) is not None}
    stop = given.get("stop")
    SamplingParams.from_dict({**given, **({"stop": [stop]} if isinstance(stop, str) else {})}).validate()
    return given


def _progress(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="programs", leave=False)

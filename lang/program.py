"""`@function` programs and how they run: run(), run_batch()."""
from __future__ import annotations

import concurrent.futures
import functools
import inspect
import os
import threading
from typing import Any, Callable, Iterator

from treadle.lang.backend import Backend, as_backend
from treadle.lang.interpreter import StreamExecutor
from treadle.lang.primitives import check_n_and_stop_regex
from treadle.lang.state import ProgramState, _index
from treadle.lang.tracer import extract_prefix

# run()/run_batch() keywords that set default sampling parameters for every gen
SAMPLING_DEFAULTS = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                     "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "seed")
# run()/run_batch() keywords that set every gen's logprob options (as gen(...) takes them)
LOGPROB_DEFAULTS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
RUN_KEYWORDS = frozenset(SAMPLING_DEFAULTS + LOGPROB_DEFAULTS + ("n", "stop_regex"))


class Program:
    """A DSL program: a function whose first parameter is the state `s`."""

    def __init__(self, fn: Callable, bind: dict[str, Any] | None = None,
                 num_api_spec_tokens: int | None = None) -> None:
        self.fn = fn
        self.bound = dict(bind or {})
        self.num_api_spec_tokens = num_api_spec_tokens
        functools.update_wrapper(self, fn)
        params = list(inspect.signature(fn).parameters.values())[1:]
        self.arg_names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        # run() keywords that are also the program's own parameters go to the program (a
        # program taking `n` or `seed` gets it, rather than it becoming a sampling default)
        self._own_keywords = {p.name for p in params} & RUN_KEYWORDS

    # SGLang's SglFunction attribute names
    @property
    def func(self) -> Callable:
        """The decorated function."""
        return self.fn

    @property
    def bind_arguments(self) -> dict[str, Any]:
        """The arguments fixed by `bind`."""
        return self.bound

    @property
    def arg_defaults(self) -> tuple | list:
        """The defaults of the program's last positional parameters, as SGLang's (the
        `inspect.getfullargspec` defaults: a tuple, or [] when none has one)."""
        return inspect.getfullargspec(self.fn).defaults or []

    def bind(self, **kwargs: Any) -> "Program":
        """A copy with some arguments fixed (they also count as constant when tracing). A name the
        program has no parameter for is a ValueError, as SGLang asserts it (a program taking
        **kwargs takes any)."""
        params = list(inspect.signature(self.fn).parameters.values())[1:]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            unknown = [k for k in kwargs if k not in {p.name for p in params if p.kind != p.VAR_POSITIONAL}]
            if unknown:
                raise ValueError(f"bind({', '.join(unknown)}=...): the program {self.fn.__name__}() has no such "
                                 f"parameter; its parameters: {', '.join(p.name for p in params) or '(none)'}")
        return Program(self.fn, {**self.bound, **kwargs}, self.num_api_spec_tokens)

    def _required_args(self) -> list[str]:
        """The positional parameters a run must be given: no default, and not bound."""
        params = list(inspect.signature(self.fn).parameters.values())[1:]
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty and p.name not in self.bound]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`prog(question="...", temperature=0)` runs the program, as `prog.run(...)` (sampling
        keywords, `stream=True` and `backend=` included) and returns its state, as SGLang's.
        Called with a state first, from inside another program (`sub(s, ...)`), it runs the body
        on that state and returns what the body returns."""
        if args and isinstance(args[0], ProgramState):
            return self.fn(*args, **{**self.bound, **kwargs})
        from treadle.lang.tracer import tracing_now

        if tracing_now():  # called from a body being traced: traced too, as SGLang's (run keywords dropped)
            params = set(inspect.signature(self.fn).parameters)
            return self.trace(**dict(zip(self.arg_names, args)),
                              **{k: v for k, v in kwargs.items()
                                 if k in params or k not in RUN_KEYWORDS | {"stream", "backend", "use_thread"}})
        return self.run(*args, **kwargs)

    def run(self, *args: Any, backend: Any = None, stream: bool = False, max_new_tokens: int | None = None,
            temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
            min_p: float | None = None, frequency_penalty: float | None = None,
            presence_penalty: float | None = None, repetition_penalty: float | None = None,
            stop: Any = None, stop_token_ids: list[int] | None = None, ignore_eos: bool | None = None,
            seed: int | None = None, n: int | None = None, stop_regex: Any = None,
            return_logprob: bool | None = None, logprob_start_len: int | None = None,
            top_logprobs_num: int | None = None, return_text_in_logprobs: bool | None = None,
            use_thread: bool = True, **kwargs: Any) -> ProgramState:
        """Run once and return the state; what the function returned is `state.ret_value`.
        Without stream, waits for the program to finish and raises its error if it failed;
        with stream=True the body runs on a thread of its own and this returns at once (read
        the text with `state.text_iter()`; a failure is raised by the state's reads). With
        use_thread=False every gen runs in the caller's thread, in turn."""
        given = dict(locals())
        own = {k: given.pop(k) for k in self._own_keywords if given.get(k) is not None}
        defaults, logprob = _defaults(given)
        be = as_backend(backend)
        state = ProgramState(StreamExecutor(be, defaults, stream=stream, threaded=use_thread, logprob=logprob,
                                            spec_tokens=self.num_api_spec_tokens))
        call_kwargs = {**self.bound, **own, **kwargs}
        if stream:
            state._body = threading.Thread(target=self._run_body, args=(state, args, call_kwargs, True),
                                           name="treadle-program", daemon=True)
            state._body.start()
            return state
        self._run_body(state, args, call_kwargs, False)
        state.sync()
        _maybe_print(state)
        return state

    def _run_body(self, state: ProgramState, args: tuple, kwargs: dict, keep_error: bool) -> None:
        try:
            state.ret_value = self.fn(state, *args, **kwargs)
        except BaseException as e:
            if not keep_error:
                raise
            _fail_after_queued(state, e)  # a streamed run: the state's reads raise it
        finally:
            state._ex.end()
        if keep_error:
            _maybe_print(state)

    def run_batch(self, batch_kwargs: list[dict] | list[tuple], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False, generator_style: bool = False,
                  max_new_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                  top_k: int | None = None, min_p: float | None = None, frequency_penalty: float | None = None,
                  presence_penalty: float | None = None, repetition_penalty: float | None = None,
                  stop: Any = None, stop_token_ids: list[int] | None = None, ignore_eos: bool | None = None,
                  seed: int | None = None, n: int | None = None, stop_regex: Any = None,
                  return_logprob: bool | None = None, logprob_start_len: int | None = None,
                  top_logprobs_num: int | None = None,
                  return_text_in_logprobs: bool | None = None) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per item, concurrently; returns the states in input order. An item is a
        dict of keyword arguments, or (as SGLang) a list/tuple of the arguments in order.

        The program's constant prefix (found by tracing) is cached once first. A program
        that fails does not affect the others: its state raises the error when read. With
        `generator_style=True` it returns an iterator yielding each state, in input order, as
        soon as it has finished (arguments are checked, and the prefix cached, before it
        returns); `progress_bar` draws a tqdm bar of finished programs."""
        given = dict(locals())
        own = {k: given.pop(k) for k in self._own_keywords if given.get(k) is not None}
        defaults, logprob = _defaults(given)
        be = as_backend(backend)
        batch_kwargs = [{**own, **kw} for kw in self._batch_kwargs(batch_kwargs)]
        if not batch_kwargs:
            return iter([]) if generator_style else []
        if num_threads == "auto":
            num_threads = min(len(batch_kwargs), max(64, 4 * (os.cpu_count() or 1)))
        threads = _index(num_threads)  # an int, numpy's too
        if threads is None or threads < 1:
            raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
        num_threads = threads
        from treadle.lang.global_config import global_config

        # one run has no one to share a prefix with: no tracing run
        if len(batch_kwargs) > 1 and global_config.enable_precache_with_tracing:
            constants, varying = _split_args(batch_kwargs)
            prefix = extract_prefix(self.fn, be, {**self.bound, **constants}, varying)
            if prefix:
                be.cache_prefix(prefix)
        states = [ProgramState(StreamExecutor(be, defaults, logprob=logprob, spec_tokens=self.num_api_spec_tokens))
                  for _ in batch_kwargs]
        results = self._run_states(states, batch_kwargs, num_threads, progress_bar)
        return results if generator_style else list(results)

    def _batch_kwargs(self, batch: Any) -> list[dict]:
        if not isinstance(batch, (list, tuple)):
            raise ValueError("run_batch takes a list of dicts of keyword arguments (or of argument tuples), "
                             "one per run")
        out = []
        for item in batch:
            if isinstance(item, dict):
                out.append(item)
            elif isinstance(item, (list, tuple)):
                # as SGLang's: between the required arguments and all of them ("mismatch the signature")
                if not len(self._required_args()) <= len(item) <= len(self.arg_names):
                    raise ValueError(f"run_batch: {len(item)} arguments {item!r} mismatch the program's signature: "
                                     f"it takes {len(self._required_args())} to {len(self.arg_names)} "
                                     f"({', '.join(self.arg_names)}) in order")
                out.append(dict(zip(self.arg_names, item)))
            else:
                raise ValueError("run_batch takes a list of dicts of keyword arguments (or of argument tuples), "
                                 f"one per run; got an item {item!r}")
        return out

    def _run_states(self, states: list[ProgramState], batch_kwargs: list[dict], num_threads: int,
                    progress_bar: bool) -> Iterator[ProgramState]:
        """Run the batch on a thread pool, yielding the states in input order as they finish."""
        def one(i: int) -> None:
            s = states[i]
            try:
                s.ret_value = self.fn(s, **{**self.bound, **batch_kwargs[i]})
            except BaseException as e:  # kept on this state only; reading it raises e
                _fail_after_queued(s, e)
            finally:
                s._ex.end()
            s._ex.sync()
            _maybe_print(s)

        bar = _progress(len(states)) if progress_bar else None
        try:
            with concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix="treadle-batch") as pool:
                futures = [pool.submit(one, i) for i in range(len(states))]
                if bar is not None:
                    for fut in futures:
                        fut.add_done_callback(lambda _: bar.update(1))
                for state, fut in zip(states, futures):
                    fut.result()  # `one` never raises; this only propagates interpreter bugs
                    yield state
        finally:
            if bar is not None:
                bar.close()

    def trace(self, *, backend: Backend | Any = None, **kwargs: Any) -> Any:
        """SGLang's `prog.trace(**arguments)`: run the body once without generating and return a
        ProgramTrace (treadle.lang.tracer) of the expressions it added: `.nodes`,
        `.last_node.print_graph_dfs()`, `.print_graph()`, `.text()` (with `{name}` where an
        argument or a generated variable goes), `["name"]`, `.ret_value`. Arguments not given are
        placeholders. Roles render with `backend`'s chat template (else the default backend's;
        as nothing when there is none); nothing is sent to it. Errors of the body propagate."""
        from treadle.lang import backend as backend_mod
        from treadle.lang.tracer import trace_program

        be = as_backend(backend) if backend is not None else backend_mod._default
        return trace_program(self.fn, {**self.bound, **kwargs}, be)

    def compile(self, *, backend: Backend | Any = None) -> "CompiledProgram":
        """SGLang's `prog.compile()`: the program with its traced graph. `print_graph()` prints
        the trace (`prog.trace()`'s); `run` and `run_batch` run the program as it is (treadle
        runs every program through its interpreter; the trace is for reading)."""
        return CompiledProgram(self, self.trace(backend=backend))

    def trace_prefix(self, backend: Backend | Any = None) -> str:
        """The constant text every run starts with (what run_batch caches up front)."""
        return extract_prefix(self.fn, as_backend(backend), self.bound)

    def cache(self, backend: Backend | Any = None) -> str:
        """Cache the program's constant prefix on the backend now (SGLang's `prog.cache()`);
        returns it ("" when there is none)."""
        be = as_backend(backend)
        prefix = extract_prefix(self.fn, be, self.bound)
        if prefix:
            be.cache_prefix(prefix)
        return prefix


class CompiledProgram:
    """What `prog.compile()` returns: `print_graph()`, and `run` / `run_batch` / a direct call as
    the program's."""

    def __init__(self, program: Program, trace: Any) -> None:
        self.program, self.trace = program, trace

    def print_graph(self) -> str:
        return self.trace.print_graph()

    def run(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.program.run(*args, **kwargs)

    def run_batch(self, *args: Any, **kwargs: Any) -> Any:
        return self.program.run_batch(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """Decorator turning `def prog(s, ...)` into a Program (`@function` or `@function(...)`;
    `function(func=...)` with SGLang's parameter name).

    `num_api_spec_tokens` is SGLang's speculative execution for API models behind a chat-only
    interface: on `sgl.OpenAI`'s chat models, the gens and text of an assistant message are sent
    as one request of that many tokens when the message ends, and its reply is split into the
    gens' variables (interpreter.StreamExecutor._spec_generate). Other backends ignore it: every
    gen is its own request."""
    if num_api_spec_tokens is not None and (isinstance(num_api_spec_tokens, bool)
                                            or not isinstance(num_api_spec_tokens, int) or num_api_spec_tokens < 1):
        raise ValueError(f"num_api_spec_tokens must be a positive int or None, got {num_api_spec_tokens!r}")
    if func is None:
        return lambda f: Program(f, num_api_spec_tokens=num_api_spec_tokens)
    return Program(func, num_api_spec_tokens=num_api_spec_tokens)


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


def _defaults(args: dict) -> tuple[dict, dict]:
    """run()'s sampling defaults and logprob defaults, checked now (ValueError naming the
    field) rather than by the runtime at the first gen that uses them, or never when every gen
    sets its own. SGLang's `n` (1 only) and `stop_regex` (none only) are checked too."""
    from treadle.runtime.sampling_params import SamplingParams

    check_n_and_stop_regex("run()", args.get("n"), args.get("stop_regex"))
    given = {k: args[k] for k in SAMPLING_DEFAULTS if args.get(k) is not None}
    for key in ("stop", "stop_token_ids"):  # tuples as SGLang takes them (its JSON makes them lists)
        if isinstance(given.get(key), tuple):
            given[key] = list(given[key])
    stop = given.get("stop")
    SamplingParams.from_dict({**given, **({"stop": [stop]} if isinstance(stop, str) else {})}).validate()
    return given, {k: args[k] for k in LOGPROB_DEFAULTS if args.get(k) is not None}


def _fail_after_queued(state: ProgramState, e: BaseException) -> None:
    """Record the body's exception on its state once the nodes the body queued before raising
    have run (as SGLang's executor runs its queue): the state's text() is then what the body had
    written, not whatever the executor thread happened to have reached. An interrupt is recorded
    at once."""
    if isinstance(e, Exception):
        state._ex.sync()
    state._ex.fail(e)


def _maybe_print(state: ProgramState) -> None:
    """global_config.verbosity >= 2: print the program's text after a run that finished, as SGLang."""
    from treadle.lang.global_config import global_config

    if global_config.verbosity >= 2 and state._ex.error is None:
        print(state._ex.text_)


def _progress(total: int) -> Any:
    """run_batch's bar of finished programs; kept on screen when the batch ends, at n/n, as
    SGLang's (a tqdm bar with its defaults)."""
    from tqdm import tqdm

    return tqdm(total=total, desc="programs")

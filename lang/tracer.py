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
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

from treadle.lang import ir
from treadle.lang.backend import Backend
from treadle.lang.chat_template import ChatTemplate
from treadle.lang.interpreter import StopTracing, StreamExecutor
from treadle.lang.reasoning import reasoning_name
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
    # a program the body calls (`sub(x=...)`) is traced, not run, as in SGLang's tracing scope: a
    # traced body generates nothing (its value is a placeholder, so the prefix ends where it goes)
    outer = getattr(_tracing, "trace", None)
    _tracing.trace = ProgramTrace(kwargs)
    try:
        fn(state, **kwargs)
    except StopTracing:
        pass
    except Exception as e:  # the program needs real arguments: no prefix (logged, not hidden)
        log.info("tracing %s found no constant prefix: %r", getattr(fn, "__name__", fn), e)
        return ""
    finally:
        _tracing.trace = outer
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


# ---------------------------------------------------------------- prog.trace(): the whole program

_tracing = threading.local()  # .trace: the ProgramTrace being built in this thread, if any


class TraceNode:
    """One expression a traced program added. `prev` is the one before it in the same state (for
    the first of a fork branch, the parent's last one), so the nodes form SGLang's graph:
    `print_graph_dfs()` writes the path from the program's start to this node, one per line."""

    def __init__(self, expr: ir.Expr, prev: "TraceNode | None") -> None:
        self.expr, self.prev = expr, prev

    def __repr__(self) -> str:
        return describe(self.expr)

    def print_graph_dfs(self) -> str:
        path, node = [], self
        while node is not None:
            path.append(node)
            node = node.prev
        return "\n".join(f"%{i} = {describe(n.expr)}" for i, n in enumerate(reversed(path)))


@dataclass(eq=False)
class ForkBranch(ir.Expr):
    """A trace's mark where a fork branch starts (branch `index` of the fork)."""

    index: int


def describe(expr: ir.Expr) -> str:
    """A node as text; an argument's placeholder reads `{name}`."""
    def text(value: str) -> str:
        return repr(_MARKED.sub(lambda m: "{" + m.group(1) + "}", value))

    if isinstance(expr, ir.Constant):
        return f"Constant({text(expr.text)})"
    if isinstance(expr, ir.Gen):
        fields = [f"{k}={v!r}" for k, v in {**expr.params, **expr.logprob}.items()]
        if expr.dtype is not None:
            fields.append(f"dtype={expr.dtype.__name__}")
        return f"Gen({', '.join([repr(expr.name), *fields])})"
    if isinstance(expr, ir.Select):
        return f"Select({expr.name!r}, choices={expr.choices!r}, choices_method={expr.method!r})"
    if isinstance(expr, (ir.RoleBegin, ir.RoleEnd)):
        return f"{type(expr).__name__}({expr.role!r})"
    if isinstance(expr, ir.Join):
        return f"Join({expr.mode!r}, {len(expr.branches)} branches)"
    if isinstance(expr, ir.SetVar):
        return f"SetVar({expr.name!r}, {text(expr.value) if isinstance(expr.value, str) else repr(expr.value)})"
    if isinstance(expr, (ir.VarScopeBegin, ir.VarScopeEnd)):
        return f"{type(expr).__name__}({expr.name!r})"
    if isinstance(expr, ir.SeparateReasoning):
        return f"SeparateReasoning({expr.name!r}, model_type={expr.model_type!r})"
    if isinstance(expr, ForkBranch):
        return f"ForkBranch({expr.index})"
    return type(expr).__name__


_MARKED = re.compile(f"{_MARK}([^{_MARK}]*){_MARK}")


class ProgramTrace:
    """What `prog.trace(**arguments)` returns, as SGLang's tracer state: the program's body run
    once with nothing generated. An argument not given, and every generated variable, is a
    placeholder text (`s["x"]` reads one, `if s["x"] == "yes"` is False, as SGLang's variables
    compare); the expressions are recorded in `nodes`, in the order the body added them (fork
    branches' after their ForkBranch). `last_node.print_graph_dfs()` writes the path to the last
    one this body added, `print_graph()` all of them. Roles render with the backend's chat template
    when there is a backend, else as nothing. Programs called from the body are traced too, and
    their nodes are in `nodes` (each called program's chain starts anew, as its own state's)."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments
        self.nodes: list[TraceNode] = []
        self.ret_value: Any = None
        self.state: ProgramState | None = None
        self._last: TraceNode | None = None  # the last node this program's body added (not a called program's)

    @property
    def last_node(self) -> TraceNode | None:
        return self._last

    @property
    def variables(self) -> dict[str, Any]:
        return self.state.variables() if self.state is not None else {}

    def __getitem__(self, name: str) -> Any:
        return self.state[name]

    def text(self) -> str:
        """The program's text with `{name}` where an argument or a generated variable goes."""
        return _MARKED.sub(lambda m: "{" + m.group(1) + "}", self.state.text()) if self.state is not None else ""

    def print_graph(self) -> str:
        """Every node, one per line (SGLang's CompiledFunction.print_graph prints its graph);
        returned and printed."""
        out = "\n".join(f"%{i} = {describe(n.expr)}" for i, n in enumerate(self.nodes))
        print(out)
        return out


class _TraceBackend(Backend):
    """The backend a traced program sees: the real one's chat template (when there is one), and
    nothing sent anywhere."""

    def __init__(self, backend: Backend | None) -> None:
        self.real = backend

    def _load_chat_template(self) -> ChatTemplate:
        if self.real is not None:
            return self.real.chat_template
        return ChatTemplate.empty()

    def cache_prefix(self, text: str) -> dict:
        return {}

    def _nothing(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a traced program sends nothing to a backend")

    generate = generate_stream = encode = prompt_logprobs = _nothing

    def context_token(self) -> int | None:
        return None


class _GraphTracer(StreamExecutor):
    """Runs a program's expressions without generating: records each, and gives every gen/select
    variable a placeholder text."""

    def __init__(self, backend: Backend, trace: ProgramTrace, prev: TraceNode | None = None) -> None:
        super().__init__(backend, threaded=False)
        self.trace, self.last = trace, prev
        self._forked: dict[int, int] = {}  # id of the node a fork starts after -> branches made there

    def _record(self, expr: ir.Expr) -> None:
        self.last = self.trace._last = TraceNode(expr, self.last)
        self.trace.nodes.append(self.last)

    def _execute(self, expr: ir.Expr) -> None:
        self._record(expr)
        if isinstance(expr, (ir.Gen, ir.Select)):
            name = expr.name or self.new_name()
            self.gen_starts[name] = len(self.text_)
            value = Placeholder(name)
            self._append(value, name)
            self._set_var(name, value, {})
        elif isinstance(expr, ir.SeparateReasoning):
            self._set_var(reasoning_name(expr.name), Placeholder(reasoning_name(expr.name)), {})
        else:
            super()._execute(expr)

    def _new_branch_executor(self) -> StreamExecutor:
        index = self._forked.get(id(self.last), 0)
        self._forked[id(self.last)] = index + 1
        branch = _GraphTracer(self.backend, self.trace, self.last)
        branch._record(ForkBranch(index))
        return branch


def trace_program(fn: Callable, arguments: dict[str, Any], backend: Backend | None) -> ProgramTrace:
    """Run `fn` once on a tracing state (see ProgramTrace); parameters without a value in
    `arguments` (and no default) get placeholders. The program's own errors propagate."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    kwargs = dict(arguments)
    for p in params:
        if p.name not in kwargs and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            kwargs[p.name] = Placeholder(p.name)
    trace = ProgramTrace(kwargs)
    trace.state = ProgramState(_GraphTracer(_TraceBackend(backend), trace))
    outer = getattr(_tracing, "trace", None)
    _tracing.trace = trace
    try:
        trace.ret_value = fn(trace.state, **kwargs)
    finally:
        _tracing.trace = outer
    trace.state._ex.end()
    trace.state._ex.raise_if_failed()
    if outer is not None:  # a program called from a traced body: its nodes are the caller's graph's too,
        outer.nodes.extend(trace.nodes)  # as SGLang's compiled graph takes in its child states' nodes
    return trace


def tracing_now() -> bool:
    """Whether this thread is inside `prog.trace()` (a program called from a traced body is traced)."""
    return getattr(_tracing, "trace", None) is not None

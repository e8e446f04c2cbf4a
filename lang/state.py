"""ProgramState: what a program body sees as `s`, and what run() returns.

Writes (`s += ...`) are checked here, in the caller's thread, so a misuse raises at the
line that caused it; the work itself is queued on the state's StreamExecutor.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import operator
import threading
from typing import Any, Iterator

from treadle.lang import ir
from treadle.lang.interpreter import StopTracing, StreamExecutor
from treadle.lang.reasoning import reasoning_name


class ProgramState:
    """The prompt text, variables and messages of one program run."""

    def __init__(self, executor: StreamExecutor) -> None:
        self._ex = executor
        self._role: str | None = executor.role
        self._names: set[str] = set(executor.variables)  # names known to exist or be coming
        self._ret: Any = None
        self._body: threading.Thread | None = None  # run(stream=True): the thread running the program body

    @property
    def ret_value(self) -> Any:
        """What the program function returned (run / run_batch; after a streamed run's body ends)."""
        self._wait_body()
        return self._ret

    @ret_value.setter
    def ret_value(self, value: Any) -> None:
        self._ret = value

    @property
    def stream_executor(self) -> StreamExecutor:
        """The executor running this state's calls, under SGLang's name: its `variables`,
        `variable_event` (name -> Event set once the variable has a value), `meta_info`,
        `text_`, `messages_` and `sync()` read as SGLang's do."""
        return self._ex

    # ------------------------------------------------------------ writing

    def __iadd__(self, other: Any) -> "ProgramState":
        """Append text or a DSL expression (gen, select, role, ...)."""
        if other is None:  # SGLang's error (e.g. `s += forks.join()`, which returns None)
            raise ValueError("Tried to append None to state.")
        if isinstance(other, _RoleScope):
            # `s += s.system("...")` (SGLang's tutorial: "same as s += system(...)"):
            # s.system(content) has already added the message
            if other.state is not self:
                raise TypeError(f"s.{other.role}(...) of another program state cannot be added here; "
                                f"use sgl.{other.role}(...)")
            if not other.done:
                raise TypeError(f"s.{other.role}() without content opens a scope: use `with s.{other.role}():`")
            return self
        for node in ir.flatten(ir.to_expr(other)):
            self._ex.submit(self._check(node))
        return self

    def _check(self, node: ir.Expr) -> ir.Expr:
        if isinstance(node, ir.RoleBegin):
            if node.role not in ir.ROLES:
                raise ValueError(f"unknown role {node.role!r}; roles are {', '.join(ir.ROLES)}")
            if self._role is not None:
                raise ValueError(f"cannot open a {node.role!r} message inside the open {self._role!r} message; "
                                 "roles do not nest: close the first one before starting the next")
            self._role = node.role
        elif isinstance(node, ir.RoleEnd):
            if self._role != node.role:
                raise ValueError(f"cannot end role {node.role!r}: the open role is {self._role!r}")
            self._role = None
        elif isinstance(node, (ir.Gen, ir.Select)):
            if node.name is None:  # a copy: the same node object may be added to many states
                node = dataclasses.replace(node, name=self._ex.new_name())
            self._names.add(node.name)
        elif isinstance(node, ir.Join):
            for br in node.branches:
                self._names.update(br.variables)
        elif isinstance(node, ir.SeparateReasoning):
            self._names.update((node.name, reasoning_name(node.name)))
        return node

    def system(self, expr: Any = None) -> "_RoleScope":
        """`with s.system(): s += "..."` (or `s.system("...")` to add a whole message)."""
        return _RoleScope(self, "system", expr)

    def user(self, expr: Any = None) -> "_RoleScope":
        """`with s.user(): s += "..."` (or `s.user("...")` to add a whole message)."""
        return _RoleScope(self, "user", expr)

    def assistant(self, expr: Any = None) -> "_RoleScope":
        """`with s.assistant(): s += gen(...)` (or `s.assistant("...")`)."""
        return _RoleScope(self, "assistant", expr)

    def var_scope(self, name: str) -> "_VarScope":
        """`with s.var_scope("x"): s += ...`: variable `x` holds the text written inside the
        block (generated or not), as SGLang's. Readable after the block; a block left by an
        exception still sets it to the text written so far."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a variable name must be a non-empty string, got {name!r}")
        return _VarScope(self, name)

    @contextlib.contextmanager
    def copy(self, position_ids_offset: Any = None) -> Iterator["ProgramState"]:
        """`with s.copy() as c: c += ...`: one fork branch, joined ("gather") when the block ends."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> "ForkGroup":
        """`size` branches (an int, numpy's too; 0 makes none, as SGLang's) that continue from the
        current text. The shared prefix is computed once (cached by the runtime) before the
        branches send their own requests. `position_ids_offset` is taken and not used, as SGLang's
        fork takes it: the branches continue the parent's positions there too."""
        n = _index(size)
        if n is None:
            raise ValueError(f"fork needs an int size >= 0, got {size!r}")
        if n < 0:
            raise ValueError(f"fork needs n >= 0, got {n}")
        if self._ex.tracing:
            raise StopTracing  # a fork marks the end of the constant prefix
        self._ex.sync()
        self._ex.raise_if_failed()
        if self._ex.text_ and n:  # fork(0), as SGLang's: no branches (one per item of an empty list)
            self._ex.backend.cache_prefix(self._ex.text_)
        return ForkGroup(self, [ProgramState(self._ex.copy()) for _ in range(n)])

    def __setitem__(self, name: str, value: Any) -> None:
        """Set variable `name` (as SGLang's `s[name] = value`), in program order: a read after
        this line sees `value`, a gen of the same name queued after it replaces it."""
        self.set_var(name, value)

    def set_var(self, name: str, value: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a variable name must be a non-empty string, got {name!r}")
        self._names.add(name)
        self._ex.submit(ir.SetVar(name, value))

    # ------------------------------------------------------------ reading

    def __getitem__(self, name: str) -> Any:
        """The value of variable `name`, waiting until it has been generated."""
        self._known(name)
        self._ex.wait_var(name)
        if name not in self._ex.variables:
            raise KeyError(f"variable {name!r} was never set; known variables: {sorted(self._ex.variables)}")
        return self._ex.variables[name]

    def get_var(self, name: str) -> Any:
        return self[name]

    def get_meta_info(self, name: str) -> dict | None:
        """Runtime meta of the call that produced `name`: prompt_tokens, cached_tokens,
        completion_tokens, finish_reason (for select also the per-choice scores). None, as
        SGLang's, for a name no call produced: unknown, never set, or set by `s[name] = ...`."""
        if self._ex.tracing:
            raise StopTracing  # a value depending on generation: the constant prefix ends here
        if name not in self._names:
            self._wait_body()
        if name in self._names:
            self._ex.wait_var(name)  # raises the program's error if it failed before setting name
        else:
            self._ex.raise_if_failed()
        return self._ex.meta.get(name) or None  # s[name] = ... leaves an empty meta

    def __contains__(self, name: str) -> bool:
        """Whether variable `name` has a value now (does not wait), as SGLang's `name in s`."""
        return name in self._ex.variables

    def _wait_body(self) -> None:
        """A state returned by run(stream=True) whose body still runs on its own thread: wait
        for the body, so reads see everything it wrote (not from the body's own thread)."""
        body = self._body
        if body is not None and body is not threading.current_thread():
            body.join()

    def _known(self, name: str) -> None:
        if self._ex.tracing:
            raise StopTracing  # a value depending on generation: the constant prefix ends here
        if name not in self._names:
            self._wait_body()
        if name not in self._names:
            self._ex.raise_if_failed()  # a failed program may have stopped before naming it
            raise KeyError(f"no variable {name!r} in this program; known variables: "
                           f"{', '.join(sorted(self._names)) or '(none)'}")

    def text(self) -> str:
        """The whole prompt text so far (waits for queued work). Of a failed state (a run_batch
        item, a run with stream=True), the text it had when it failed, as SGLang's: `error()`
        has the error (reading a variable the failure left unset raises it)."""
        if self._ex.tracing:
            raise StopTracing
        self._wait_done()
        return self._ex.text_

    def messages(self) -> list[dict]:
        """The completed role messages as [{"role", "content"}], in order; of a failed state,
        those completed before it failed, as `text()`."""
        self._wait_done()
        return [dict(m) for m in self._ex.messages_]

    def variables(self) -> dict[str, Any]:
        self.sync()
        return dict(self._ex.variables)

    def sync(self) -> None:
        """Wait for all queued work; raise the state's error if it failed."""
        self._wait_body()
        self._ex.sync()
        self._ex.raise_if_failed()

    def error(self) -> BaseException | None:
        """The exception that stopped this state, or None (waits for queued work)."""
        self._wait_body()
        self._ex.sync()
        return self._ex.error

    def _wait_done(self) -> None:
        """Wait for the body (a streamed run's) and all queued work. While the program body still
        runs (a read of its own, or of an unjoined branch's), a failure raises, stopping the body
        as its other reads do; once it has returned, this raises nothing."""
        self._wait_body()
        self._ex.sync()
        if not self._ex.ended:
            self._ex.raise_if_failed()

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield text as it is produced: all of it until the program ends, or variable
        `var_name`'s until no queued or running call will write it again (as SGLang, and so
        the program's own body can read a variable this way). Token-level deltas need
        run(..., stream=True): with it, `var_name`'s are those of every gen that writes it;
        without it, as SGLang, `var_name` yields its value once, what `s[var_name]` reads, and no
        `var_name` the text there is once queued work is done (`text()`'s; in the program's own
        body, the text so far), in the pieces its calls wrote."""
        if not self._ex.stream:
            if var_name is not None:
                yield self[var_name]
            else:
                yield from self._pieces_now()
            return
        for delta, _ in self._deltas(var_name):
            yield delta

    def _pieces_now(self) -> list[str]:
        """Not streamed, as SGLang's `text_iter()` (which yields `text()`): the text there is once
        queued work is done (the whole text after a run; in the program's own body, the text so
        far: waiting for the program's end there never returned), in the pieces its calls wrote;
        a fork branch's starts with the text it was forked from, as its `text()` (SGLang's).
        Joined they are that text (one piece after the fork where a separate_reasoning took a
        block out of it)."""
        self._wait_done()
        ex = self._ex
        with ex._cv:
            pieces = [delta for _, delta, _ in ex.deltas]
            head, text = ex.text_[:ex.fork_len], ex.text_[ex.fork_len:]
        return [head] * bool(head) + (pieces if "".join(pieces) == text else [text])

    def _deltas(self, var_name: str | None) -> Iterator[tuple[str, dict | None]]:
        """(text, meta_info of the gen that wrote it so far, or None) as the text is produced; a
        fork branch's text (no `var_name`) starts with the text it was forked from, as SGLang's
        branch streams its whole `text()`."""
        ex, i = self._ex, 0
        if var_name is None:
            with ex._cv:
                head = ex.text_[:ex.fork_len]
            if head:
                yield head, None

        def finished() -> bool:  # (under ex._cv) a set variable's last delta is in ex.deltas by then
            if var_name is not None and var_name in ex.variables and not ex._will_set(var_name):
                return True
            return ex.ended and not ex._pending and not ex._busy

        while True:
            with ex._cv:
                ex._cv.wait_for(lambda: i < len(ex.deltas) or ex.error is not None or finished())
                batch, i = ex.deltas[i:], len(ex.deltas)
                done = finished()
            for var, delta, meta in batch:
                if var_name is None or var == var_name:
                    yield delta, meta
            if not batch:
                ex.raise_if_failed()
                if done:
                    return

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False):
        """Async form of `text_iter` (the blocking waits run in a worker thread). With
        `return_meta_data` and a `var_name` of a streamed run, yields (text, meta_info of the
        gen that wrote it), as SGLang: the meta so far, but with the output logprob lists
        holding only this chunk's tokens and `output_token_logprobs_length` counting all
        (get_meta_info(var) has them all). Not streamed, or without a `var_name`, it yields
        text alone, return_meta_data or not, as SGLang's does."""
        if not self._ex.stream:  # as text_iter: a variable's value once (no meta: SGLang's), or the text now
            if var_name is not None:
                yield await asyncio.to_thread(self.__getitem__, var_name)
            else:
                for piece in await asyncio.to_thread(self._pieces_now):
                    yield piece
            return
        it = self._deltas(var_name)
        end = object()
        seen: dict[str, Any] = {}
        while True:
            item = await asyncio.to_thread(next, it, end)
            if item is end:
                return
            if return_meta_data and var_name is not None:
                yield item[0], _chunk_meta(item[1], seen)
            else:
                yield item[0]

    def __repr__(self) -> str:
        """`ProgramState(<the whole text>)`, as SGLang's (waits for queued work, as its `text()`
        does; a failed state shows the text it had). SGLang's cot_decoding example reads a
        state's text back as `str(state)[len("ProgramState("):-1]`."""
        if not self._ex.tracing:
            self._wait_body()
            self._ex.sync()
        return f"ProgramState({self._ex.text_})"


def _index(value: Any) -> int | None:
    """`value` as an int when it is one (a numpy integer too, not a bool or a float), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


# meta_info lists that SGLang's streamed chunks carry only the new part of
_INCREMENTAL_META_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


def _chunk_meta(meta: dict | None, seen: dict[str, Any]) -> dict | None:
    """A streamed chunk's meta_info as SGLang's text_async_iter(var, return_meta_data=True)
    yields it: the output logprob lists hold only the tokens since the previous chunk (the
    runtime's are cumulative), `output_token_logprobs_length` counts them all. `seen` holds
    what earlier chunks of the same request (meta "id") had; a new request starts over. A
    select's meta (its choices' scores) comes whole, as SGLang's select sets it at once."""
    if not meta or "normalized_prompt_logprobs" in meta:
        return meta
    if seen.get("id") != meta.get("id"):
        seen.clear()
        seen["id"] = meta.get("id")
    out = dict(meta)
    for key in _INCREMENTAL_META_KEYS:
        full = meta.get(key)
        if isinstance(full, list):
            out[key] = full[seen.get(key, 0):]
            seen[key] = len(full)
    if isinstance(meta.get("output_token_logprobs"), list):
        out["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
    return out


class _VarScope:
    """Returned by s.var_scope(name): the text written inside the block becomes variable `name`."""

    def __init__(self, state: ProgramState, name: str) -> None:
        self.state, self.name = state, name

    def __enter__(self) -> ProgramState:
        self.state._names.add(self.name)
        self.state._ex.submit(ir.VarScopeBegin(self.name))
        return self.state

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or not issubclass(exc_type, StopTracing):  # tracing: nothing may follow
            self.state._ex.submit(ir.VarScopeEnd(self.name))


class _RoleScope:
    """Returned by s.user() etc.: a context manager, or a whole message when given content."""

    def __init__(self, state: ProgramState, role: str, content: Any) -> None:
        self.state, self.role = state, role
        if content is not None:
            state += ir.Role(role, [ir.to_expr(content)])
            self.done = True
        else:
            self.done = False

    def __enter__(self) -> ProgramState:
        if self.done:
            raise ValueError(f"s.{self.role}(content) already added the message; use `with s.{self.role}():` "
                             "without content to open a scope")
        self.state += ir.RoleBegin(self.role)
        return self.state

    def __exit__(self, exc_type, exc, tb) -> None:
        tracing_stopped = exc_type is not None and issubclass(exc_type, StopTracing)
        if self.state._role == self.role and not tracing_stopped:
            # closed on an exception too: a program that catches it and goes on writes a
            # well-formed prompt (the message so far, ended), not one with a dangling role
            self.state += ir.RoleEnd(self.role)
        else:  # a traced prefix ends where tracing stopped: nothing may follow it
            self.state._role = None


class ForkGroup(list):
    """The branches returned by `s.fork(n)` (a list of ProgramState)."""

    # SGLang's mode names are accepted beside treadle's
    _MODES = {"gather": "gather", "gather_variable": "gather", "concat": "concat", "concate_and_append": "concat"}

    def __init__(self, parent: ProgramState, branches: list[ProgramState]) -> None:
        super().__init__(branches)
        self.parent = parent
        self._joined = False

    @property
    def states(self) -> list[ProgramState]:
        """The branches, under SGLang's ProgramStateGroup attribute name (the group is also
        their list: `forks[i]`, `for f in forks`)."""
        return list(self)

    @property
    def src_state(self) -> ProgramState:
        """The state that forked them (SGLang's ProgramStateGroup attribute)."""
        return self.parent

    def __iadd__(self, other: Any) -> "ForkGroup":
        """`forks += x` adds x to every branch, as SGLang: one item per branch from a list or
        tuple, `f(i)` from a function of the branch index."""
        if isinstance(other, (list, tuple)):
            if len(other) != len(self):
                raise ValueError(f"{len(other)} items for {len(self)} branches: give one per branch")
            parts = list(other)
        elif callable(other) and not isinstance(other, ir.Expr):
            parts = [other(i) for i in range(len(self))]
        else:
            parts = [other] * len(self)
        for branch, part in zip(self, parts):
            branch += part
        return self

    def join(self, mode: str = "gather") -> None:
        """Wait for every branch and bring them into the parent, as SGLang's `forks.join()`:
        "gather" (or "gather_variable") makes each variable the branches created a list in the
        parent; "concat" (or "concate_and_append") appends every branch's new text in order.
        Returns None, as SGLang's (so `s += forks.join()` is its ValueError)."""
        if mode not in self._MODES:
            raise ValueError(f"join mode must be one of {', '.join(self._MODES)}; got {mode!r}")
        if self._joined:
            raise ValueError("these branches are already joined")
        for br in self:
            br.sync()
        self._joined = True
        self.parent += ir.Join([br._ex for br in self], self._MODES[mode])
        for br in self:  # joined: the branches' streams (text_iter) end
            br._ex.end()

"""StreamExecutor: runs one program state's expressions in order on its own thread.

The program body (in the caller's thread) only enqueues nodes; the executor thread sends
them to the backend. So a body that never reads a value keeps going while its requests
are in flight, and many states (batch items, fork branches) have requests in the runtime
at once, where the engine batches them. A worker thread exists only while work is queued.

Errors: the first exception stops the state; later nodes are dropped and every read
(`s[name]`, `s.text()`, ...) raises that exception while the program body runs. Once it has
returned (a run_batch item, a streamed run), `text()` and `messages()` give what the state had, as
SGLang's, and `error()` the exception; reading a variable it left unset still raises it. Other
states are unaffected.
"""
from __future__ import annotations

import collections
import json
import re
import threading
import warnings
from typing import Any

from treadle.lang import ir, speculation
from treadle.lang.backend import Backend
from treadle.lang.reasoning import REASONING_MODEL_TYPES, reasoning_name, split_reasoning
from treadle.runtime.sampling_params import GRAMMAR_FIELDS

def _parse_bool(text: str) -> bool:
    if text not in ("True", "False"):
        raise ValueError(f"not True or False: {text!r}")
    return text == "True"


# dtype -> (regex the runtime constrains to, check that the text parses, stop strings added).
# As in SGLang, the variable holds the generated text ('24', 'True', '"Paris"' with its quotes).
# A number ends where the model writes a space or a newline (an int also a period), as with
# SGLang's REGEX_INT and its stop strings; but here whatever the model writes after that
# character is allowed too, and the stop string cuts it off at once: a model that wants to
# write "24 hours" writes the token " hours" and stops with "24". (SGLang's regex allows only
# more spaces and newlines after the digits, which a small model rarely picks: it writes digits
# until max_tokens, "24000000000000000000".) The string regex is wider than SGLang's REGEX_STR
# (any character but a quote, a backslash or a control character such as a newline, not only
# word characters and spaces), so the value is always a JSON string literal.
DTYPE_REGEX: dict[type, tuple[str, Any, tuple[str, ...]]] = {
    int: (r"[-+]?[0-9]+([ \n.][\s\S]*)?", int, (" ", "\n", ".")),
    float: (r"[-+]?[0-9]*\.?[0-9]+([ \n][\s\S]*)?", float, (" ", "\n")),
    bool: (ir.REGEX_BOOL, _parse_bool, ()),
    str: (r'"[^"\\\x00-\x1f]{0,200}"', json.loads, ()),
}
# DSL keyword -> runtime sampling_params field
_PARAM_NAMES = {"max_tokens": "max_new_tokens"}


class StopTracing(BaseException):
    """Raised inside a traced program when it reaches a part that depends on generation. A
    BaseException, so that a program's own `except Exception` (a retry loop around a gen)
    does not swallow it and run on forever while tracing."""


class StreamExecutor:
    """Owns a state's text, variables, messages and meta info; see the module docstring."""

    def __init__(self, backend: Backend, defaults: dict | None = None, stream: bool = False,
                 threaded: bool = True, tracing: bool = False, logprob: dict | None = None,
                 spec_tokens: int | None = None) -> None:
        self.backend = backend
        self.defaults = dict(defaults or {})  # run(temperature=...) etc., below per-gen values
        self.logprob = dict(logprob or {})  # run(return_logprob=...) etc., below per-gen values
        self.stream = stream
        self.threaded = threaded
        self.tracing = tracing
        self.text_ = ""
        self.variables: dict[str, Any] = {}
        self.meta: dict[str, dict] = {}
        self.messages_: list[dict] = []
        self.role: str | None = None
        self.role_start = 0
        self.roles_used = False
        self.error: BaseException | None = None
        self.trace_stopped = False
        self.ended = False
        # (variable or None, text, its gen's meta_info so far or None) in order, for streaming
        self.deltas: list[tuple[str | None, str, dict | None]] = []
        self.scope_starts: dict[str, int] = {}  # open var_scope name -> where its text starts
        self.gen_starts: dict[str, int] = {}  # gen/select variable -> where its text starts (its last call)
        self._pending: collections.deque = collections.deque()
        self._running: ir.Expr | None = None  # the node the worker thread is running
        self._busy = False
        self._cv = threading.Condition()
        self._anon = 0
        self.fork_len = 0  # a branch: the text's length at the fork
        self.written: dict[str, None] = {}  # names set on this state (a branch: since the fork), in order
        self.branches: list[StreamExecutor] = []  # forked from this one: they end when it does
        # the program's num_api_spec_tokens, and the open assistant message's parts held for its
        # one request ({"text": constant} or {"name", "stop", "params"} of a gen), in order
        self.spec_tokens = spec_tokens
        self._spec: list[dict] = []
        # a completion-model API backend's speculation: text generated past the last gen's stop,
        # which the program's next constants and gens take while it matches (SGLang's _spec_gen)
        self.speculated = ""

    # ------------------------------------------------------------ queueing

    def submit(self, expr: ir.Expr) -> None:
        """Queue one primitive node; it runs after everything queued before it."""
        if not self.threaded:
            self._run_one(expr)
            return
        with self._cv:
            self._pending.append(expr)
            if not self._busy:
                self._busy = True
                threading.Thread(target=self._drain, name="treadle-state", daemon=True).start()

    def _drain(self) -> None:
        while True:
            with self._cv:
                if not self._pending:
                    self._busy = False
                    self._cv.notify_all()
                    return
                expr = self._running = self._pending.popleft()
            self._run_one(expr)

    def _run_one(self, expr: ir.Expr) -> None:
        if self.error is not None or self.trace_stopped:
            return
        try:
            self._execute(expr)
        except BaseException as e:  # recorded, not swallowed: every later read raises it
            self.fail(e)
        with self._cv:
            self._running = None
            self._cv.notify_all()

    def sync(self) -> None:
        """Wait until every queued node has run."""
        with self._cv:
            self._cv.wait_for(lambda: not self._pending and not self._busy)

    def end(self) -> None:
        """The program body returned (or, for a branch, it was joined): no more nodes (ends
        streaming iterators, this state's and its branches')."""
        with self._cv:
            self.ended = True
            self._cv.notify_all()
            branches = list(self.branches)
        for br in branches:
            br.end()

    def fail(self, e: BaseException) -> None:
        with self._cv:
            if self.error is None:
                self.error = e
            self._pending.clear()
            self._cv.notify_all()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def wait_var(self, name: str) -> None:
        """Wait until no queued or running node will (re)set `name`: a name generated again
        reads its new value, as the program text says, not the one before."""
        with self._cv:
            self._cv.wait_for(lambda: self.error is not None or not self._will_set(name))
        if name not in self.variables or self.error is not None and self._will_set(name):
            self.raise_if_failed()  # values set before a failure stay readable

    def _will_set(self, name: str) -> bool:
        nodes = [*self._pending, self._running] if self._running is not None else self._pending
        return any(isinstance(e, (ir.Gen, ir.Select, ir.SetVar, ir.VarScopeEnd)) and e.name == name
                   or isinstance(e, ir.SeparateReasoning) and name in (e.name, reasoning_name(e.name))
                   or isinstance(e, ir.RoleEnd) and any(t.get("name") == name for t in self._spec)
                   or isinstance(e, ir.Join) and e.mode != "concat" for e in nodes)

    # ------------------------------------------------------------ SGLang's attribute names

    @property
    def meta_info(self) -> dict[str, dict]:
        """Each variable's meta info by name (SGLang's StreamExecutor.meta_info)."""
        return self.meta

    @property
    def is_finished(self) -> bool:
        """SGLang's StreamExecutor.is_finished (its RAG example polls it after a run): the program
        ended and every queued node has run, or it failed."""
        with self._cv:
            return self.error is not None or (self.ended and not self._pending and not self._busy)

    @property
    def variable_event(self) -> dict[str, threading.Event]:
        """SGLang's StreamExecutor.variable_event (its reasoning example prints its keys): per
        variable set or to be set by a queued node, an Event that is set once it has a value. A
        snapshot: an Event does not change after it is returned; wait with `s[name]`."""
        with self._cv:
            nodes = [*self._pending, *([self._running] if self._running is not None else [])]
            names = dict.fromkeys(self.variables)
            for e in nodes:
                if isinstance(e, (ir.Gen, ir.Select, ir.SetVar, ir.VarScopeEnd)) and e.name is not None:
                    names.setdefault(e.name)
                elif isinstance(e, ir.SeparateReasoning):
                    names.setdefault(e.name)
                    names.setdefault(reasoning_name(e.name))
            out = {}
            for name in names:
                out[name] = threading.Event()
                if name in self.variables and not self._will_set(name):
                    out[name].set()
            return out

    def new_name(self) -> str:
        self._anon += 1
        return f"_gen_{self._anon}"

    # ------------------------------------------------------------ forks

    def copy(self) -> "StreamExecutor":
        """A branch starting from this state's current (synced) text, variables and role."""
        ex = self._new_branch_executor()
        ex.text_ = self.text_
        ex.variables = dict(self.variables)
        ex.meta = dict(self.meta)
        ex.messages_ = [dict(m) for m in self.messages_]
        ex.role, ex.role_start, ex.roles_used = self.role, self.role_start, self.roles_used
        ex.fork_len = len(self.text_)  # ex.written starts empty
        ex.scope_starts = dict(self.scope_starts)
        ex.gen_starts = dict(self.gen_starts)
        with self._cv:
            self.branches.append(ex)
        return ex

    def _new_branch_executor(self) -> "StreamExecutor":
        return StreamExecutor(self.backend, self.defaults, self.stream, self.threaded, self.tracing, self.logprob,
                              self.spec_tokens)

    # ------------------------------------------------------------ execution

    def _append(self, text: str, var: str | None = None, meta: dict | None = None) -> None:
        with self._cv:
            self.text_ += text
            if text:
                self.deltas.append((var, text, meta))
            self._cv.notify_all()

    def _execute(self, expr: ir.Expr) -> None:
        if isinstance(expr, ir.Constant):
            if speculation.holds_message(self):
                self._spec.append({"text": expr.text})
            else:
                self._fill(expr.text)
        elif isinstance(expr, ir.Gen):
            self._gen(expr)
        elif isinstance(expr, ir.Select):
            self._select(expr)
        elif isinstance(expr, ir.RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, ir.RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, ir.Join):
            self._join(expr)
        elif isinstance(expr, ir.SetVar):
            self._set_var(expr.name, expr.value, {})
        elif isinstance(expr, ir.VarScopeBegin):
            self.scope_starts[expr.name] = len(self.text_)
        elif isinstance(expr, ir.VarScopeEnd):
            self._set_var(expr.name, self.text_[self.scope_starts.pop(expr.name):], {})
        elif isinstance(expr, ir.SeparateReasoning):
            self._separate_reasoning(expr)
        else:
            raise TypeError(f"the executor cannot run {type(expr).__name__} nodes")

    def _sampling_params(self, gen: ir.Gen) -> dict:
        from treadle.lang.global_config import global_config

        params = {**global_config.output_params(), **{_PARAM_NAMES.get(k, k): v for k, v in self.defaults.items()}}
        params.update({_PARAM_NAMES.get(k, k): v for k, v in gen.params.items() if v is not None})
        template_stops = self.backend.template_stop_strs()  # a named template's, as SGLang adds them
        if template_stops:
            stop = params.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            params["stop"] = stop + [t for t in template_stops if t not in stop]
        if gen.dtype is not None:
            if "regex" in params and "regex" in gen.params:  # SGLang's warning: its dtype regex replaces it
                warnings.warn(f"Both dtype and regex are set. Only dtype will be used. dtype: {gen.dtype.__name__}, "
                              f"regex: {params.pop('regex')}", stacklevel=2)
            if any(k in params for k in GRAMMAR_FIELDS):
                raise ValueError(f"gen({gen.name!r}): dtype cannot be combined with json_schema/choices/ebnf")
            regex, _, stops = DTYPE_REGEX[gen.dtype]
            params["regex"] = regex
            if stops:
                stop = params.get("stop") or []
                stop = [stop] if isinstance(stop, str) else list(stop)
                params["stop"] = stop + [t for t in stops if t not in stop]
        return params

    def _gen(self, gen: ir.Gen) -> None:
        if self.tracing:
            self.trace_stopped = True
            return
        params = self._sampling_params(gen)
        logprob = {**self.logprob, **gen.logprob}
        name = gen.name or self.new_name()
        if speculation.holds_message(self):
            if any(k in params for k in GRAMMAR_FIELDS) or params.get("n", 1) != 1 or logprob.get("return_logprob"):
                raise ValueError(f"gen({name!r}): speculative execution (num_api_spec_tokens) sends the assistant "
                                 "message as one request: its gens cannot take regex/json_schema/ebnf/dtype, n or "
                                 "return_logprob")
            self._spec.append({"name": name, "stop": params.get("stop"), "params": params})
            return
        if speculation.takes_text(self, params, logprob):
            self.gen_starts[name] = len(self.text_)
            out, meta = speculation.text_gen(self, params)
            self._append(out, name)
            self._set_var(name, out, meta)
            return
        self.speculated = ""  # a gen made on its own: what was speculated no longer follows the text
        self.gen_starts[name] = len(self.text_)
        # SGLang's way to read the next token's distribution (its cot_decoding example): a gen
        # of max_tokens=0 with return_logprob gives one output position's logprobs (the next
        # token's top_logprobs_num) and writes no text. The runtime computes that position by
        # sampling one token, which is dropped.
        peek = params.get("max_new_tokens") == 0 and bool(logprob.get("return_logprob"))
        try:
            prompt = self._prompt_for_gen()
            if params.get("n", 1) != 1:
                self._gen_samples(name, prompt, params, logprob, peek)
                return
            if peek:
                _, meta = self.backend.generate(prompt, {**params, "max_new_tokens": 1}, logprob)
                out, meta = "", {**meta, "completion_tokens": 0, "finish_reason": {"type": "length", "length": 0}}
            elif self.stream:
                out, meta = "", {}
                for delta, meta in self.backend.generate_stream(prompt, params, logprob):
                    out += delta
                    self._append(delta, name, meta)
            else:
                out, meta = self.backend.generate(prompt, params, logprob)
                self._append(out, name)
        except ValueError as e:  # the runtime refused it: say which gen
            raise ValueError(f"gen({name!r}): {e}") from e
        if gen.dtype is not None:  # the value stays the text, as SGLang's, which stores it unchecked
            try:
                DTYPE_REGEX[gen.dtype][1](out)
            except ValueError:
                reason = (meta or {}).get("finish_reason") or {}
                kind = reason.get("type") if isinstance(reason, dict) else reason
                why = ("it stopped at max_tokens before the value was complete; raise max_tokens" if kind == "length"
                       else f"the stop string {reason.get('matched')!r} ended it before the value was complete"
                       if kind == "stop" and isinstance(reason, dict) and isinstance(reason.get("matched"), str)
                       else "is constrained decoding enabled on the backend?")
                # a warning, not an error: SGLang's program goes on with the text (a cut value too)
                warnings.warn(f"gen({name!r}, dtype={gen.dtype.__name__}) produced {out!r}, which does not "
                              f"parse: {why}", stacklevel=2)
        self._set_var(name, out, meta)

    def _gen_samples(self, name: str, prompt: Any, params: dict, logprob: dict, peek: bool) -> None:
        """gen(n=k), k > 1, as SGLang's on its OpenAI backend: the variable is the list of the k
        samples, and the text goes on with the first."""
        n = params["n"]
        if not getattr(self.backend, "supports_n", False):
            raise ValueError(f"n={n}: a gen makes one sample on {type(self.backend).__name__} (sgl.OpenAI makes "
                             "several); for several, use s.fork(n) and a gen in each branch")
        if self.stream or peek:
            raise ValueError(f"n={n} makes several samples, which cannot be streamed into one text "
                             "(run without stream=True) nor read as the next token's logprobs (max_tokens=0)")
        outs, meta = self.backend.generate(prompt, params, logprob)
        self.gen_starts[name] = len(self.text_)
        self._append(outs[0], name)
        self._set_var(name, list(outs), meta)

    def _prompt_for_gen(self) -> Any:
        """What a gen sends its backend: the text so far; for a chat-model API backend
        (`is_chat_model`, sgl.OpenAI), the messages before it, the gen being the first thing of
        an assistant message (else a ValueError, as SGLang's RuntimeError)."""
        if not getattr(self.backend, "is_chat_model", False):
            return self.text_
        if self.role != "assistant" or self.text_[self.role_start:].strip():
            raise ValueError(self.backend._not_after_assistant())
        return [dict(m) for m in self.messages_]

    def _select(self, sel: ir.Select) -> None:
        if self.tracing:
            self.trace_stopped = True
            return
        name = sel.name or self.new_name()
        self.speculated = ""  # the choice is scored, not generated: the speculation ends here
        try:
            choice, meta = self.backend.select(self.text_, sel.choices, sel.method)
        except ValueError as e:  # the runtime refused it: say which select, as a gen's does
            raise ValueError(f"select({name!r}): {e}") from e
        self.gen_starts[name] = len(self.text_)
        self._append(choice, sel.name, meta)  # a streamed text_async_iter(name, return_meta_data) yields it
        self._set_var(name, choice, meta)

    def _separate_reasoning(self, node: ir.SeparateReasoning) -> None:
        """Split variable `node.name` (its gen/select just ran) into answer and reasoning, and
        take the reasoning block out of the text where the gen wrote it."""
        if self.tracing:
            self.trace_stopped = True
            return
        value = self.variables.get(node.name)
        if not isinstance(value, str):
            raise ValueError(f"separate_reasoning: variable {node.name!r} holds no generated text ({value!r})")
        reasoning, answer = split_reasoning(value, node.model_type)
        start = self.gen_starts.get(node.name)
        with self._cv:
            if start is not None and self.text_[start:start + len(value)] == value:
                cut = start
                open_tag, _, inside = REASONING_MODEL_TYPES[node.model_type]
                if inside and open_tag not in value:
                    # the block opened before the gen: DeepSeek-R1's template (and Qwen3 thinking
                    # models') ends its generation prompt with "<think>\n". The tag leaves the text
                    # with the block, so the message reads "<｜Assistant｜>answer" as SGLang's
                    # text and the template's own rendering of the reply have it
                    opened = re.search(re.escape(open_tag) + r"\s*\Z", self.text_[:start])
                    if opened is not None:
                        cut = opened.start()
                self.text_ = self.text_[:cut] + answer + self.text_[start + len(value):]
                if cut < start:
                    self._shift_positions(cut, start)
        self._set_var(node.name, answer, self.meta.get(node.name) or {})
        self._set_var(reasoning_name(node.name), reasoning, {})

    def _shift_positions(self, cut: int, end: int) -> None:
        """Text [cut, end) was taken out: positions recorded past it move back, those in it to `cut`."""
        def moved(pos: int) -> int:
            return pos - (end - cut) if pos >= end else min(pos, cut)

        self.role_start = moved(self.role_start)
        self.fork_len = moved(self.fork_len)
        self.gen_starts = {k: moved(v) for k, v in self.gen_starts.items()}
        self.scope_starts = {k: moved(v) for k, v in self.scope_starts.items()}

    def _set_var(self, name: str, value: Any, meta: dict) -> None:
        with self._cv:
            self.variables[name] = value
            self.meta[name] = meta
            self.written[name] = None
            self._cv.notify_all()

    def _role_begin(self, role: str) -> None:
        template = self.backend.chat_template
        if not self.roles_used and role != "system":
            self.roles_used = True
            if template.default_system_prompt:  # a named (SGLang) template's: a system message, as SGLang
                self._role_begin("system")
                self._append(template.default_system_prompt)
                self._role_end("system")
            else:
                self._append(template.implicit_prefix)  # e.g. the model template's default system prompt
        self.roles_used = True
        prefix, _ = template.get_prefix_and_suffix(role, self.messages_)
        self._fill(prefix)
        self.role, self.role_start = role, len(self.text_)

    def _fill(self, text: str) -> None:
        """Append program text; speculated text goes on only past the same text (SGLang's fill)."""
        self.speculated = self.speculated[len(text):] if self.speculated.startswith(text) else ""
        self._append(text)

    def _role_end(self, role: str) -> None:
        assert self.role == role, f"role {role!r} ends but {self.role!r} is open"
        if self._spec:
            speculation.run_message(self)
        _, suffix = self.backend.chat_template.get_prefix_and_suffix(role, self.messages_)
        # the message's text, its leading whitespace stripped as SGLang's (the prompt keeps it)
        self.messages_.append({"role": role, "content": self.text_[self.role_start:].lstrip()})
        self.role = None
        self._fill(suffix)

    def _join(self, join: ir.Join) -> None:
        if join.mode == "concat":
            for br in join.branches:
                self._append(br.text_[br.fork_len:])
            return
        # gather, as SGLang's: each variable a branch has that the parent has not becomes the
        # list of the values of the branches that have it, in branch order; a name the parent
        # has (from before the fork, or set since) keeps the parent's value
        mine = set(self.variables)
        values: dict[str, list] = {}
        metas: dict[str, list] = {}
        for br in join.branches:
            for n in br.written:
                if n not in mine and n in br.variables:
                    values.setdefault(n, []).append(br.variables[n])
                    metas.setdefault(n, []).append(br.meta.get(n))
        for n, vals in values.items():
            self._set_var(n, vals, {"branches": metas[n]})


def __getattr__(name: str) -> Any:
    """SGLang's sglang.lang.interpreter also holds the state classes: `ProgramState`, and
    `ProgramStateGroup` (treadle's ForkGroup, what `s.fork(n)` returns)."""
    if name in ("ProgramState", "ProgramStateGroup"):
        from treadle.lang.state import ForkGroup, ProgramState

        return ProgramState if name == "ProgramState" else ForkGroup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name)

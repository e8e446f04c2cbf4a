"""TokenizerManager: the HTTP process's side of the runtime (asyncio).

It validates and tokenizes requests, sends them to the scheduler, and routes the
detokenizer's outputs back to the waiting handler, one `ReqState` per rid. A request whose
consumer goes away (client disconnect, cancelled task) is aborted so its KV is freed.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, TypeVar

import zmq
import zmq.asyncio

from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.io_struct import (AbortReq, ControlOut, ControlReq, OutputAccum, ReqOutput,
                                       TokenizedGenerateReq, split_samples)
from treadle.runtime.nesting import MAX_GRAMMAR_NESTING, json_depth
from treadle.runtime.sampling_params import GRAMMAR_FIELDS, SamplingParams
from treadle.runtime.tokenizer import check_text, token_texts
from treadle.runtime.request_checks import check_context, validate_request
from treadle.runtime.server.ipc import IpcPaths, StrOutput
from treadle.runtime.server.metrics import ServerMetrics
from treadle.runtime.server import tool_calls
from treadle.runtime.server.protocol import APIError, overloaded, quoted

log = logging.getLogger("treadle.server")
T = TypeVar("T")
BUILD_THREADS = 4  # threads that build requests (TokenizerManager.off_loop)
# A request whose body is this large or more is built on the bulk thread(s) instead: 64 MiB
# /tokenize bodies (64 texts of a million characters each: a minute of tokenizing apiece) took
# all BUILD_THREADS, and every other client's request, however small, waited to be built. Bulk
# requests now wait for each other, never the small ones for them.
BULK_BODY_BYTES = 1 << 20
# a prompt with more characters than this many a token of the context is counted by its start
# first (TokenizerManager.encode): most text has 3-5 characters a token
PROBE_CHARS_PER_TOKEN = 8
BULK_THREADS = 1
_bulk_request = contextvars.ContextVar("treadle_bulk_request", default=False)


def mark_request_size(nbytes: int) -> None:
    """Record the size of the body of the request the current task serves: its builder work
    (TokenizerManager.off_loop) then goes to the bulk thread(s) when it is BULK_BODY_BYTES or more."""
    _bulk_request.set(nbytes >= BULK_BODY_BYTES)
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # OpenAI's message roles
MAX_STOP_STRINGS = 128  # a request's stop strings (OpenAI takes 4)
# a client's request id: it is copied into each part of a batch or of n samples ("<rid>-<i>") and
# echoed in each one's result, so a 1 MB rid with n=64 made a 64 MB /generate answer (a 64 MB
# one with n=128, 8 GB)
MAX_RID_CHARS = 512


def check_rid(rid: Any) -> None:
    """A 400 for a client's request id (`rid`) longer than MAX_RID_CHARS."""
    if isinstance(rid, str) and len(rid) > MAX_RID_CHARS:
        raise APIError.bad_request(f"rid has {len(rid):,} characters; this server takes at most {MAX_RID_CHARS}",
                                   "rid")
# prompt logprob values (scored prompt tokens x (1 + top logprobs)) one request may ask for, over
# its prompts and n samples: 24 full 8k-token prompts with top 20, 256 2k-token ones with top 1
MAX_PROMPT_LOGPROB_ENTRIES = 1 << 22
# output logprob values (tokens a request may generate x (1 + top logprobs)) one request may ask
# for, over its prompts and n samples. Each is kept as Python objects in the scheduler and in the
# HTTP process until the reply is sent, and rendered there: measured at about 0.9 KB a value in
# the HTTP process at a chat reply's peak (8 samples x 1,000 tokens x top 20: +145 MiB, an 11.9 MB
# reply) and 0.2 KB in the scheduler, so n=4,096 x 8,000 tokens x top 20 (688M values, all
# accepted before) would have wanted hundreds of GB. A real use stays far under: 8 samples of
# 8,192 tokens with top 20 are 1.4M values; the cap holds 24 of them
MAX_OUTPUT_LOGPROB_ENTRIES = 1 << 22


def output_logprob_entries(reqs: list[TokenizedGenerateReq], context_len: int) -> int:
    """The output logprob values `reqs` may ask for at most: each one with logprobs scores every
    token it may generate (max_new_tokens, cut by the context) with 1 + top logprobs values."""
    total = 0
    for r in reqs:
        if r.return_logprob:
            most = max(0, min(r.sampling_params.max_new_tokens, context_len - len(r.input_ids)))
            total += most * (1 + max(0, r.top_logprobs_num))
    return total


@dataclass
class Chunk:
    """One step of a request's progress: what is new, plus everything so far in `acc`."""
    text: str
    ids: list[int]
    logprobs: list[float]
    top_logprobs: list
    acc: "Accum"
    finished: bool
    # the request's own failure (generate(..., errors_as_output=True)): the error a request of
    # its own would have been answered with; the chunk is its last, with what it made before
    error: APIError | None = None


def request_log_line(o: ReqOutput, latency: float) -> str:
    """--log-requests' line for a finished request (never its text). The client's rid, and an
    error that may quote the client, are written as one line: a rid holding a line break
    ("x\\nrequest admin: ...") wrote log lines of the client's making."""
    def one_line(s: str) -> str:
        return s if s.isprintable() else repr(s)[1:-1]

    finish = f"error ({one_line(o.error)})" if o.error else (o.finished or {}).get("type")
    return (f"request {one_line(o.rid)}: {o.prompt_tokens} prompt tokens ({o.cached_tokens} cached), "
            f"{o.completion_tokens} generated, finish {finish}, {latency:.3f}s")


def merge_chunks(a: Chunk, b: Chunk) -> Chunk:
    """One chunk for two consecutive chunks of a request: `a`'s news then `b`'s, `b`'s state
    (for streaming.merge_streams)."""
    return Chunk(a.text + b.text, a.ids + b.ids, a.logprobs + b.logprobs, a.top_logprobs + b.top_logprobs, b.acc,
                 b.finished, b.error)


class Accum(OutputAccum):
    """A request's output so far, with its text (the detokenizer's deltas)."""

    def __init__(self, req: TokenizedGenerateReq, decode=None) -> None:
        super().__init__(req, decode)
        self.rid = req.rid
        self.text = ""

    def result(self, rid: str | None = None, text: str | None = None) -> dict:
        """The native /generate response object."""
        return super().result(self.rid if rid is None else rid, self.text if text is None else text)


@dataclass
class ReqState:
    queue: asyncio.Queue
    created: float  # time.monotonic(), the clock of ReqOutput.first_token_at
    last_token: float | None = None
    internal: bool = False  # a health probe: not in the request metrics
    aliases: tuple[str, ...] = ()  # the other rids /abort_request reaches it by (its batch's, ...)
    sent: bool = False  # False while reserved (see `reserve`): not in the scheduler yet
    aborted: bool = False  # aborted while reserved: it will be finished as aborted, unsent


class SchedulerDied(Exception):
    pass


class ServerStopping(Exception):
    """Put in the queue of a request the scheduler could not end before the server exits
    (`end_all`): the request ends as aborted, with what it has so far."""


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str] | None:
    """The names a Jinja chat template reads from its context (None when it cannot be parsed
    here: then every variable is passed)."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2 import meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class _Generation(jinja2.ext.Extension):  # transformers' {% generation %} block, parsed alike
            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.Scope(body, lineno=lineno)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_Generation, jinja2.ext.loopcontrols])
        return frozenset(meta.find_undeclared_variables(env.parse(template)))
    except Exception:  # noqa: BLE001 (a template this parse does not take renders as it is)
        return None


def _renderer_arguments(tokenizer: Any) -> set[str]:
    """The names chat_template_kwargs cannot take: the parameters of the chat template
    renderer's functions (the tokenizer's apply_chat_template, transformers' Jinja renderer
    and Jinja's render, `self` included), and the variables it sets itself."""
    own = {"self", "messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
           "chat_template", "tokenize"}
    fns = [getattr(type(tokenizer), "apply_chat_template", None)]
    try:
        from transformers.utils.chat_template_utils import render_jinja_template

        fns.append(render_jinja_template)
    except ImportError:  # an older transformers: its renderer's arguments are apply_chat_template's
        pass
    for fn in fns:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        own |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return own


def _output_error(r: TokenizedGenerateReq, out: ReqOutput) -> APIError:
    """The error a request that ended with `out.error` is answered with: a 500 for a failed
    batch step that is the server's fault, not the request's, else a 400 (its grammar could
    not go on, named by the grammar's field, or the request made its batch step fail, run
    alone, twice: scheduler._recover)."""
    if out.internal:
        return APIError(out.error, 500, "server_error", None, "internal_error")
    grammar = [f for f in GRAMMAR_FIELDS if getattr(r.sampling_params, f) is not None]
    return APIError.bad_request(out.error, grammar[0] if grammar and out.error.startswith("grammar") else None)


class TokenizerManager:
    def __init__(self, args: EngineArgs, tokenizer: Any, model_info: dict, paths: IpcPaths,
                 metrics: ServerMetrics) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.model_info = model_info
        self.vocab_size: int = model_info["vocab_size"]
        self.context_len: int = model_info["context_len"]
        self.num_slots: int = model_info["num_slots"]
        # in flight = running + queued; beyond this new requests get a 503
        self.max_in_flight = model_info["max_running"] + args.max_queued_requests
        self.paths = paths
        self.metrics = metrics
        self.states: dict[str, ReqState] = {}
        # the rids of the prompt warm-ups running (warm_prefixes): the server's own prefills, in
        # `states` but not counted in flight (a 12-part request at a limit of 12 read "13, limit 12")
        self._warm_rids: set[str] = set()
        self.control_futs: dict[int, asyncio.Future] = {}
        self.control_ids = itertools.count(1)
        self.draining = False
        self.dead: str | None = None
        # the scheduler's latest info() snapshot (sent every STATS_PERIOD_S between steps) and
        # when anything last came from it: what /metrics serves, what the watchdog checks
        self.sched_info: dict | None = model_info.get("stats")
        self.sched_heard = time.monotonic()
        self.last_output_at = 0.0  # time.monotonic() of the last request output (a busy server's pulse)
        self._push_ctx = zmq.Context(1)
        self._push = self._push_ctx.socket(zmq.PUSH)
        self._push.connect(paths.scheduler_in)
        self._pull_ctx = zmq.asyncio.Context(1)
        self._pull = self._pull_ctx.socket(zmq.PULL)
        self._pull.bind(paths.tokenizer_in)
        self._recv_task: asyncio.Task | None = None
        # requests are built (tokenized, chat templates applied, checked) on these threads, not
        # on the event loop: a 600k-character prompt takes half a second to tokenize, and every
        # stream, probe and other request would wait for it. The Rust tokenizer lets go of the
        # GIL while it works, and encoding without truncation or padding changes no tokenizer
        # state, so several may run at once.
        self._builders = concurrent.futures.ThreadPoolExecutor(BUILD_THREADS, thread_name_prefix="treadle-build")
        self._bulk_builders = concurrent.futures.ThreadPoolExecutor(BULK_THREADS, thread_name_prefix="treadle-bulk")
        from treadle.constrained.index.vocabulary import token_bytes_table

        # each token's bytes (logprob entries): a tenth of a second, once, at start-up
        self._token_table: list[bytes | None] = []
        if tokenizer is not None:
            try:
                self._token_table = token_bytes_table(tokenizer)
            except Exception as e:  # a vocabulary it cannot read: logprob entries use the token's text
                log.warning("no token byte table (%s: %s); logprob bytes are the token texts'", type(e).__name__, e)

    # ================================================================== lifecycle

    def start(self) -> None:
        """Start routing outputs; call from inside the server's event loop."""
        self._recv_task = asyncio.get_running_loop().create_task(self._recv_loop())

    def recv_failure(self) -> str | None:
        """Why the output loop ended, if it failed (nothing then reaches a waiting request)."""
        t = self._recv_task
        if t is None or not t.done() or t.cancelled() or t.exception() is None:
            return None
        e = t.exception()
        return f"{type(e).__name__}: {e}"

    def token_bytes(self, tid: int) -> bytes | None:
        """The bytes token `tid` adds to a text, whole (its decoded text turns a piece of a
        multi-byte character into U+FFFD); None for a special token, or with no tokenizer."""
        table = self._token_table
        return table[tid] if 0 <= tid < len(table) else None

    def close(self) -> None:
        if self._recv_task is not None:
            self._recv_task.cancel()
        self._builders.shutdown(wait=False, cancel_futures=True)
        self._bulk_builders.shutdown(wait=False, cancel_futures=True)
        self._push.close(linger=0)
        self._pull.close(linger=0)
        self._push_ctx.term()
        self._pull_ctx.term()

    def fail_all(self, reason: str) -> None:
        """A child process died: wake every waiting handler with an error, refuse new work."""
        self.dead = reason
        for st in self.states.values():
            st.queue.put_nowait(SchedulerDied(reason))
        for fut in self.control_futs.values():
            if not fut.done():
                fut.set_exception(SchedulerDied(reason))

    def end_all(self, reason: str) -> int:
        """End every request still waiting on the scheduler as aborted now (the server is
        exiting and the scheduler, in a long step, has not processed their aborts): their
        handlers answer normally instead of being cancelled mid-response. Returns how many."""
        states = list(self.states.items())
        self.states.clear()
        for _, st in states:
            st.queue.put_nowait(ServerStopping(reason))
        return len(states)

    @property
    def num_in_flight(self) -> int:
        """The clients' requests held (a prompt's warm-up is not one of them)."""
        return len(self.states) - sum(rid in self.states for rid in self._warm_rids)

    async def _recv_loop(self) -> None:
        while True:
            msgs = await self._pull.recv_pyobj()
            self.sched_heard = time.monotonic()
            for m in msgs:
                if isinstance(m, ControlOut) and m.kind == "stats":
                    self.sched_info = m.result
                    continue
                if isinstance(m, ControlOut):
                    fut = self.control_futs.pop(m.req_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(m.result)
                    continue
                assert isinstance(m, StrOutput), f"unexpected message {type(m).__name__}"
                self.last_output_at = time.monotonic()
                st = self.states.get(m.out.rid)
                if st is None:
                    continue  # output of a request already given up on
                if m.out.finished is not None:
                    del self.states[m.out.rid]  # its KV is released once it is finished
                    # counted here, not by the handler: one whose client left is gone by now
                    latency = time.monotonic() - st.created
                    if not st.internal:
                        self.metrics.on_finish(m.out, latency)
                    if self.args.log_requests and not st.internal:
                        log.info("%s", request_log_line(m.out, latency))
                st.queue.put_nowait(m)

    # ================================================================== building requests

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a builder thread (its exceptions raised here): for work that
        tokenizes, which must not hold the event loop. For a request with a large body
        (mark_request_size), on the bulk thread(s)."""
        pool = self._bulk_builders if _bulk_request.get() else self._builders
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))

    def encode(self, text: str, param: str = "text", add_special_tokens: bool = True,
               must_fit: bool = True) -> list[int]:
        """The prompt's token ids; a text too long to fit the context whatever its tokens is a
        400 before any tokenizing (a 10 MB prompt took seconds). `param`: the field the text
        came in; `add_special_tokens` false leaves out what the tokenizer adds (BOS).

        `must_fit` (a prompt to generate from, not /tokenize's text): a text of more than
        PROBE_CHARS_PER_TOKEN characters a token of the context is counted by its start
        first, and refused if that alone is well past the context: a 540 KB prompt of words
        was tokenized whole (0.9 s of a builder thread) to be refused for its 300,000 tokens,
        and 8 clients sending such prompts held every builder, every other request waiting
        5-7 s to be built (0.1 s before)."""
        if self.tokenizer is None:
            raise APIError.bad_request("this model has no tokenizer: send input_ids instead of text", param)
        if len(text) > self.max_prompt_chars:
            raise APIError.bad_request(
                f"the prompt has {len(text)} characters, more than the context length {self.context_len} can "
                f"hold in any tokenization (at most {self.max_prompt_chars}); shorten it", param)
        from treadle.runtime.tokenizer import check_text, encode_prompt

        try:
            check_text(text)
        except ValueError as e:
            raise APIError.bad_request(e, param) from e
        probe = self.context_len * PROBE_CHARS_PER_TOKEN
        if must_fit and len(text) > probe:
            # a prefix's tokens are the text's own but near the cut: a margin covers those
            counted = len(self.tokenizer.encode(text[:probe], add_special_tokens=False))
            if counted > self.context_len + self.context_len // 4 + 64:
                raise APIError.bad_request(
                    f"the prompt has more than {self.context_len} tokens (its first {probe} characters alone make "
                    f"{counted}), more than the context length {self.context_len} allows (at most "
                    f"{self.context_len - 1}); shorten it", param)
        if not add_special_tokens:
            return self.tokenizer.encode(text, add_special_tokens=False)
        return encode_prompt(self.tokenizer, text)

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """Characters beyond which a text has more tokens than the context: the context length
        times the longest token's spelling (a byte-level or sentencepiece vocabulary key is at
        least as long as the text it stands for)."""
        try:
            longest = max(len(t) for t in self.tokenizer.get_vocab())
        except Exception:  # a tokenizer without a vocabulary listing: no bound
            return 1 << 62
        return longest * self.context_len

    def chat_prompt(self, messages: Any, tools: tool_calls.ToolPlan | None = None,
                    template_kwargs: Any = None, add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> str:
        """The prompt text for OpenAI-style `messages` (and the request's tools, see tool_calls.py;
        `template_kwargs`: extra template variables, e.g. Qwen3's enable_thinking). As vLLM's:
        `add_generation_prompt` opens the assistant's turn; `continue_final_message` ends the
        prompt inside the last message, an assistant reply the model continues."""
        from treadle.runtime.tokenizer import apply_chat_template, get_chat_template

        if not isinstance(messages, list) or not messages:
            raise APIError.bad_request("messages must be a non-empty list", "messages")
        if len(messages) > self.context_len:  # refused before rendering (100,000 took 1.6 s of a builder)
            raise APIError.bad_request(f"{len(messages)} messages: more than the context length "
                                       f"({self.context_len} tokens) holds, each message taking tokens of its own",
                                       "messages")
        if template_kwargs is not None:
            if not isinstance(template_kwargs, dict):
                raise APIError.bad_request("chat_template_kwargs must be an object of template variables",
                                           "chat_template_kwargs")
            # template variables only: not the renderer's own arguments (tokenize, chat_template,
            # self, conversations, ...), which made a TypeError quoting transformers' internals
            # nested JSON the template may walk: past the limit the grammar fields have
            # (nesting.MAX_GRAMMAR_NESTING), not a RecursionError quoted from the renderer
            if json_depth(template_kwargs) > MAX_GRAMMAR_NESTING:
                raise APIError.bad_request(f"chat_template_kwargs nests more than {MAX_GRAMMAR_NESTING} levels deep "
                                           "(the limit on nested JSON in a request's fields); flatten it",
                                           "chat_template_kwargs")
            own = _renderer_arguments(self.tokenizer)
            taken = next((k for k in template_kwargs if k in own), None)
            if taken is not None:
                raise APIError.bad_request(
                    f"chat_template_kwargs: {quoted(taken)} is an argument of the chat template renderer, not a "
                    f"template variable (the names it reserves: {', '.join(sorted(own))})", "chat_template_kwargs")
            # only the variables the template reads, which alone can change its text: each
            # call of the renderer copies its keyword arguments in C, with the GIL held
            # (500,000 of them stopped every other client for 0.3 s a copy)
            names = template_variables(get_chat_template(self.tokenizer) or "")
            if names is not None:
                template_kwargs = {k: v for k, v in template_kwargs.items() if k in names}
        norm = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise APIError.bad_request(f"messages[{i}] must be an object with a string 'role'", "messages")
            if m["role"] not in CHAT_ROLES:  # as OpenAI: a role the template may not know is not rendered blindly
                raise APIError.bad_request(f"messages[{i}].role: invalid value {quoted(m['role'])}; supported "
                                           f"values are {', '.join(repr(r) for r in CHAT_ROLES)}", f"messages[{i}].role")
            content = m.get("content")
            if content is None and m["role"] != "assistant":  # an assistant's may be left out (its tool calls)
                raise APIError.bad_request(f"messages[{i}]: a {m['role']} message needs a 'content' (a string or a "
                                           "list of text parts)", f"messages[{i}].content")
            m = tool_calls.legacy_message(i, m)  # function_call / a function message: as tool calls and results
            if isinstance(content, list):  # content parts: only text (and an assistant's refusal) carry meaning here
                texts = []
                for part in content:
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind not in ("text", "refusal") or not isinstance(part.get(kind), str):
                        raise APIError.bad_request(f"messages[{i}].content: only text parts (and refusal parts) "
                                                   "are supported", "messages")
                    texts.append(part[kind])
                content = "".join(texts)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise APIError.bad_request(f"messages[{i}].content must be a string or a list of text parts",
                                           "messages")
            tool_calls.check_message_tool_fields(i, m)
            entry = {**{k: m[k] for k in ("tool_calls", "tool_call_id", "name") if m.get(k) is not None},
                     "role": m["role"], "content": content}
            for key in ("content", "name", "tool_call_id"):  # named here, not by a character of the prompt
                if isinstance(entry.get(key), str):
                    try:
                        check_text(entry[key])
                    except ValueError as e:
                        raise APIError.bad_request(f"messages[{i}].{key}: {e}", "messages") from None
            norm.append(entry)
        if continue_final_message and norm[-1]["role"] != "assistant":
            raise APIError.bad_request("continue_final_message needs an assistant message last (the reply to "
                                       "continue)", "continue_final_message")
        template = get_chat_template(self.tokenizer)
        if template is not None and "developer" not in template:
            # OpenAI's developer messages take the place of system ones; a template that does
            # not know the role would show it as a turn the model never saw in training
            norm = [{**m, "role": "system"} if m["role"] == "developer" else m for m in norm]
        native = tool_calls.template_knows_tools(template)
        try:
            norm = tool_calls.render_messages(norm, tools, native)
        except RecursionError as e:  # a tool call's arguments, JSON text, nested past what Python reads
            raise APIError.bad_request(f"messages: a tool call's arguments nest too deeply to read; keep them within "
                                       f"{MAX_GRAMMAR_NESTING} levels", "messages") from e
        try:
            return apply_chat_template(self.tokenizer, norm, add_generation_prompt=add_generation_prompt,
                                       tools=[t.spec for t in tools.tools] if tools is not None and native else None,
                                       continue_final_message=continue_final_message, **(template_kwargs or {}))
        except RecursionError as e:  # a message's own fields nested too deeply for the template to walk
            raise APIError.bad_request(f"cannot apply the chat template: messages or tools nest too deeply for it; "
                                       f"keep them within {MAX_GRAMMAR_NESTING} levels", "messages") from e
        except Exception as e:  # a template error is the caller's input problem (e.g. role order)
            raise APIError.bad_request(f"cannot apply the chat template: {e}", "messages") from e

    def make_req(self, *, text: str | None = None, input_ids: Any = None, params: Any = None,
                 return_logprob: bool = False, logprob_start_len: int | None = None,
                 top_logprobs_num: int = 0, return_text_in_logprobs: bool = False, stream: bool = False,
                 rid: str | None = None) -> TokenizedGenerateReq:
        """Validate everything the scheduler would and build the request; raises APIError(400)."""
        if text is not None:
            if not isinstance(text, str):
                raise APIError.bad_request("text must be a string or a list of strings", "text")
            ids = self.encode(text)
        else:
            if not isinstance(input_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in input_ids):
                raise APIError.bad_request("input_ids must be a list of integers (or a list of such lists)",
                                           "input_ids")
            ids = list(input_ids)
        try:
            sp = SamplingParams.from_dict(dict(params) if isinstance(params, dict) else params)
            sp.apply_leniency(self.args.json_schema_lenient, mode=self.args.json_schema_mode,
                              whitespace_pattern=self.args.json_whitespace_pattern,
                              max_recursion_depth=self.args.grammar_max_recursion_depth)
        except (ValueError, TypeError) as e:
            raise APIError.bad_request(e) from e
        # every stop string is looked for after each token, in the detokenizer process and the
        # scheduler step that every request shares: 200,000 of them (a 1.6 MB body) took the
        # detokenizer 0.4 s a token, stalling every client's output meanwhile
        # (tools without parallel calls add their own closing tag to `stop`: not the client's to count)
        for name, got, cap in (("stop", len(sp.stop), MAX_STOP_STRINGS + (tool_calls.STOP in sp.stop)),
                               ("stop_token_ids", len(sp.stop_token_ids), self.vocab_size or MAX_STOP_STRINGS)):
            if got > cap:
                raise APIError.bad_request(f"sampling_params.{name} has {got} entries; this server takes at most "
                                           f"{cap}", name)
        if return_text_in_logprobs is True and self.tokenizer is None:
            raise APIError.bad_request("this model has no tokenizer to give token texts",
                                       "return_text_in_logprobs")
        if rid is not None and not isinstance(rid, str):
            raise APIError.bad_request("rid must be a string", "rid")
        if rid is not None:  # echoed in every response: one that cannot be UTF-8 failed it with a 500
            if len(rid) > MAX_RID_CHARS + 16:  # the rid checked where it came in, and its part's suffix
                check_rid(rid)
            try:
                check_text(rid)
            except ValueError as e:
                raise APIError.bad_request(f"rid: {e}", "rid") from None
        r = TokenizedGenerateReq(rid=rid or uuid.uuid4().hex, input_ids=ids, sampling_params=sp,
                                 return_logprob=return_logprob,
                                 logprob_start_len=-1 if logprob_start_len is None else logprob_start_len,
                                 top_logprobs_num=0 if top_logprobs_num is None else top_logprobs_num, stream=stream,
                                 return_text_in_logprobs=return_text_in_logprobs)
        try:
            check_context(len(ids), params, self.context_len)
            validate_request(r, self.vocab_size, self.context_len, self.num_slots)
        except (ValueError, TypeError) as e:
            err = APIError.bad_request(e)
            if err.param is None and str(e).startswith("prompt ("):
                # "prompt (N tokens) + max_new_tokens (M) can never fit the KV pool ...; lower
                # max_new_tokens": the field to change (its param named the prompt)
                err.param = "max_new_tokens"
            elif err.param is None and str(e).startswith("the prompt"):
                err.param = "text" if text is not None else "input_ids"
            raise err from e
        return r

    def expand_n(self, r: TokenizedGenerateReq) -> list[TokenizedGenerateReq]:
        """n parallel samples become n requests (io_struct.split_samples), if they can all be held."""
        n = r.sampling_params.n
        if n > self.max_in_flight:  # could never all be admitted: not worth a retry
            raise APIError.bad_request(f"n={n} is more than this server holds at once ({self.max_in_flight} "
                                       "requests running and queued)", "n")
        return split_samples(r)  # a seeded request's sample j: sampling_params.sample_seed

    # ================================================================== running requests

    def check_prompt_count(self, n: int, param: str) -> None:
        """A 400 for a list of more prompts than the server holds at once, before any of them
        is tokenized: 100,000 one-letter prompts held a builder thread for seconds (a 64 MiB
        body of them, minutes) only to be refused after, and four such requests stopped every
        other client's request from being built meanwhile."""
        if n > self.max_in_flight:
            raise APIError.bad_request(
                f"{param} holds {n} prompts, more than this server holds at once ({self.max_in_flight}: "
                "--max-running-requests + --max-queued-requests); it could never be admitted: split it", param)

    def check_prompt_logprobs(self, reqs: list[TokenizedGenerateReq], param: str) -> None:
        """A 400 for a request whose prompt logprobs (echo + logprobs, logprob_start_len) come
        to more than MAX_PROMPT_LOGPROB_ENTRIES values over all its parts: each scored prompt
        position is a row of logits over the vocabulary, and its logprob and top logprobs are
        kept as Python objects until the reply is sent. n samples score the same prompt n times:
        echo + logprobs 20 over an 8,000-token prompt with n=128 asked for 21M values (hours of
        CPU steps, gigabytes in each process the reply passes through)."""
        total = 0
        for r in reqs:
            if r.return_logprob and r.logprob_start_len is not None and r.logprob_start_len >= 0:
                total += max(0, len(r.input_ids) - r.logprob_start_len) * (1 + max(0, r.top_logprobs_num))
        if total > MAX_PROMPT_LOGPROB_ENTRIES:
            raise APIError.bad_request(
                f"the request asks for {total:,} prompt logprob values (scored prompt tokens times 1 + top "
                f"logprobs, over its prompts and n samples), more than the {MAX_PROMPT_LOGPROB_ENTRIES:,} "
                "one request may: ask for fewer top logprobs or samples, or split it", param)

    def check_output_logprobs(self, reqs: list[TokenizedGenerateReq], logprobs: str, max_tokens: str,
                              param: str) -> None:
        """A 400 for a request whose output logprobs could come to more than
        MAX_OUTPUT_LOGPROB_ENTRIES values over all its parts (output_logprob_entries), before any
        of it runs. `logprobs`, `max_tokens`: the route's names of the top logprobs and of the
        token limit, for the message; `param`: the field the 400 names."""
        total = output_logprob_entries(reqs, self.context_len)
        if total <= MAX_OUTPUT_LOGPROB_ENTRIES:
            return
        scored = [r for r in reqs if r.return_logprob]
        shapes = {(min(r.sampling_params.max_new_tokens, self.context_len - len(r.input_ids)), r.top_logprobs_num)
                  for r in scored}
        if len(shapes) == 1:
            ((most, top),) = shapes
            how = (f"{len(scored):,} sample{'s' * (len(scored) != 1)} (prompts times n) x up to {most:,} tokens "
                   f"({max_tokens}) x (1 + {top} {logprobs})")
        else:
            how = f"over {len(scored):,} samples (prompts times n), each up to its {max_tokens} x (1 + its {logprobs})"
        raise APIError.bad_request(
            f"the request asks for up to {total:,} output logprob values ({how}), more than the "
            f"{MAX_OUTPUT_LOGPROB_ENTRIES:,} one request may: lower n, {max_tokens} or {logprobs}, or split it", param)

    def check_capacity(self, n: int) -> None:
        """Raise 503 when draining, dead, or `n` more requests would overflow the queue; 400
        when `n` is more than the server ever holds at once (a retry would never help)."""
        if n > self.max_in_flight:
            raise APIError.bad_request(
                f"the request makes {n} requests (prompts times n), more than this server holds at once "
                f"({self.max_in_flight}: --max-running-requests + --max-queued-requests); it could never be "
                "admitted: split it")
        if self.dead:
            raise overloaded(f"the server is shutting down: {self.dead}")
        if self.draining:
            raise overloaded("the server is shutting down and accepts no new requests")
        if self.num_in_flight + n > self.max_in_flight:
            # a request of several parts is refused below the limit: say why ("(47, limit 48)"
            # alone read as a refusal with room left)
            left = max(0, self.max_in_flight - self.num_in_flight)
            parts = f"; this request makes {n} (prompts times n), more than the {left} left" if n > 1 else ""
            raise overloaded(f"too many requests in flight ({self.num_in_flight}, limit {self.max_in_flight}{parts}); "
                             "retry later")

    async def warm_prefixes(self, reqs: list[TokenizedGenerateReq],
                            aliases: dict[str, tuple[str, ...]] | None = None) -> dict[str, int]:
        """Before several samples of one prompt, prefill it once (max_new_tokens=0) so the
        samples share its KV through the radix cache instead of each computing it. The
        warm-up answers to the names of the requests it serves (their rids and `aliases`):
        an /abort_request for them stops it too (with `reserve`, they then never start).
        Returns, for each request warmed, the prompt tokens the cache held before its warm-up
        (what its usage reports as cached: its own count is the warm-up's doing)."""
        cached: dict[str, int] = {}
        if self.args.disable_radix_cache:
            return cached
        groups: dict[tuple, list[TokenizedGenerateReq]] = {}
        for r in reqs:
            groups.setdefault(tuple(r.input_ids), []).append(r)
        for key, group in groups.items():
            if len(group) > 1:
                names = tuple(dict.fromkeys(n for r in group for n in (r.rid, *(aliases or {}).get(r.rid, ()))))
                warm = TokenizedGenerateReq(uuid.uuid4().hex, list(key), SamplingParams(max_new_tokens=0))
                # counted in the metrics (a prefill the scheduler did), unlike a health probe
                last = None
                self._warm_rids.add(warm.rid)
                try:
                    async for c in self.generate(warm, names):
                        last = c
                finally:
                    self._warm_rids.discard(warm.rid)
                if last is not None and last.acc.last is not None:
                    cached.update((r.rid, last.acc.last.cached_tokens) for r in group)
        return cached

    @contextlib.contextmanager
    def reserve(self, reqs: list[TokenizedGenerateReq], aliases: dict[str, tuple[str, ...]]):
        """Hold the rids of `reqs` from now on (before their prompt is warmed), so that
        /abort_request finds them before they are sent: `generate` then finishes an aborted
        one as aborted without sending it. Whatever was not sent is released on exit. A 503
        when they would overflow the in-flight limit (`check_capacity`)."""
        if any(r.rid in self.states for r in reqs):
            raise APIError.bad_request(f"request id {quoted(next(r.rid for r in reqs if r.rid in self.states))} is "
                                       "already in use", "rid")
        # checked again where they are registered, with no await between: the handlers'
        # early check can pass for many requests of a burst before any of them is held
        self.check_capacity(len(reqs))
        held = {r.rid: ReqState(asyncio.Queue(), time.monotonic(), aliases=aliases.get(r.rid, ())) for r in reqs}
        self.states.update(held)
        try:
            yield
        finally:
            for rid, st in held.items():
                if not st.sent and self.states.get(rid) is st:
                    del self.states[rid]

    async def generate(self, r: TokenizedGenerateReq, aliases: tuple[str, ...] = (),
                       internal: bool = False, errors_as_output: bool = False) -> AsyncIterator[Chunk]:
        """Send `r` and yield its progress. Stops after the finished chunk; raises APIError on
        a scheduler-side rejection. If the consumer stops early, the request is aborted.
        ``aliases``: other rids `abort_named` stops it by (the batch or n samples it is part of).
        ``internal``: the server's own probe, left out of the metrics. ``errors_as_output``:
        the request's failure (its own, or a failed batch step's) is its last chunk, with what
        it made before and the APIError in `error`, instead of raised: one part of a batch
        failing leaves the others' results alone (a server process dying still raises)."""
        st = self.states.get(r.rid)
        if st is None:
            st = self.states[r.rid] = ReqState(asyncio.Queue(), time.monotonic(), aliases=aliases,
                                               internal=internal)
        elif st.sent:
            raise APIError.bad_request(f"request id {quoted(r.rid)} is already in use", "rid")
        acc = Accum(r, functools.partial(token_texts, self.tokenizer))
        acc.created = st.created  # its arrival (a shared prompt's warm-up may come first)
        if st.aborted:  # reserved, then aborted before it was sent
            del self.states[r.rid]
            acc.add(ReqOutput(r.rid, [], {"type": "abort", "message": "aborted"}, len(r.input_ids), 0, 0))
            yield Chunk("", [], [], [], acc, True)
            return
        st.sent = True
        self._push.send_pyobj([r])
        finished = False
        held: list = []  # an output taken from the queue while merging, for the next chunk
        try:
            while True:
                m = held.pop() if held else await st.queue.get()
                if isinstance(m, SchedulerDied):
                    raise APIError(f"a server process died: {m}", 503, "server_error", None, "server_process_died")
                if isinstance(m, ServerStopping):
                    last = acc.last
                    m = StrOutput(ReqOutput(r.rid, [], {"type": "abort", "message": str(m)},
                                            last.prompt_tokens if last else len(r.input_ids), len(acc.ids),
                                            last.cached_tokens if last else 0), "")
                out = m.out
                finished = out.finished is not None
                error = _output_error(r, out) if out.error else None
                if error is not None and not errors_as_output:
                    raise error
                self._observe(st, out, finished)
                acc.text += m.text_delta
                acc.add(out)
                text, ids = m.text_delta, list(out.new_ids)
                lps, tops = list(out.output_logprobs), list(out.output_top_logprobs)
                # the outputs that queued while the consumer was busy (a client reading slowly,
                # a big chunk rendering) come in this one chunk: a stream of cumulative chunks
                # (/generate's, prompt logprobs in each) rendered and sent every one of them,
                # megabytes each, however far behind it was, holding the event loop meanwhile
                while not finished and error is None and not st.queue.empty():
                    nxt = st.queue.get_nowait()
                    if not isinstance(nxt, StrOutput) or nxt.out.error:
                        held.append(nxt)  # a failure or the server's end: a chunk of its own
                        break
                    o = nxt.out
                    finished = o.finished is not None
                    self._observe(st, o, finished)
                    acc.text += nxt.text_delta
                    acc.add(o)
                    text += nxt.text_delta
                    ids += o.new_ids
                    lps += o.output_logprobs
                    tops += o.output_top_logprobs
                yield Chunk(text, ids, lps, tops, acc, finished, error)
                if finished:
                    return
        finally:
            if not finished:
                self.abort(r.rid)

    def abort(self, rid: str) -> bool:
        """Ask the scheduler to stop `rid` (its finished output then removes the state)."""
        st = self.states.get(rid)
        if st is None or self.dead:
            return False
        if not st.sent:  # reserved: generate() finishes it as aborted instead of sending it
            st.aborted = True
            return True
        self._push.send_pyobj([AbortReq(rid)])
        return True

    def abort_named(self, name: str) -> bool:
        """Abort the request `name` and the parts of a batch or of n samples sent as `name`
        (exactly those: another request's "<name>-1" is not one of them)."""
        hits = [rid for rid, st in self.states.items() if rid == name or name in st.aliases]
        return any([self.abort(rid) for rid in hits])

    def abort_all(self) -> int:
        for rid in list(self.states):
            self.abort(rid)
        return len(self.states)

    async def scheduler_info(self, wait_s: float = 5.0) -> dict:
        """The scheduler's info(): asked for now, or, when a long step keeps it from answering
        within `wait_s`, its last snapshot with `stale_s` (how old it is)."""
        snapshot, heard = self.sched_info, self.sched_heard
        try:
            return await self.control("get_info", timeout=wait_s if snapshot is not None else 30.0)
        except APIError:
            if snapshot is None or self.dead:
                raise
            return {**snapshot, "stale_s": round(time.monotonic() - heard, 3)}

    async def check_grammars(self, grammars: list[tuple[int, SamplingParams]], batch: bool) -> None:
        """Compile the grammars of a request's prompts (`grammars`: index, params) in the
        scheduler before any of it is sent, so that one bad grammar refuses the whole request
        with a 400 and nothing of it runs (the compiles are cached for the requests after).
        `batch`: the prompts have params of their own, and the 400 names each bad one by its
        index ("prompt 1 of the batch", param "sampling_params[1].regex"); else it is the
        grammar's own error, as a single request's."""
        errors = await self.grammar_errors(grammars)
        if not errors:
            return
        params = dict(grammars)
        first = min(errors)
        field = next(f for f in GRAMMAR_FIELDS if getattr(params[first], f) is not None)
        if not batch:
            raise APIError.bad_request(errors[first], field)
        if len(errors) == 1:
            message = f"prompt {first} of the batch: {errors[first]}"
        else:
            message = (f"prompts {', '.join(map(str, sorted(errors)))} of the batch have a grammar that does not "
                       f"compile; prompt {first}: {errors[first]}")
        raise APIError.bad_request(message, f"sampling_params[{first}].{field}")

    async def grammar_errors(self, grammars: list[tuple[int, SamplingParams]]) -> dict[int, str]:
        """Compile `grammars` (index, params) in the scheduler (cached for the requests after);
        the error of each that does not compile, by index."""
        if not grammars:
            return {}
        timeout = 30.0 + self.args.grammar_compile_timeout_s * len(grammars)
        res = await self.control("check_grammars", timeout, payload=list(grammars))
        if "error" in res:
            raise APIError(f"checking the grammars failed: {res['error']}", 500, "server_error", None, "internal_error")
        return res["errors"]

    async def control(self, kind: str, timeout: float = 30.0, payload: object = None) -> Any:
        """Run a control request in the scheduler and return its result."""
        if self.dead:
            raise APIError(f"a server process died: {self.dead}", 503, "server_error", None, "server_process_died")
        req_id = next(self.control_ids)
        fut = asyncio.get_running_loop().create_future()
        self.control_futs[req_id] = fut
        self._push.send_pyobj([ControlReq(kind, req_id, payload)])
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.CancelledError:  # the client left: a grammar check's compiles are stopped
            if kind == "check_grammars" and not self.dead:
                self._push.send_pyobj([ControlReq("cancel_check_grammars", 0, req_id)])
            raise
        except asyncio.TimeoutError as e:
            raise APIError(f"the scheduler did not answer {kind} within {timeout}s", 503, "server_error") from e
        except SchedulerDied as e:
            raise APIError(f"a server process died: {e}", 503, "server_error", None, "server_process_died") from e
        finally:
            self.control_futs.pop(req_id, None)

    def _observe(self, st: ReqState, out: Any, finished: bool) -> None:
        now = time.monotonic()
        if out.new_ids and not st.internal:
            if st.last_token is None:
                # when the scheduler made the first token, not when it arrived here: a request
                # that is not streamed gets all its output at the end
                first = out.first_token_at
                self.metrics.ttft.observe(max(0.0, (now if first is None else first) - st.created))
            else:
                gap = (now - st.last_token) / len(out.new_ids)
                for _ in out.new_ids:
                    self.metrics.itl.observe(gap)
            st.last_token = now


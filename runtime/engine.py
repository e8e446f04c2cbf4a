"""The offline Engine: the scheduler in-process, driven by one background thread.

    with Engine() as engine:                      # the embedded SmolLM2
        out = engine.generate("Hello", {"max_new_tokens": 16, "temperature": 0})
        print(out["text"])

`generate` takes one prompt or a batch (text or input_ids) with one sampling-params dict or a
list of them; `stream=True` yields chunks, each with the text and output_ids so far as SGLang's
Engine (only what is new with `incremental_streaming_output=True`); `async_generate` is the
asyncio form.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import operator
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Iterator, NamedTuple

from treadle.runtime.detokenizer import IncrementalDetokenizer
from treadle.runtime.engine_args import EngineArgs, translate_sglang_args
from treadle.runtime.io_struct import OutputAccum, ReqOutput, TokenizedGenerateReq, split_samples
from treadle.runtime.model_runner import ModelRunner
from treadle.runtime.request_checks import check_context, validate_request
from treadle.runtime.sampling_params import SamplingParams, quoted
from treadle.runtime.scheduler import GRAMMAR_POLL_S, GrammarCheck, Scheduler
from treadle.runtime.tokenizer import encode_prompt, load_tokenizer, token_texts

log = logging.getLogger("treadle")


class EngineDeadError(RuntimeError):
    pass


class BatchError(ValueError):
    """Some requests of a batch are invalid. `errors`: the index of each bad one -> what is
    wrong with it. Raised before anything of the batch is queued (a grammar that does not
    compile: `errors` indexes the prompts, `results` is None), or, for an error only found
    while running (a grammar that cannot go on), once every request has finished: `results`
    then holds the batch's results in order, the failed ones' with `meta_info["error"]`, and
    `errors` indexes that list."""

    def __init__(self, message: str, errors: dict[int, str], results: list[dict] | None = None) -> None:
        super().__init__(message)
        self.errors = errors
        self.results = results


def _batch_message(errors: dict[int, str], what: str) -> str:
    """"prompt 1 of the batch: <its error>" (the first of several, naming them all)."""
    first = min(errors)
    if len(errors) == 1:
        return f"{what} {first} of the batch: {errors[first]}"
    return f"{what}s {', '.join(map(str, sorted(errors)))} of the batch failed; {what} {first}: {errors[first]}"


class _TokenizerManagerView(NamedTuple):
    """What SGLang programs read of `engine.tokenizer_manager` (treadle tokenizes in the Engine)."""
    tokenizer: Any
    model_path: str | None


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        # SGLang's skip_tokenizer_init=True: the Engine takes input_ids only and gives output_ids
        # (its text is ""); the scheduler keeps the tokenizer (stop strings, grammars)
        skip_tokenizer_init = kwargs.pop("skip_tokenizer_init", False)
        if not isinstance(skip_tokenizer_init, bool):
            raise ValueError(f"Engine(skip_tokenizer_init={skip_tokenizer_init!r}): a bool, as SGLang's")
        # EngineArgs' names, and SGLang's server-argument names for them (random_seed, ...), as sgl.Runtime
        self.args = EngineArgs.from_kwargs(**translate_sglang_args({"model_path": model_path, **kwargs}, "Engine"))
        self._tp = None  # tp_worker.LeaderGroup when tp_size > 1: this thread's scheduler is rank 0
        if self.args.tp_size > 1:
            self._start_tensor_parallel()
        else:
            self.runner = ModelRunner(self.args)
            self.tokenizer = load_tokenizer(self.runner.source)
            self.scheduler = Scheduler(self.args, self.runner, self.tokenizer)
        self.skip_tokenizer_init = skip_tokenizer_init
        if skip_tokenizer_init:
            self.tokenizer = None
        self._inbox: queue.Queue = queue.Queue()
        self._outboxes: dict[str, queue.Queue] = {}
        # rid -> the boxes of requests under that rid whose callers stopped waiting (a stream
        # closed early, a cancelled async_generate) and whose last output has not come yet, in
        # the order they were sent: their outputs go there, not to a new request reusing the rid
        # (the scheduler ends them first, as their aborts were queued first). The rid is free
        # at once; the aborted request's "abort" was the new one's result.
        self._draining: dict[str, list[queue.Queue]] = {}
        self._lock = threading.Lock()
        # a caller's rid -> the group of requests it stands for (a batch's or n samples' parts,
        # their prompt's warm-up), so that abort(rid) reaches them all, even before they are sent
        self._groups: dict[str, _Group] = {}
        self._group_of: dict[str, _Group] = {}
        # "<rid>-<i>", the i-th prompt of a batch sent with n > 1 as `rid` -> that batch's group
        # (abort("<rid>-<i>") stops that prompt's samples, as the server's /abort_request)
        self._prompt_groups: dict[str, _Group] = {}
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._exit_lock = threading.Lock()  # orders the thread's exit against shutdown giving up on it
        self._exited = False
        self._left_running = False
        self._thread = threading.Thread(target=self._loop, name="treadle-engine", daemon=True)
        self._thread.start()
        # an engine never shut down is shut down at interpreter exit (a request still running
        # then would otherwise be torn down mid-step, aborting the process)
        self._at_exit = functools.partial(_shutdown_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    @property
    def tokenizer_manager(self) -> "_TokenizerManagerView":
        """SGLang's `engine.tokenizer_manager`, as far as programs read it: its `tokenizer` (the
        model's, None with skip_tokenizer_init) and `model_path`, as SGLang's docs use them
        (e.g. `llm.tokenizer_manager.tokenizer.apply_chat_template(...)`)."""
        return _TokenizerManagerView(self.tokenizer, self.args.model_path)

    def _start_tensor_parallel(self) -> None:
        """Spawn ranks 1..tp_size-1 (followers, see tp_worker.py) and become rank 0."""
        from treadle.runtime.tp_worker import LeaderGroup

        self._tp = tp = LeaderGroup(self.args)
        self.args = tp.args  # with the rendezvous address it picked
        try:
            self.runner = ModelRunner(tp.args, tp.group.ctx)
            self.tokenizer = load_tokenizer(self.runner.source)
            self.scheduler = tp.make_scheduler(self.runner, self.tokenizer)
        except BaseException as e:
            tp._fail_start(e)

    def _wait_inbox(self):
        """Block for the next inbox item. With TP, heartbeat the followers while idle."""
        if self._tp is None:
            return self._inbox.get()
        while True:
            try:
                return self._inbox.get(timeout=self._tp.heartbeat_s)
            except queue.Empty:
                self._tp.heartbeat()

    # ================================================================== public API

    def generate(self, prompt: str | list[str] | None = None, sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, *,
                 return_logprob: bool | list[bool] = False, logprob_start_len: int | list[int] | None = None,
                 top_logprobs_num: int | list[int] = 0, return_text_in_logprobs: bool = False,
                 stream: bool = False, rid: str | None = None, image_data: Any = None, audio_data: Any = None,
                 video_data: Any = None, token_ids_logprob: Any = None, lora_path: Any = None,
                 custom_logit_processor: Any = None, return_hidden_states: Any = False,
                 bootstrap_host: Any = None, bootstrap_port: Any = None, bootstrap_room: Any = None,
                 data_parallel_rank: Any = None) -> dict | list | Iterator[dict]:
        """Generate for one prompt (returns a dict; a list of n dicts when n > 1) or a batch
        (returns a list). Invalid input raises ValueError before anything is queued. Logprobs
        are `(logprob, token_id, text)` triples in meta_info, as SGLang's (io_struct.OutputAccum).

        A batch (or n samples) is checked whole before any of it is queued, grammars included (each is
        compiled, as the scheduler would, and the compile is cached for it): one bad request
        raises a `BatchError` (a ValueError) naming every bad prompt by its index and what is
        wrong, and nothing runs, so the caller loses nothing and can resend the rest. An error
        found only while running fails that request alone: the others finish, and a batch then
        raises a BatchError carrying every result (`results`); a batch's stream yields the
        others' chunks to the end, then raises it.

        return_logprob, logprob_start_len and top_logprobs_num take one value or a list of one
        per prompt, as SGLang's. SGLang's other keywords (image_data, lora_path,
        custom_logit_processor, return_hidden_states, token_ids_logprob, bootstrap_*,
        data_parallel_rank, ...) are taken at their defaults (None, False; a list of them, one
        per prompt); any other value is a ValueError naming the keyword (`_SGLANG_ONLY`)."""
        # a shut-down engine says so at the call (a stream's too), before a batch's grammar check
        # asks its closed compiler (a BatchError "GrammarCompiler is closed", as if the input's)
        self._check_running()
        _check_sglang_only(image_data=image_data, audio_data=audio_data, video_data=video_data,
                           token_ids_logprob=token_ids_logprob, lora_path=lora_path,
                           custom_logit_processor=custom_logit_processor, return_hidden_states=return_hidden_states,
                           bootstrap_host=bootstrap_host, bootstrap_port=bootstrap_port,
                           bootstrap_room=bootstrap_room, data_parallel_rank=data_parallel_rank)
        reqs, single, base, grammars, names = self._build_all(prompt, input_ids, sampling_params, return_logprob,
                                                          logprob_start_len, top_logprobs_num, stream, rid,
                                                          return_text_in_logprobs)
        if len(reqs) > 1:  # one request alone is never half-run: its grammar compiles in the scheduler
            self._check_grammars(grammars, single)
        if stream:
            with self._lock:  # now, as unstreamed (checked again when it starts)
                self._check_free(base, reqs, names)
            return self._stream(reqs, base, indexed=not single or len(reqs) > 1, names=names)
        with self._grouped(base, reqs, names) as group:
            sent: set[str] = set()
            try:
                results = self._run(reqs, sent)
            except BaseException:  # e.g. KeyboardInterrupt: stop them and free their ids
                self._abandon([r for r in reqs if r.rid in sent], group)  # not another caller's
                raise
        return self._shape(results, reqs, single)

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: dict | list[dict] | None = None,
                             input_ids: list[int] | list[list[int]] | None = None, *,
                             return_logprob: bool | list[bool] = False,
                             logprob_start_len: int | list[int] | None = None, top_logprobs_num: int | list[int] = 0,
                             return_text_in_logprobs: bool = False, stream: bool = False,
                             rid: str | None = None, image_data: Any = None, audio_data: Any = None,
                             video_data: Any = None, token_ids_logprob: Any = None, lora_path: Any = None,
                             custom_logit_processor: Any = None, return_hidden_states: Any = False,
                             bootstrap_host: Any = None, bootstrap_port: Any = None, bootstrap_room: Any = None,
                             data_parallel_rank: Any = None):
        """asyncio form of `generate` (its keywords); with stream=True an async iterator of
        chunks. Cancelling the awaiting task aborts its requests (their KV is freed at once)."""
        self._check_running()  # as generate's
        _check_sglang_only(image_data=image_data, audio_data=audio_data, video_data=video_data,
                           token_ids_logprob=token_ids_logprob, lora_path=lora_path,
                           custom_logit_processor=custom_logit_processor, return_hidden_states=return_hidden_states,
                           bootstrap_host=bootstrap_host, bootstrap_port=bootstrap_port,
                           bootstrap_room=bootstrap_room, data_parallel_rank=data_parallel_rank)
        if stream:  # checked now (a ValueError at the call, as unstreamed); run as iterated
            return self._astream(await asyncio.to_thread(
                self.generate, prompt, sampling_params, input_ids, return_logprob=return_logprob,
                logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
                return_text_in_logprobs=return_text_in_logprobs, stream=True, rid=rid))
        reqs, single, base, grammars, names = self._build_all(prompt, input_ids, sampling_params, return_logprob,
                                                          logprob_start_len, top_logprobs_num, stream, rid,
                                                          return_text_in_logprobs)
        if grammars and len(reqs) > 1:  # as generate's; compiles: off the event loop
            await asyncio.to_thread(self._check_grammars, grammars, single)
        t0 = time.monotonic()
        with self._grouped(base, reqs, names) as group:
            sent: set[str] = set()
            try:
                await asyncio.to_thread(self._warm_prefix, reqs)
                # submitted here, between awaits: a cancel can only come after, so its aborts
                # queue behind the requests they abort
                boxes = self._submit_all(reqs, sent)
                results = await asyncio.to_thread(self._gather, reqs, boxes, t0)
            except asyncio.CancelledError:
                # the threads then collect their abort and return (a warm-up still running
                # included: the parts are then never sent); the rids are free at once
                self._abandon([r for r in reqs if r.rid in sent], group)
                raise
            except BaseException:  # a request id in use: stop what was sent (not another caller's)
                self._abandon([r for r in reqs if r.rid in sent], group)
                raise
        return self._shape(results, reqs, single)

    async def _astream(self, it: Iterator[dict]):
        sentinel = object()
        while True:
            chunk = await asyncio.to_thread(next, it, sentinel)
            if chunk is sentinel:
                return
            yield chunk

    def abort(self, rid: str) -> None:
        """Stop request `rid`: one request by its id, a batch or n samples by the rid given
        for them (the parts are "<rid>-<i>" for the prompts of a batch, "<rid>-<j>" for the
        samples of one prompt, as the server names them; "<rid>-<i>" also stops the samples
        "<rid>-<i>-<j>" of the i-th prompt of a batch sent with n > 1), parts not yet sent and
        their prompt's warm-up included. Aborted requests finish with finish_reason "abort"
        and free their KV at once."""
        if not isinstance(rid, str):  # (a list was a TypeError from the dict lookup)
            raise ValueError(f"rid must be a string (the id a request was sent with), got {type(rid).__name__}")
        with self._lock:
            group = self._groups.get(rid)
            of_prompt = self._prompt_groups.get(rid)
        if group is not None:
            self._abort_group(group)
            return
        if of_prompt is not None:
            self._abort_prompt(of_prompt, rid)
        self._inbox.put(("abort", rid))

    def _abort_reqs(self, reqs: list[TokenizedGenerateReq], group: "_Group | None") -> None:
        """Abort one call's requests: through their group when they have one."""
        if group is not None:
            self._abort_group(group)
        else:
            for r in reqs:
                self.abort(r.rid)

    def _abandon(self, reqs: list[TokenizedGenerateReq], group: "_Group | None") -> None:
        """The caller stopped waiting (an exception in its thread, a stream closed, a task
        cancelled): abort what may still run and free the rids now, their boxes kept aside for
        the outputs still to come (`_draining`), which are then discarded (or collected by a
        thread still waiting on them)."""
        self._abort_reqs(reqs, group)
        with self._lock:
            for r in reqs:
                box = self._outboxes.pop(r.rid, None)
                if box is not None:  # its last output has not been dispatched yet
                    self._draining.setdefault(r.rid, []).append(box)

    def _abort_group(self, group: "_Group") -> None:
        with self._lock:  # ordered against _submit: a part is either sent before the aborts or never
            group.aborted = True
            for r in group.rids:
                self._inbox.put(("abort", r))

    def _abort_prompt(self, group: "_Group", alias: str) -> None:
        """Abort the samples of one prompt of a batch (sent and not yet sent, its warm-up too)."""
        with self._lock:  # ordered against _submit, as _abort_group
            group.stopped.add(alias)
            for r, a in group.prompt_of.items():
                if a == alias:
                    self._inbox.put(("abort", r))

    def _check_free(self, base: str, reqs: list[TokenizedGenerateReq], names: dict[str, str] | None = None) -> None:
        """ValueError when the call's rid or a part's is another running call's (its parts
        too: another caller's "<rid>-0" is not to be taken over; `names`: a part's rid -> the
        rid its caller gave its prompt, see _build_all). Call with the lock held."""
        taken = [x for x in dict.fromkeys((base, *(r.rid for r in reqs), *(names or {}).values()))
                 if x in self._groups or x in self._outboxes or x in self._group_of or x in self._prompt_groups]
        if taken:
            raise ValueError(f"request id {taken[0]!r} is already in use")

    @contextlib.contextmanager
    def _grouped(self, base: str, reqs: list[TokenizedGenerateReq], names: dict[str, str] | None = None):
        """Register `reqs` under the caller's rid `base` while they run (not needed for one
        request under its own rid); `names`: a part's rid -> the rid its caller gave its
        prompt (a list of rids, see _build_all), by which it is aborted. Yields the group, or None."""
        if len(reqs) == 1 and reqs[0].rid == base:
            yield None
            return
        group = _Group([r.rid for r in reqs])
        if names:
            group.prompt_of.update(names)
        else:
            for r in reqs:  # a batch with n > 1: the parts are "<base>-<i>-<j>", of prompt "<base>-<i>"
                head = r.rid.rsplit("-", 1)[0]
                if head != base and head.startswith(base + "-"):
                    group.prompt_of[r.rid] = head
        aliases = set(group.prompt_of.values())
        with self._lock:
            self._check_free(base, reqs, names)
            self._groups[base] = group
            for r in reqs:
                self._group_of[r.rid] = group
            for a in aliases:
                self._prompt_groups.setdefault(a, group)
        try:
            yield group
        finally:
            with self._lock:
                del self._groups[base]
                for r in reqs:
                    self._group_of.pop(r.rid, None)
                for a in aliases:
                    if self._prompt_groups.get(a) is group:
                        del self._prompt_groups[a]

    def flush_cache(self) -> bool:
        """Drop the radix cache (only when idle). Returns whether it was flushed."""
        return self._call(lambda s: s.flush_cache())

    def get_server_info(self) -> dict:
        """Cache statistics (hit rate, evictions, free slots) and the engine arguments, under
        "engine_args" and, as SGLang's Engine.get_server_info has them, at the top level (the
        statistics win where a name is both), with SGLang's `model_path` (the model loaded),
        `version`, `max_total_num_tokens` (the KV pool, in tokens) and `max_req_input_len`."""
        info = self._call(lambda s: s.info())
        args = {k: v for k, v in vars(self.args).items()}
        sglang = {**{k: v for k, v in args.items() if k != "api_key"}, "version": _version(),
                  "model_path": getattr(getattr(self.runner, "source", None), "path", None) or args.get("model_path"),
                  "max_total_num_tokens": info["total_slots"],
                  "max_req_input_len": min(info["context_length"], info["total_slots"]) - 1}
        return {**sglang, **info, "engine_args": args, "model_load_s": round(self.runner.load_s, 3),
                "quantization": self.runner.quantization.describe() if self.runner.quantization else None}

    def check_integrity(self) -> None:
        """Raise AssertionError if any KV slot is leaked or double-owned."""
        self._call(lambda s: s.check_integrity())

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the engine thread, then release what it used. A thread still in a step after
        `timeout_s` keeps its CUDA graphs, tensor-parallel sockets and process group, since
        closing them under it is undefined: its followers are killed now (a collective it waits
        in then fails) and the thread releases the rest itself when it returns."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        atexit.unregister(self._at_exit)
        self._inbox.put(("stop", None))
        self._thread.join(timeout=timeout_s)
        if self.scheduler._grammar_compiler is not None:
            self.scheduler._grammar_compiler.close()
        with self._exit_lock:
            if not self._exited:
                self._left_running = True
                log.error("the engine thread is still running %gs after shutdown; it releases its "
                          "resources when its step returns", timeout_s)
                if self._tp is not None:
                    self._tp.followers.kill()
                return
        self._release()

    def _release(self) -> None:
        """Free what the engine thread used; called once it has returned."""
        self.runner.release_graphs()  # now, not when a later engine in this process captures
        if self._tp is not None:  # the loop has returned: this thread may broadcast now
            self._tp.close(healthy=self._error is None and not self._left_running)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ================================================================== request building

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("Engine(skip_tokenizer_init=True) takes input_ids, not text" if self.skip_tokenizer_init
                             else "this model has no tokenizer: pass input_ids instead of text")
        if not isinstance(text, str):
            raise ValueError(f"encode takes a string, got {type(text).__name__}")
        return encode_prompt(self.tokenizer, text)

    def _encode_prompt(self, text: Any) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"prompt must be a string (or a list of strings), got {type(text).__name__}")
        return self.encode(text)

    def _build(self, *args: Any, **kwargs: Any) -> tuple[list[TokenizedGenerateReq], bool, str]:
        """The call's requests (n samples split), whether it was one prompt, and its rid."""
        return self._build_all(*args, **kwargs)[:3]

    def _build_all(self, prompt, input_ids, sampling_params, return_logprob, logprob_start_len, top_logprobs_num,
                   stream, rid, return_text_in_logprobs=False
                   ) -> tuple[list[TokenizedGenerateReq], bool, str, list[tuple[int, SamplingParams]],
                              dict[str, str] | None]:
        """_build's, the prompts with a grammar (index, params) for _check_grammars, and for a
        list of rids (SGLang's: one per prompt) each part's rid -> its prompt's rid (else None).

        One rid names the call: a batch's prompts are "<rid>-<i>", the n samples of a prompt
        "<prompt's rid>-<j>". A list names each prompt (as SGLang's Engine and /generate take
        it; "" for a fresh name), and the call gets a private name."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt (text) or input_ids")
        rid_list = list(rid) if isinstance(rid, (list, tuple)) else None
        if rid_list is not None and not all(isinstance(x, str) for x in rid_list):
            raise ValueError("rid must be a string, or a list of strings (one per prompt)")
        if rid is not None and rid_list is None and not isinstance(rid, str):  # the parts are named "<rid>-<i>"
            raise ValueError(f"rid must be a string (one for the whole call) or a list of strings (one per prompt), "
                             f"got {type(rid).__name__}")
        # a batch's prompt (or its sampling params) that is wrong is named by its index, each
        # one wrong (a BatchError, before anything is queued); one prompt's error is raised as is
        errors: dict[int, str] = {}

        def each(i: int, fn: Any, *args: Any) -> Any:
            if i in errors:
                return None
            try:
                return fn(*args)
            except ValueError as e:
                if single:
                    raise
                errors[i] = str(e)
                return None

        if prompt is not None:
            single = isinstance(prompt, str)
            if not single and not isinstance(prompt, (list, tuple)):
                raise ValueError(f"prompt must be a string or a list of strings, got {type(prompt).__name__}")
            prompts = [prompt] if single else list(prompt)
            if self.tokenizer is None:
                self.encode("")  # the call's error (no text is taken), not each prompt's
            ids_list = [each(i, self._encode_prompt, p) for i, p in enumerate(prompts)]
        else:
            if isinstance(input_ids, Mapping) and "input_ids" in input_ids:
                # a tokenizer's BatchEncoding: transformers 5's apply_chat_template(tokenize=True)
                # returns one, which SGLang's function-calling doc passes on as input_ids
                input_ids = input_ids["input_ids"]
            if not isinstance(input_ids, (list, tuple)):
                hint = " (an array's or tensor's: .tolist())" if hasattr(input_ids, "ndim") else ""
                raise ValueError(f"input_ids must be a list of token ids or a list of such lists{hint}")
            single = not input_ids or not isinstance(input_ids[0], (list, tuple))
            ids_list = [_token_ids(input_ids)] if single else [each(i, _token_ids, x) for i, x in enumerate(input_ids)]
        if not ids_list:
            raise ValueError("the batch is empty")
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(ids_list):
                raise ValueError(f"{len(sampling_params)} sampling_params for {len(ids_list)} prompts")
            given = list(sampling_params)
        else:
            given = [sampling_params] * len(ids_list)

        def params(p: Any) -> SamplingParams:
            if p is not None and not isinstance(p, (dict, SamplingParams)):
                raise ValueError(f"sampling_params must be a dict (or a SamplingParams, or a list of one per "
                                 f"prompt), got {type(p).__name__}")
            sp = SamplingParams.from_dict(p.to_dict() if isinstance(p, SamplingParams) else dict(p or {}))
            # json_schema_lenient: the keywords dropped are in meta_info
            sp.apply_leniency(self.args.json_schema_lenient, mode=self.args.json_schema_mode,
                              whitespace_pattern=self.args.json_whitespace_pattern,
                              max_recursion_depth=self.args.grammar_max_recursion_depth)
            return sp

        plist = [each(i, params, p) for i, p in enumerate(given)]
        given = [p.to_dict() if isinstance(p, SamplingParams) else p for p in given]
        count = len(ids_list)
        # numpy scalars (np.int64 from an array's index or len, np.bool_ from a comparison) as
        # Python's, as max_new_tokens takes them; any other type is validate_request's to refuse
        return_logprob = [_py_scalar(x) for x in _per_prompt("return_logprob", return_logprob, count)]
        starts = [-1 if x is None else _py_scalar(x)  # its type: validate_request
                  for x in _per_prompt("logprob_start_len", logprob_start_len, count)]
        top_nums = [0 if x is None else _py_scalar(x)
                    for x in _per_prompt("top_logprobs_num", top_logprobs_num, count)]
        return_text_in_logprobs = _py_scalar(return_text_in_logprobs)  # np.True_ as return_logprob's
        if return_text_in_logprobs is True and self.tokenizer is None:
            raise ValueError("this model has no tokenizer to give token texts (return_text_in_logprobs)")
        reqs: list[TokenizedGenerateReq] = []
        base = (None if rid_list is not None else rid) or uuid.uuid4().hex
        names: dict[str, str] | None = None
        if rid_list is not None:
            if len(rid_list) != len(ids_list):
                raise ValueError(f"rid: a list of {len(rid_list)} rids for {len(ids_list)} "
                                 f"prompt{'s' if len(ids_list) > 1 else ''} (give one rid, or one per prompt)")
            rid_list = [x or f"{base}-{i}" for i, x in enumerate(rid_list)]
            twice = next((x for i, x in enumerate(rid_list) if x in rid_list[:i]), None)
            if twice is not None:
                raise ValueError(f"rid: {twice!r} is given to two prompts (each needs its own)")
            names = {}

        def build(i: int, ids: list[int], p: SamplingParams) -> None:
            own = rid_list[i] if rid_list is not None else f"{base}-{i}" if len(ids_list) > 1 else base
            r = TokenizedGenerateReq(rid=own,
                                     input_ids=ids, sampling_params=p, return_logprob=return_logprob[i],
                                     logprob_start_len=starts[i], top_logprobs_num=top_nums[i],
                                     stream=stream,
                                     return_text_in_logprobs=return_text_in_logprobs)
            # a numpy max_new_tokens as the int it was read as: one past the context was cut
            # there silently, where the same int was a ValueError
            set_new = given[i] is not None and given[i].get("max_new_tokens") is not None
            check_context(len(ids), {"max_new_tokens": p.max_new_tokens} if set_new else None,
                          self.runner.context_len)
            validate_request(r, self.runner.config.vocab_size, self.runner.context_len, self.runner.allocator.num_slots)
            parts = split_samples(r)  # the prompt is warmed once first (_warm_prefix)
            if names is not None:
                names.update((part.rid, own) for part in parts)
            reqs.extend(parts)

        for i, (ids, p) in enumerate(zip(ids_list, plist)):
            each(i, build, i, ids, p)
        if errors:
            raise BatchError(_batch_message(errors, "prompt"), errors)
        if names is not None:  # ["a", "a-0"] with n = 2: "a-0" would be a sample of "a" and a prompt
            clash = next((r.rid for i, r in enumerate(reqs) if r.rid in names.values() and names[r.rid] != r.rid
                          or any(q.rid == r.rid for q in reqs[:i])), None)
            if clash is not None:
                raise ValueError(f"rid: {clash!r} names two requests of the call (a prompt's n samples are "
                                 f"\"<its rid>-<j>\"); give other rids")
        return reqs, single, base, [(i, p) for i, p in enumerate(plist) if p.has_grammar], names

    def _check_grammars(self, grammars: list[tuple[int, SamplingParams]], single: bool) -> None:
        """Compile the grammars of a call's prompts (`grammars`: index, params) before any of
        it is queued, with the scheduler's compiler (thread-safe; the scheduler's own compile
        of them then finds them cached). One prompt's bad grammar raises a ValueError with the
        message the scheduler would give; a batch's, a BatchError naming each bad prompt."""
        if not grammars:
            return
        compiler = self.scheduler._grammar_compiler
        if compiler is None:  # made on the engine thread, which owns the scheduler
            compiler = self._call(lambda s: s.grammar_compiler)
        errors = GrammarCheck(compiler, grammars).wait()
        if not errors:
            return
        # the engine shut down under the check (its compiler closed, failing the compiles):
        # the engine's error, not the input's (it was a BatchError "GrammarCompiler was closed")
        self._check_running()
        if single:
            raise ValueError(next(iter(errors.values())))
        raise BatchError(_batch_message(errors, "prompt"), errors)

    def _shape(self, results: list[dict], reqs: list[TokenizedGenerateReq], single: bool):
        if single:
            return results[0] if len(results) == 1 else results
        return results

    # ================================================================== running

    def _check_running(self) -> None:
        if self._error is not None:
            raise EngineDeadError(f"the engine loop died: {self._error!r}") from self._error
        if self._stopped.is_set():
            raise EngineDeadError("the engine is shut down")

    def _submit(self, r: TokenizedGenerateReq, group: "_Group | None" = None,
                box: queue.Queue | None = None, prompt: str | None = None) -> queue.Queue:
        """Send `r` to the engine thread and return the box its outputs arrive in (`box`: one
        several requests share; their outputs carry their rids). A request of an aborted
        group (or the warm-up of one, `group`), or of an aborted prompt of a batch (its warm-up:
        `prompt`), is not sent: it finishes as aborted at once."""
        self._check_running()
        box = queue.Queue() if box is None else box
        with self._lock:
            if r.rid in self._outboxes:
                raise ValueError(f"request id {r.rid!r} is already in use")
            group = group or self._group_of.get(r.rid)
            if group is not None:
                prompt = prompt or group.prompt_of.get(r.rid)
            if group is not None and (group.aborted or (prompt is not None and prompt in group.stopped)):
                box.put(ReqOutput(r.rid, [], {"type": "abort", "message": "aborted"}, len(r.input_ids), 0, 0))
                return box
            if group is not None and r.rid not in group.rids:
                group.rids.append(r.rid)  # a warm-up: aborted with its group
                if prompt is not None:
                    group.prompt_of[r.rid] = prompt  # and with its prompt
            self._outboxes[r.rid] = box
            self._inbox.put(("add", r))
        return box

    def _warm_prefix(self, reqs: list[TokenizedGenerateReq]) -> None:
        """Before n > 1 samples of one prompt, cache the prompt once."""
        groups = {}
        for r in reqs:
            groups.setdefault(tuple(r.input_ids), []).append(r)
        for ids, same in groups.items():
            if len(same) > 1 and not self.args.disable_radix_cache:
                warm = TokenizedGenerateReq(uuid.uuid4().hex, list(ids), SamplingParams(max_new_tokens=0))
                group = self._group_of.get(same[0].rid)
                # the warm-up of one prompt of a batch (not of two equal prompts) stops with it
                prompts = {group.prompt_of.get(r.rid) for r in same} if group is not None else {None}
                self._collect(warm, self._submit(warm, group, prompt=prompts.pop() if len(prompts) == 1 else None))

    def _run(self, reqs: list[TokenizedGenerateReq], sent: set[str]) -> list[dict]:
        t0 = time.monotonic()
        self._warm_prefix(reqs)
        return self._gather(reqs, self._submit_all(reqs, sent), t0)

    def _submit_all(self, reqs: list[TokenizedGenerateReq], sent: set[str],
                    box: queue.Queue | None = None) -> list[queue.Queue]:
        """Submit `reqs` in order, adding each rid to `sent` once it is this call's (a rid in
        use raises ValueError, and what was sent before it is the caller's to abort)."""
        boxes = []
        for r in reqs:
            boxes.append(self._submit(r, box=box))
            sent.add(r.rid)
        return boxes

    def _gather(self, reqs: list[TokenizedGenerateReq], boxes: list[queue.Queue], t0: float) -> list[dict]:
        """Wait for every submitted request; a failed one raises once all have finished (see
        generate), with every result in the exception's `results`."""
        results = [self._collect(r, b, t0) for r, b in zip(reqs, boxes)]
        errors = {i: res["meta_info"]["finish_reason"].get("message") for i, res in enumerate(results)
                  if res["meta_info"].get("error")}
        if errors:
            # a failed batch step is the engine's error (RuntimeError); the rest, the input's
            internal = any(res["meta_info"].get("internal_error") for res in results)
            message = next(iter(errors.values())) if len(results) == 1 else _batch_message(errors, "result")
            e = RuntimeError(message) if internal else BatchError(message, errors, results)
            e.results = results
            raise e
        return results

    def _next(self, box: queue.Queue) -> ReqOutput:
        while True:
            try:
                item = box.get(timeout=1.0)
            except queue.Empty:  # a box the loop's exit missed (it raced with the exit)
                if self._error is not None or self._exited:
                    self._check_running()
                continue
            if isinstance(item, _Shutdown):
                raise EngineDeadError("the engine was shut down before this request finished")
            if isinstance(item, BaseException):
                raise EngineDeadError(f"the engine loop died: {item!r}") from item
            return item

    def _collect(self, r: TokenizedGenerateReq, box: queue.Queue, t0: float | None = None) -> dict:
        """Wait for `r`'s outputs and make its result; `t0`: when the call began (e2e_latency)."""
        detok = self._detokenizer(r)
        acc = OutputAccum(r, functools.partial(token_texts, self.tokenizer))
        acc.created = acc.created if t0 is None else t0
        while True:
            out = self._next(box)
            acc.add(out)
            detok.add(out.new_ids, out.finished)
            if out.finished is not None:
                self._done(r.rid, box)
                return acc.result(r.rid, detok.output_text)

    def _stream(self, reqs: list[TokenizedGenerateReq], base: str, indexed: bool,
                names: dict[str, str] | None = None) -> Iterator[dict]:
        """Chunks of `reqs` as their outputs arrive, in one shared box. As SGLang's Engine (and
        treadle's /generate stream), each chunk's text and output_ids are the output so far,
        or only what is new with the engine argument incremental_streaming_output; meta_info
        is cumulative; with `indexed` (a batch, n samples) each carries the index of its
        result in the unstreamed list."""
        incremental = self.args.incremental_streaming_output
        with self._grouped(base, reqs, names) as group:
            box: queue.Queue = queue.Queue()
            where = {r.rid: i for i, r in enumerate(reqs)}
            left, sent = set(where), set()
            failed: dict[int, str] = {}
            internal = False
            try:
                self._warm_prefix(reqs)
                state = {r.rid: (self._detokenizer(r), OutputAccum(r, functools.partial(token_texts, self.tokenizer)))
                         for r in reqs}
                self._submit_all(reqs, sent, box)
                while left:
                    out = self._next(box)
                    detok, acc = state[out.rid]
                    acc.add(out)
                    delta = detok.add(out.new_ids, out.finished)
                    if out.error and not indexed:
                        raise (RuntimeError if out.internal else ValueError)(out.error)
                    if out.error:  # this one alone: the others stream to their end, then it is raised
                        failed[where[out.rid]] = out.error
                        internal |= out.internal
                        left.discard(out.rid)
                        self._done(out.rid, box)
                        continue
                    # new ids without new text too (a piece of a character, a tail held back as
                    # a possible stop string): the chunks' output_ids add up to the output's
                    if delta or out.new_ids or out.finished is not None:
                        chunk = acc.result(out.rid, delta if incremental else detok.output_text)
                        if incremental:
                            chunk["output_ids"] = out.new_ids
                        if indexed:
                            chunk["index"] = where[out.rid]
                        yield chunk
                    if out.finished is not None:
                        left.discard(out.rid)
                        self._done(out.rid, box)
                if failed:
                    message = _batch_message(failed, "result")
                    raise RuntimeError(message) if internal else BatchError(message, failed)
            finally:
                if left:  # the consumer stopped early (or one failed): abort the rest of what was sent
                    self._abandon([r for r in reqs if r.rid in left and r.rid in sent], group)

    def _detokenizer(self, r: TokenizedGenerateReq) -> IncrementalDetokenizer:
        if self.tokenizer is None:
            return _NoText()
        return IncrementalDetokenizer.for_params(self.tokenizer, r.sampling_params)

    def _done(self, rid: str, box: queue.Queue) -> None:
        """`rid`'s caller, waiting on `box`, has its last output (the dispatch freed the rid
        then; an error output may come first): free it, unless it is another request's now."""
        with self._lock:
            if self._outboxes.get(rid) is box:
                del self._outboxes[rid]

    def _call(self, fn):
        """Run fn(scheduler) on the engine thread and return its result."""
        self._check_running()
        box: queue.Queue = queue.Queue()
        self._inbox.put(("call", (fn, box)))
        res = self._next(box)
        if isinstance(res, tuple) and res and res[0] == "error":
            raise res[1]
        return res[1]

    def _loop(self) -> None:
        sched = self.scheduler
        try:
            while True:
                try:  # block only when there is nothing to run (only grammars compiling: briefly)
                    if sched.has_runnable_work():
                        item = self._inbox.get_nowait()
                    elif sched.has_work():
                        item = self._inbox.get(timeout=GRAMMAR_POLL_S)
                    else:
                        item = self._wait_inbox()
                except queue.Empty:
                    item = None
                while item is not None:
                    kind, payload = item
                    if kind == "stop":
                        return
                    if kind == "add":
                        sched.add_request(payload)
                    elif kind == "abort":
                        sched.abort(payload)
                    elif kind == "call":
                        fn, box = payload
                        try:
                            box.put(("ok", fn(sched)))
                        except Exception as e:  # returned to the caller, who raises it
                            box.put(("error", e))
                    try:
                        item = self._inbox.get_nowait()
                    except queue.Empty:
                        item = None
                if sched.has_work():
                    self._dispatch(sched.step())
                else:
                    self._dispatch(sched.outputs)
                    sched.outputs = []
        except BaseException as e:
            log.exception("engine loop died")
            self._error = e
        finally:
            # every caller still waiting hears why, never hangs: the loop's error, or the shutdown
            with self._lock:
                for box in [*self._outboxes.values(), *(b for boxes in self._draining.values() for b in boxes)]:
                    box.put(self._error if self._error is not None else _Shutdown())
            with self._exit_lock:
                self._exited = True
                abandoned = self._left_running
            if abandoned:
                self._release()

    def _dispatch(self, outs: list[ReqOutput]) -> None:
        for out in outs:
            with self._lock:
                draining = self._draining.get(out.rid)
                if draining:  # an abandoned request's: all its outputs come before a new one's
                    box = draining[0]
                    if out.finished is not None:
                        draining.pop(0)
                        if not draining:
                            del self._draining[out.rid]
                else:
                    box = self._outboxes.get(out.rid)
                    if box is not None and out.finished is not None:
                        del self._outboxes[out.rid]  # its last: the rid is free once dispatched
            if box is not None:
                box.put(out)


def _per_prompt(name: str, value: Any, count: int) -> list:
    """One value of a generate keyword per prompt: a list (SGLang's per-prompt form) must have one
    for each of the `count` prompts; anything else is every prompt's (validate_request checks it)."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name}: a list of {len(value)} values for {count} prompt{'s' if count > 1 else ''} "
                             "(give one value, or one per prompt)")
        return list(value)
    return [value] * count


# SGLang's Engine.generate keywords for what treadle does not do: why, for the error naming them.
# Each is taken at SGLang's default (None; False for return_hidden_states; rank 0, the only one,
# for data_parallel_rank), and as a list of such values, one per prompt
_SGLANG_ONLY: dict[str, str] = {
    "image_data": "treadle serves text-only models",
    "audio_data": "treadle serves text-only models",
    "video_data": "treadle serves text-only models",
    "token_ids_logprob": "treadle returns the sampled and top-k tokens' logprobs only (top_logprobs_num)",
    "lora_path": "treadle serves no LoRA adapters",
    "custom_logit_processor": "treadle runs no custom logit processor",
    "return_hidden_states": "treadle returns no hidden states",
    "bootstrap_host": "treadle has no prefill/decode disaggregation",
    "bootstrap_port": "treadle has no prefill/decode disaggregation",
    "bootstrap_room": "treadle has no prefill/decode disaggregation",
    "data_parallel_rank": "an Engine is one replica (rank 0)",
}


def _unset(name: str, value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_unset(name, v) for v in value)
    if name == "data_parallel_rank" and value == 0 and not isinstance(value, bool):
        return True
    return value is None or value is False


def _check_sglang_only(**kwargs: Any) -> None:
    """ValueError naming each of SGLang's keywords given at a value treadle cannot honour."""
    bad = [name for name, value in kwargs.items() if not _unset(name, value)]
    if bad:
        raise ValueError("; ".join(f"{name}={quoted(kwargs[name], 60)} is not supported: {_SGLANG_ONLY[name]}"
                                   for name in bad) + " (SGLang's default, None or False, is taken)")


def _shutdown_at_exit(ref: "weakref.ref[Engine]") -> None:
    engine = ref()
    if engine is not None:
        engine.shutdown()


def _py_scalar(x: Any) -> Any:
    """A numpy integer or boolean scalar as a Python int or bool; anything else as it is."""
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    if isinstance(x, (bool, int)) or getattr(x, "ndim", None) != 0 or kind not in ("b", "i", "u"):
        return x
    return bool(x) if kind == "b" else operator.index(x)


def _token_ids(x: Any) -> list[int]:
    """A prompt's token ids as Python ints (numpy / torch integer scalars accepted); anything
    else, booleans and floats included, is a ValueError."""
    if not isinstance(x, (list, tuple)):
        raise ValueError(f"input_ids must be a list of token ids (or a list of such lists), got {type(x).__name__}")
    ids = []
    for t in x:
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))
        except TypeError:
            # (an array or tensor of several ids has __index__ too, and raises it here)
            hint = " (pass an array's or tensor's ids as a list: .tolist())" if getattr(t, "ndim", 0) else ""
            raise ValueError(f"input_ids must be integers; got {quoted(t, 60)}{hint}") from None
    return ids


class _Group:
    """The requests one caller's rid stands for; `aborted` once abort(rid) was called."""

    def __init__(self, rids: list[str]) -> None:
        self.rids = rids
        self.aborted = False
        self.prompt_of: dict[str, str] = {}  # a batch with n > 1: part (or warm-up) rid -> "<rid>-<i>"
        self.stopped: set[str] = set()  # the prompts "<rid>-<i>" aborted by that name


class _Shutdown(Exception):
    """Put in the box of a request still running when the engine stops."""


class _NoText:
    def add(self, ids: list[int], finished: dict | None = None) -> str:
        return ""

    output_text = ""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("treadle")
    except PackageNotFoundError:  # run from a checkout without installing
        return "unknown"

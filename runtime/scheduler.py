"""The scheduler: continuous batching over the paged KV pool with a radix prefix cache.

One `step()` = one batch plan, a map from request to the number of new tokens it computes:
a prefill chunk, one decode token, or the forced tokens of a jump-forward. Prefill has
priority; otherwise every running request decodes.

The scheduler does no I/O: callers feed it with `add_request` / `abort` and collect the
`ReqOutput`s that `step()` returns. The in-process Engine drives it from a thread; the server
drives it from its own process over ZMQ (`scheduler_process.py`). Same class, swapped I/O.
"""
from __future__ import annotations

import logging
import random
import time
from collections import deque
from typing import Any

import torch

from treadle.radix_cache import RadixCache
from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.forward_batch import ForwardBatch, ForwardMode
from treadle.runtime.io_struct import ReqOutput, TokenizedGenerateReq
from treadle.runtime.ngram_draft import NgramIndex
from treadle.runtime.model_runner import ModelRunner
from treadle.runtime.request import Req
from treadle.runtime.sampler import Sampler, prompt_logprobs
from treadle.runtime.request_checks import validate_request
from treadle.runtime.schedule_policy import PrefillBudget, match_key, order_waiting, starved

log = logging.getLogger("treadle")

# Reserved decode budget: a running request is expected to still need
# min(remaining, RESERVE_CLIP) * new_token_ratio slots. The ratio starts optimistic, decays as
# decoding goes well and jumps back up after a retraction. A request retracted
# WHOLE_RESERVE_AFTER times reserves all it may still write (ratio 1): see _reserve_ratio.
RESERVE_CLIP = 4096
WHOLE_RESERVE_AFTER = 4
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001
GRAMMAR_POLL_S = 0.005  # how often a loop whose only work is compiling grammars looks at them
JUMP_LOOKBACK = 3  # output tokens re-encoded at a jump-forward boundary
# requests looked at behind a request the KV budget cannot hold, for one that fits whole
BYPASS_SCAN = 64
IN_BATCH_PREFIX_MIN = 32  # shared uncached tokens that make a request wait for another's prefill
# failed steps in a row that no request explains (a lone request's step failed and so did a
# one-token canary forward after it, or no request was in the step) after which the error is
# raised (see _recover): the server is broken, not a request
MAX_FAILED_STEPS = 3
# the failed steps a request must make fail alone, each followed by a canary forward that passes,
# before the failure is its own: a fault that does not recur is not the request's
STRIKES_TO_FAIL = 2
# the most prompt positions one step scores for a request's prompt logprobs: each is a row of
# logits over the vocabulary (log-softmaxed, top-k'd), so a 4,000-token prompt with `echo`
# held one CPU step for tens of seconds and stalled every other request. A prompt wanting
# logprobs is prefilled in chunks of this many scored positions, and between its chunks the
# other requests get a step (the returned values are the same: each chunk attends to the
# prefix's KV as a whole prefill would)
PROMPT_LOGPROB_CHUNK = 256


def scored_chunk_cap(req: Req, start: int) -> int:
    """The most tokens ``req``'s next prefill chunk, from position ``start``, may compute so
    that it scores at most PROMPT_LOGPROB_CHUNK prompt positions (unbounded for a request
    without prompt logprobs)."""
    if not req.wants_prompt_logprobs:
        return 1 << 62
    last = len(req.input_ids) - 1  # positions [first, last) are scored
    first = max(start, req.logprob_start_len - 1, 0)
    if first + PROMPT_LOGPROB_CHUNK >= last:
        return 1 << 62
    return first - start + PROMPT_LOGPROB_CHUNK


class Scheduler:
    def __init__(self, args: EngineArgs, runner: ModelRunner, tokenizer: Any) -> None:
        self.args = args
        self.runner = runner
        self.tokenizer = tokenizer
        cfg = runner.config
        self.vocab_size = cfg.vocab_size
        self.context_len = runner.context_len
        self.allocator = runner.allocator
        self.req_to_token_pool = runner.req_to_token_pool
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.tree = RadixCache(self.allocator, disable=args.disable_radix_cache)
        eos = set(cfg.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)
        # what decoding with skip_special_tokens leaves out (stop-string windows widen past them):
        # the named special tokens and every added token marked special (SmolLM2's <file_sep>, ...)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", None) or ()) | frozenset(
            i for i, t in added.items() if getattr(t, "special", False))
        self.sampler = Sampler(cfg.vocab_size, runner.device, tuple(sorted(self.eos_ids)))
        self.seed_rng = random.Random(args.seed)
        self.chunk_size = args.chunked_prefill_size if args.chunked_prefill_size > 0 else None
        # the chunked request's last chunk was cut by PROMPT_LOGPROB_CHUNK: the next step goes
        # to the others (running requests decode, waiting ones are admitted) before its next chunk
        self._chunk_yields = False

        self.waiting: deque[Req] = deque()
        self.grammar_queue: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        # overlap scheduling: a decode step whose sampled tokens are not processed yet
        self.overlap = args.overlap_schedule == "on" or (args.overlap_schedule == "auto" and runner.device.type == "cuda")
        self.inflight: tuple[list[Req], Any] | None = None
        # jump-forward (auto: 4 requests on CPU, 1 on CUDA; see EngineArgs.jump_forward_max_batch)
        # and n-gram drafts (auto: 4 on CPU, 64 on CUDA) run only while this few requests run
        cuda = runner.device.type == "cuda"
        explicit = args.jump_forward_max_batch >= 0
        self.jump_max_batch = args.jump_forward_max_batch if explicit else (1 if cuda else 4)
        self.draft_max_batch = args.jump_forward_max_batch if explicit else (64 if cuda else 4)
        self.ngram_drafts = args.speculative_algorithm == "ngram"  # speculative decoding (ngram_draft.py)
        # decode tokens ride along in prefill steps; rank 0 alone could not tell the other ranks
        self.mixed_chunk = args.enable_mixed_chunk and args.tp_size == 1
        self.outputs: list[ReqOutput] = []
        self._live: dict[str, Req] = {}  # every request added and not finished yet
        # a failed step stops the requests it touched, not the scheduler (off with tensor
        # parallelism: the other ranks would not know)
        self.recover_step_errors = args.tp_size == 1
        self._failed_steps = 0  # unexplained failed steps in a row (see MAX_FAILED_STEPS)
        # the requests whose tokens the step in progress computes (set before each forward): a
        # failed step's suspects
        self._step_reqs: list[Req] = []
        # after a failed step, the requests of that step run one at a time, alone, until each has
        # been prefilled again and sampled a token (then it batches again): ordered as a set
        self._suspects: dict[Req, None] = {}
        self._strikes: dict[Req, int] = {}  # failed steps a request was alone in (STRIKES_TO_FAIL)
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._grammar_compiler = None
        self.check_integrity_at_idle = True
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0, "jump_tokens": 0,
                      "draft_tokens": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0, "overlap_steps": 0, "mixed_steps": 0, "retractions": 0,
                      # requests admitted past one waiting ahead of them that the KV budget could not hold
                      "bypass_admissions": 0, "forward_steps": 0, "decode_steps": 0, "requests": 0,
                      "failed_rows": 0,  # requests stopped alone for non-finite logits
                      # batch steps that raised (_recover), and the requests stopped as their cause
                      "failed_steps": 0, "failed_step_requests": 0,
                      # decode steps of the running requests while a prompt was part way through
                      # its prefill: a long prompt's chunks let the others make tokens between them
                      "decode_steps_mid_prefill": 0}

    # ================================================================== public API

    def add_request(self, r: TokenizedGenerateReq) -> None:
        """Queue a request. Invalid input finishes it at once with an error output (no KV is
        touched), so one bad request never affects the others."""
        try:
            req = self._make_req(r)
        except ValueError as e:
            self._reject(r.rid, str(e), len(r.input_ids or []))
            return
        except Exception as e:  # noqa: BLE001 - a bug preparing this request stops it, not the scheduler
            log.exception("preparing request %s failed", r.rid)
            self._reject(r.rid, f"internal error preparing the request ({type(e).__name__}: {e})",
                         len(r.input_ids or []), internal=True)
            return
        self.stats["requests"] += 1
        self._live[req.rid] = req
        if req.params.has_grammar:
            self.grammar_queue.append(req)
        else:
            self.waiting.append(req)

    def abort(self, rid: str) -> bool:
        """Stop a request wherever it is; its KV is released (cached in the tree)."""
        self._finish_inflight()
        for q in (self.waiting, self.grammar_queue):
            for req in q:
                if req.rid == rid:
                    q.remove(req)
                    fut = req.grammar_future
                    if fut is not None and not fut.done() and \
                            not any(r.grammar_future is fut for r in self.grammar_queue):
                        # no one else waits for it: free its compile worker for the next grammar
                        self.grammar_compiler.cancel(fut)
                    req.finish("abort", message="aborted")
                    self._emit(req)
                    return True
        active = self.running + ([self.chunked] if self.chunked else [])
        for req in active:
            if req.rid == rid:
                if req is self.chunked:
                    self.chunked = None
                else:
                    self.running.remove(req)
                req.finish("abort", message="aborted")
                self._release(req)
                self._emit(req)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.grammar_queue or self.running or self.chunked or self.inflight)

    def has_runnable_work(self) -> bool:
        """Whether a step would do anything now: not while the only work is grammars still
        compiling (a loop then looks again every GRAMMAR_POLL_S instead of spinning on steps
        that do nothing, taking a core from the compile)."""
        return bool(self.waiting or self.running or self.chunked or self.inflight) or \
            any(r.grammar_future is None or r.grammar_future.done() for r in self.grammar_queue)

    def step(self) -> list[ReqOutput]:
        """Run one batch and return the outputs it produced. An exception inside the step
        stops the request that caused it, never the others, nor the scheduler (:meth:`_recover`)."""
        self._step_reqs = []
        try:
            out = self._step()
        except Exception as e:
            return self._recover(e)
        self._failed_steps = 0
        return out

    def _recover(self, err: Exception) -> list[ReqOutput]:
        """After a step raised: the KV state is rebuilt from empty, prefix cache included (the
        step may have left slots half-written or unaccounted, and cached KV must never be
        wrong), and every request that held KV goes back to the front of the waiting queue
        with its output so far (re-prefilled as prompt + output, as after a retraction).

        Which request made the step fail is found by running the step's requests again one at
        a time, alone (the suspects, see :meth:`_schedule_suspect`); one that passes batches
        again. A step of a single request that fails is followed by a canary: one token of a
        fixed prompt alone. The canary passing puts the failure on the request (a strike); at
        STRIKES_TO_FAIL strikes it finishes with an error of its own (a 400: the request made
        the step fail), and only it. The canary failing too, or a step failing with no request
        in it, is the server's: that request gets an internal error, and after
        MAX_FAILED_STEPS such failures with no passing step between them the error is raised
        (also at once with recovery off, or when the rebuilt state fails its integrity check,
        e.g. a broken CUDA context)."""
        if not self.recover_step_errors:
            raise err
        self.stats["failed_steps"] += 1
        queued = {id(r) for r in self.waiting} | {id(r) for r in self.grammar_queue}
        holders = [r for r in self._live.values() if id(r) not in queued]
        stepped = [r for r in self._step_reqs if r.rid in self._live] or holders
        lone = stepped[0] if len(stepped) == 1 else None
        self._step_reqs = []
        self.running, self.chunked, self.inflight, self._chunk_yields = [], None, None, False
        log.error("a batch step of %d request(s) failed (%s: %s); %s", len(stepped), type(err).__name__, err,
                  "running it again alone" if lone is None else "checking the server with a canary",
                  exc_info=err)
        try:
            self.tree.forget()
            self.allocator.clear()
            self.req_to_token_pool.clear()
            for req in holders:
                req.req_pool_idx, req.last_node, req.prefix_len, req.kv_len = None, None, 0, 0
                req.draft, req.draft_masks = [], None
                # prompt logprobs are computed again with the prompt (as after a retraction)
                req.input_logprobs.clear()
                req.input_top_logprobs.clear()
            server_fault = not stepped or (lone is not None and not self._canary_passes())
            requeue = []
            for req in holders:
                if req.finished is not None:  # it ended in the step, before the failure
                    self._emit(req)
                elif req is lone and server_fault:
                    message = f"internal error in a batch step ({type(err).__name__}: {err}); the request was stopped"
                    req.finish("abort", message=message)
                    self._emit(req, error=message)
                elif req is lone and self._strikes.get(req, 0) + 1 >= STRIKES_TO_FAIL:
                    message = (f"this request made its batch step fail, each time it ran alone "
                               f"({type(err).__name__}: {err}); it was stopped, and no other request was affected")
                    log.warning("request %s: %s", req.rid, message)
                    self.stats["failed_step_requests"] += 1
                    req.finish("abort", message=message)
                    self._emit(req, error=message, internal=False)
                else:
                    if req is lone:
                        self._strikes[req] = self._strikes.get(req, 0) + 1
                    if any(r is req for r in stepped):
                        self._suspects[req] = None
                    requeue.append(req)
            self.waiting.extendleft(reversed(requeue))
            self.check_integrity()
        except Exception:
            log.exception("recovery from the failed step failed")
            raise err from None
        if server_fault:
            self._failed_steps += 1
            if self._failed_steps > MAX_FAILED_STEPS:
                raise err
        out, self.outputs = self.outputs, []
        return out

    def _canary_passes(self) -> bool:
        """Run one token of a fixed prompt alone through the model (its KV written to a slot
        freed after): whether the model still computes finite logits, i.e. whether a failed
        step of a single request was that request's doing or the server's. Requires an idle
        KV state (after the rebuild); leaves it as it was."""
        row = self.req_to_token_pool.alloc()
        slots = self.allocator.alloc(1)
        try:
            token = min(self.eos_ids) if self.eos_ids else 0
            fb = ForwardBatch.build(ForwardMode.EXTEND, [token], [0], slots, [row], [0], [1], [0], self.runner.device)
            self.req_to_token[row, 0] = slots[0].to(self.req_to_token.dtype)
            ok = bool(torch.isfinite(self.runner.forward(fb)).all())
            if ok:
                self._failed_steps = 0
            else:
                log.error("the canary step's logits are not finite")
            return ok
        except Exception:  # noqa: BLE001 - the answer: the server cannot run even this step
            log.exception("the canary step failed too")
            return False
        finally:
            self.allocator.free(slots)
            self.req_to_token_pool.free(row)

    def _step(self) -> list[ReqOutput]:
        self._poll_grammars()
        if self.inflight is not None:
            if self._can_chain():
                self._chain_decode()
                out, self.outputs = self.outputs, []
                return out
            self._finish_inflight()
        plan = self._schedule_suspect() if self._suspects else self._schedule_prefill()
        if plan:
            mixed = [] if self._suspects else self._mix_in_running(plan)
            done = self._run_extend(plan, mixed)
            if mixed:
                self.stats["mixed_steps"] += 1
                self.running = [r for r in self.running if r.finished is None]
                self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
            riders = {id(r) for r, _ in mixed}  # already running
            self.running.extend(r for r in done if r.finished is None and id(r) not in riders)
            for r in done:  # prefilled again and sampled alone: it batches again
                self._suspects.pop(r, None)
        elif self.running:
            if self.chunked is not None:
                self.stats["decode_steps_mid_prefill"] += 1
            self._run_running()
        if self.check_integrity_at_idle and not self.has_work():
            self.check_integrity()
        out, self.outputs = self.outputs, []
        return out

    def flush_cache(self) -> bool:
        """Drop every cached prefix. Only when idle (returns False otherwise)."""
        if self.has_work():
            return False
        self.tree.reset()
        return True

    def check_integrity(self) -> None:
        """Every KV slot is free, in exactly one tree node, or owned by one active request
        (a step in flight included: its slots are owned by its requests); every request-table
        row is free, reserved, or held by one active request."""
        active = self.running + ([self.chunked] if self.chunked else [])
        owned = [self.req_to_token[r.req_pool_idx, r.prefix_len:r.kv_len].long().cpu() for r in active]
        self.tree.check_integrity(owned=owned)
        pool = self.req_to_token_pool
        held = sorted(r.req_pool_idx for r in active)
        in_use = sorted(set(range(pool.max_requests)) - set(pool.free_rows()) - set(pool.reserved_rows()))
        assert held == in_use, f"request rows in use {in_use}, held by active requests {held}"

    def info(self) -> dict:
        prompt = max(1, self.stats["prompt_tokens"])
        return {
            **self.stats,
            "cache_hit_rate": self.stats["cached_tokens"] / prompt,
            "num_running": len(self.running) + (1 if self.chunked else 0),
            "num_waiting": len(self.waiting) + len(self.grammar_queue),
            "free_slots": self.allocator.available_size(),
            "evictable_slots": self.tree.evictable_size(),
            "protected_slots": self.tree.protected_size(),
            "total_slots": self.allocator.num_slots,
            "cached_slots": self.tree.total_size(),
            "evicted_tokens": self.tree.num_evicted_tokens,
            "new_token_ratio": self.new_token_ratio,
            "context_length": self.context_len,
            # what the compiled-grammar cache holds (entries, bytes, its caps)
            "grammar_cache": self._grammar_compiler.cache_info() if self._grammar_compiler is not None else
            {"entries": 0, "compiled": 0, "bytes": 0, "cap_bytes": self.args.grammar_cache_bytes},
        }

    # ================================================================== admission

    def _make_req(self, r: TokenizedGenerateReq) -> Req:
        validate_request(r, self.vocab_size, self.context_len, self.allocator.num_slots)
        p, ids = r.sampling_params, list(r.input_ids)
        start = r.logprob_start_len
        if r.return_logprob and start == -1:  # SGLang's default (its -1): the last prompt token's logprob too
            start = max(0, len(ids) - 1)
        req = Req(rid=r.rid, input_ids=ids, params=p,
                  # any integer seeds (OpenAI sets no range): folded into the kernels' int64
                  seed=p.seed % (1 << 63) if p.seed is not None else self.seed_rng.getrandbits(62),
                  return_logprob=r.return_logprob, logprob_start_len=start,
                  top_logprobs_num=r.top_logprobs_num, stream=r.stream)
        if p.has_grammar:
            spec = grammar_spec(p)  # before the compiler: a spec's own error is the request's to report
            req.grammar_future = self.grammar_compiler.compile_async(spec)
        return req

    @property
    def grammar_compiler(self):
        if self._grammar_compiler is None:
            from treadle.constrained import GrammarCompiler

            if self.tokenizer is None:
                raise ValueError("constrained decoding needs a tokenizer; this model has none")
            self._grammar_compiler = GrammarCompiler(
                self.tokenizer, sorted(self.eos_ids), vocab_size=self.vocab_size,
                timeout_s=self.args.grammar_compile_timeout_s, max_workers=self.args.grammar_compile_workers,
                memory_limit_bytes=self.args.grammar_memory_limit_bytes,
                whitespace_pattern=self.args.json_whitespace_pattern,
                json_schema_mode=self.args.json_schema_mode, disk_cache_dir=self.args.grammar_disk_cache_dir(),
                max_recursion_depth=self.args.grammar_max_recursion_depth,
                cache_bytes=self.args.grammar_cache_bytes, max_grammar_size=self.args.grammar_max_size,
                token_index=self.args.grammar_index)
        return self._grammar_compiler

    def _poll_grammars(self) -> None:
        if not self.grammar_queue:
            return
        still = []
        for req in self.grammar_queue:
            fut = req.grammar_future
            if not fut.done():
                still.append(req)
                continue
            req.grammar_future = None
            err = "cancelled" if fut.cancelled() else fut.exception()
            if err is not None:
                self._reject(req.rid, f"grammar compilation failed: {err}", len(req.input_ids))
                continue
            try:
                req.grammar = fut.result().matcher()
            except Exception as e:  # noqa: BLE001 - this request's grammar, not the step's
                log.exception("making the grammar matcher of %s failed", req.rid)
                self._reject(req.rid, f"grammar matcher failed: {type(e).__name__}: {e}", len(req.input_ids))
                continue
            self.waiting.append(req)
        self.grammar_queue = still

    def _decode_reserve(self) -> int:
        """The KV slots the running requests are expected to still write (see _reserve_ratio)."""
        optimistic = sum(self._new_tokens_left(r) for r in self.running if not self._reserved_whole(r))
        whole = sum(self._new_tokens_left(r) for r in self.running if self._reserved_whole(r))
        return int(optimistic * self.new_token_ratio) + whole

    def _reserve_ratio(self, req: Req) -> float:
        """The share of its remaining tokens a request reserves. new_token_ratio bets that
        requests stop early (EOS) and admits more than the pool would hold if all ran to
        max_new_tokens; a lost bet is paid by retracting someone, who re-prefills its prompt and
        output on readmission (its cached prefix is evicted first under pressure). Retracted
        and readmitted on the ratio, a long generation in a pool too small for several
        time-shares the pool with the others: each stay makes progress (hundreds of tokens)
        for the price of one prefill, which beats waiting for the pool to hold all it may
        write (reserving it whole at its first retraction made the last of four 1,500-token
        generations in a 2,048-slot pool finish 25% later, in steps; at its third, six of them
        took 2-7% more steps: the request waited for room it would not have lost again). Only
        the number of times is bounded: a request retracted WHOLE_RESERVE_AFTER times (never
        reached in those runs) is readmitted only
        when all it may still write fits (ratio 1), and that reserve stays counted while it
        runs. The requests reserved whole then always fit the pool together, so retracting
        the others is always enough (_retract_until prefers them) and none of them is
        retracted again (a half-prefilled prompt, retracted first, and a request past
        RESERVE_CLIP aside). SGLang instead resets the shared ratio after a retraction (to
        what the running batch decoded of its max_new_tokens): that makes every admission
        more cautious and bounds no single request's retractions."""
        return 1.0 if self._reserved_whole(req) else self.new_token_ratio

    @staticmethod
    def _reserved_whole(req: Req) -> bool:
        return req.num_retractions >= WHOLE_RESERVE_AFTER

    def _new_tokens_left(self, req: Req) -> int:
        """The tokens `req` may still write, as its reserve counts them (at most RESERVE_CLIP):
        what is left of its max_new_tokens, cut by the context, where it ends whatever that
        says. Uncut, a prompt of context - 1 tokens with the default 128 new tokens counted
        slots it can never use, could never be admitted even on an idle server, and, first in
        line, kept every request after it waiting (every one: the server hung)."""
        return min(req.remaining_new_tokens(), max(0, self.context_len - req.seq_len), RESERVE_CLIP)

    def _schedule_prefill(self) -> list[tuple[Req, int]]:
        """Pick this step's prefill plan: (request, new tokens to compute) pairs. Admitted
        requests get a KV row and lock their cached prefix."""
        if not self.waiting and self.chunked is None:
            return []
        chunk = self.chunk_size
        if self.mixed_chunk and self.running and chunk is not None:  # the step's decode tokens share it
            chunk = max(1, chunk - sum(r.num_pending for r in self.running))
        budget = PrefillBudget(self.allocator.available_size() + self.tree.evictable_size() - self._decode_reserve(),
                               self.args.max_prefill_tokens, chunk)
        plan: list[tuple[Req, int]] = []
        yield_now = self._chunk_yields and self.chunked is not None and bool(self.running or self.waiting)
        self._chunk_yields = False
        if yield_now and self.running:
            return []  # the running requests decode a token between a scored prompt's chunks
        if self.chunked is not None and not yield_now:
            req = self.chunked
            cap = scored_chunk_cap(req, req.kv_len)
            n = min(req.num_pending, budget.max_extend(), cap)
            if n <= 0:
                return []
            budget.take(n, 0)
            plan.append((req, n))
            if n < req.num_pending:
                self._chunk_yields = n == cap
                return plan
            self.chunked = None
        max_running = self.runner.max_running
        admitted: list[list[int]] = [r.fill_ids for r, _ in plan]
        # the first request the KV budget could not hold this step, once requests behind it
        # are tried (see below); None while every request so far fitted
        blocked: Req | None = None
        passed = 0  # requests looked at behind it (at most BYPASS_SCAN)
        now = time.monotonic()
        for req in order_waiting(self.waiting, self.args.schedule_policy, self.tree, self.args.starvation_bound_s):
            if len(self.running) + len(plan) + yield_now >= max_running or self.req_to_token_pool.available_size() == 0:
                break
            if blocked is not None:
                passed += 1
                if passed > BYPASS_SCAN:
                    break
            match = self.tree.match_prefix(match_key(req))
            prefix = len(match.slots)
            if admitted and not self.tree.disable and _shares_uncached_prefix(req.fill_ids, admitted, prefix):
                # it shares a long uncached prefix with a request admitted this step: wait one
                # step and reuse that KV instead of computing the same prefix twice
                continue
            extend = req.seq_len - prefix
            if blocked is None:
                reserve = int(self._new_tokens_left(req) * self._reserve_ratio(req))
            else:  # passing a blocked request: only whole (see below)
                reserve = self._new_tokens_left(req)
            # locking the prefix takes it out of the evictable pool this budget counted
            locked = -self.tree.inc_lock_ref(match.last_node)
            budget.total -= locked
            if blocked is not None:
                caps = [budget.input, scored_chunk_cap(req, req.kv_len)] + \
                    ([budget.chunk] if budget.chunk is not None else [])
                if extend + reserve <= budget.total and extend <= min(caps):
                    self.waiting.remove(req)
                    self._admit(req, match)
                    budget.take(extend, reserve)
                    plan.append((req, extend))
                    admitted.append(req.fill_ids)
                    self.stats["bypass_admissions"] += 1
                else:
                    self.tree.dec_lock_ref(match.last_node)
                    budget.total += locked
                continue
            input_cap = budget.input if plan else max(budget.input, extend)  # a lone big prompt may exceed it
            chunk_cap = budget.chunk if budget.chunk is not None else extend
            scored_cap = scored_chunk_cap(req, req.kv_len)
            chunk_cap = min(chunk_cap, scored_cap)
            if extend + reserve <= budget.total and extend <= min(input_cap, chunk_cap):
                n = extend
            elif (self.chunk_size is not None or scored_cap < extend) and self.chunked is None \
                    and extend > chunk_cap and min(chunk_cap, budget.total) > 0 and (plan or chunk_cap >= 1):
                n = min(chunk_cap, budget.total, budget.input if plan else chunk_cap)
            else:
                n = 0
            if n <= 0:
                self.tree.dec_lock_ref(match.last_node)
                if extend + reserve > budget.total and self.chunked is None and \
                        not starved(req, now, self.args.starvation_bound_s):
                    # Short of KV, not of this step's prefill tokens. Arrival order (SGLang's
                    # and vLLM's admission) would stop here, and a short request then waited
                    # behind a long one the pool could not hold yet for as long as the running
                    # requests took to finish (hundreds of steps) though the pool held it
                    # many times over. Requests behind it may pass it, each only when its
                    # prompt and every token it may write fit the budget left (so passing adds
                    # no retraction) and whole (no chunk). It is tried first again at every
                    # step; once it has waited past the starvation bound (from its arrival,
                    # or from its retraction) no one passes it any more.
                    budget.total += locked
                    blocked = req
                    continue
                break
            self.waiting.remove(req)
            self._admit(req, match)
            budget.take(n, reserve if n == extend else 0)
            plan.append((req, n))
            admitted.append(req.fill_ids)
            if n < extend:
                self.chunked = req
                self._chunk_yields = n == scored_cap
                break
        return plan

    def _schedule_suspect(self) -> list[tuple[Req, int]]:
        """After a failed step: the plan of the first suspect alone (its next prefill chunk),
        or nothing when it cannot be admitted now (the running requests then decode, without
        it). No other request is admitted while suspects are left."""
        assert self.chunked is None or self.chunked in self._suspects, "only suspects are admitted now"
        first = next((r for r in self.waiting if r in self._suspects), None) if self.chunked is None else None
        if self.chunked is None and first is None:
            self._suspects.clear()  # none is waiting any more (each finished or was aborted)
            return self._schedule_prefill()
        queue, self.waiting = self.waiting, deque([first] if first is not None else [])
        try:
            return self._schedule_prefill()
        finally:
            if first is not None and not self.waiting:
                queue.remove(first)  # admitted
            self.waiting = queue

    def _mix_in_running(self, plan: list[tuple[Req, int]]) -> list[tuple[Req, int]]:
        """--enable-mixed-chunk: the running requests' pending tokens join this prefill step
        (a decode is an extend of one token), so they still advance a token while prompts are
        prefilled. Only when the pool holds both without retracting anyone; else they wait
        for the next step, as without mixing."""
        if not self.mixed_chunk or not self.running:
            return []
        extra = [(r, r.num_pending) for r in self.running]
        need = sum(n for _, n in plan) + sum(n for _, n in extra)
        if self.allocator.available_size() + self.tree.evictable_size() < need:
            return []
        return extra

    def _admit(self, req: Req, match) -> None:
        row = self.req_to_token_pool.alloc()
        assert row is not None, "admission checked for a free request row"
        req.req_pool_idx = row
        req.last_node = match.last_node
        req.prefix_len = req.kv_len = len(match.slots)
        if req.prefix_len:
            self.req_to_token[row, : req.prefix_len] = match.slots.to(self.req_to_token)
        if not req.admitted_once:
            req.admitted_once = True
            req.cached_tokens = req.prefix_len
            self.stats["prompt_tokens"] += len(req.input_ids)
            self.stats["cached_tokens"] += req.prefix_len

    # ================================================================== KV helpers

    def _alloc_slots(self, n: int) -> torch.Tensor:
        short = n - self.allocator.available_size()
        if short > 0:
            self.tree.evict(short)
        slots = self.allocator.alloc(n)
        assert slots is not None, f"out of KV slots: need {n}, have {self.allocator.available_size()}"
        return slots

    def _truncate_kv(self, req: Req, length: int) -> None:
        """Free the request's KV slots from position ``length`` on (a no-op when it has no
        more): tokens rolled back, a rejected draft, a step computed for nothing."""
        if req.kv_len > length:
            self.allocator.free(self.req_to_token[req.req_pool_idx, length: req.kv_len].long().cpu())
            req.kv_len = length

    def _cache_unfinished(self, req: Req) -> None:
        """After a prefill chunk: put the computed tokens into the tree and lock them, so other
        requests can share them and this request's slots are tree-owned."""
        if self.tree.disable:
            return
        row = req.req_pool_idx
        kv = self.req_to_token[row, : req.kv_len].long().cpu()  # the tree and the allocator are on the host
        key = req.fill_ids[: req.kv_len]
        dup_end = self.tree.insert(key, kv)
        if dup_end > req.prefix_len:  # someone cached these tokens meanwhile: ours are duplicates
            self.allocator.free(kv[req.prefix_len:dup_end])
        match = self.tree.match_prefix(key)
        assert len(match.slots) == req.kv_len
        self.req_to_token[row, req.prefix_len: req.kv_len] = match.slots[req.prefix_len:].to(self.req_to_token)
        self.tree.inc_lock_ref(match.last_node)
        self.tree.dec_lock_ref(req.last_node)
        req.last_node, req.prefix_len = match.last_node, req.kv_len

    def _release(self, req: Req) -> None:
        """Give up the request's KV row. Its computed tokens go into the tree (evictable once
        unlocked) or, with the cache disabled, back to the allocator."""
        row = req.req_pool_idx
        if row is None:
            return
        req.draft, req.draft_masks = [], None  # never computed (drafts are verified in their extend)
        self._truncate_kv(req, req.seq_len)  # finished inside a verified draft: drop the KV after it
        kv = self.req_to_token[row, : req.kv_len].long().cpu()
        if self.tree.disable:
            self.allocator.free(kv[req.prefix_len:])
        else:
            dup_end = self.tree.insert(req.fill_ids[: req.kv_len], kv)
            if dup_end > req.prefix_len:
                self.allocator.free(kv[req.prefix_len:dup_end])
            self.tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(row)
        req.req_pool_idx, req.last_node, req.prefix_len, req.kv_len = None, None, 0, 0

    def _retract_until(self, need: int) -> None:
        """Move running requests back to the front of the waiting queue until `need` slots can
        be had. Their computed prefix stays cached in the tree (evictable).

        Which one (see _victim_key): SGLang takes the one with the fewest output tokens, vLLM
        the latest arrival. Both pick a short request (16 new tokens) just admitted next to
        long generations, as requests passing a blocked one are (see _schedule_prefill): it
        frees a few dozen slots, would have freed them in a few steps anyway, and its user
        waits for a re-prefill. Here: never a request reserved whole while another is running
        (those fit together, see _reserve_ratio); then the most tokens left to write (the KV
        that would be held and grow the longest: the bet that lost); then the fewest output
        tokens (the least to recompute); then the latest admitted. (Fewest retractions first
        was tried: it then took a short request over a long one retracted once before.)"""
        def short() -> bool:
            return self.allocator.available_size() + self.tree.evictable_size() < need

        if self.chunked is not None and short():  # a half-prefilled prompt goes back first
            victim, self.chunked = self.chunked, None
            self._retract(victim)
        while short() and len(self.running) > 1:
            victim = min(reversed(self.running), key=self._victim_key)
            self.running.remove(victim)
            need -= victim.num_pending
            self._retract(victim)
        if self.allocator.available_size() + self.tree.evictable_size() < need:
            raise RuntimeError(f"KV pool exhausted: need {need} slots for one request; pool too small")

    def _victim_key(self, req: Req) -> tuple[bool, int, int]:
        """Retraction order, smallest first (see _retract_until)."""
        left = min(req.remaining_new_tokens(), max(0, self.context_len - req.seq_len))
        return self._reserved_whole(req), -left, len(req.output_ids)

    def _retract(self, req: Req) -> None:
        self._release(req)
        # the starvation bound counts its wait from now (it was served until now); from its
        # arrival it would count as starved at once behind a long generation, and no request
        # could pass it while it waits for room (see _schedule_prefill)
        req.arrival = time.monotonic()
        # prompt logprobs are recomputed when the prompt is prefilled again
        req.input_logprobs.clear()
        req.input_top_logprobs.clear()
        req.num_retractions += 1
        self.stats["retractions"] += 1
        self.waiting.appendleft(req)
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.1)

    # ================================================================== forward

    def _run_running(self) -> None:
        """Advance every running request: a decode step, or an extend when jump-forward left
        some with several pending tokens."""
        need = sum(r.num_pending for r in self.running)
        self._retract_until(need)
        if all(r.num_pending == 1 for r in self.running):
            self._run_decode()
        else:
            self._run_extend([(r, r.num_pending) for r in self.running])
        self.running = [r for r in self.running if r.finished is None]
        self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)

    def _launch_decode(self, reqs: list[Req], input_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """One decode forward for ``reqs`` (each computes the token at position kv_len);
        returns the logits without waiting for them."""
        slots = self._alloc_slots(len(reqs))
        pos = [r.kv_len for r in reqs]
        fb = ForwardBatch.build(
            ForwardMode.DECODE, input_ids, pos, slots, [r.req_pool_idx for r in reqs],
            pos, [1] * len(reqs), list(range(len(reqs))), self.runner.device)
        self.req_to_token[fb.req_pool_indices, fb.positions] = fb.out_cache_loc.to(self.req_to_token.dtype)
        self._step_reqs = list(reqs)
        logits = self.runner.forward(fb)
        for r in reqs:
            r.kv_len += 1
        self.stats["forward_steps"] += 1
        self.stats["decode_steps"] += 1
        return logits

    def _run_decode(self) -> None:
        reqs = self.running
        logits = self._launch_decode(reqs, [r.last_token for r in reqs])
        if self.overlap:
            # the tokens stay on the device; the next step feeds them to its forward and
            # processes them while the GPU runs it
            self.inflight = (list(reqs), self.sampler.launch(logits, reqs))
        else:
            self._sample_and_process(logits, reqs)

    # ================================================================== overlap

    def _can_chain(self) -> bool:
        """The next step can start before this one's tokens are processed: a decode of the
        same requests, nothing to prefill, KV for one more token each."""
        reqs = self.inflight[0]
        return (not self.waiting and self.chunked is None and len(self.running) == len(reqs)
                and self.allocator.available_size() + self.tree.evictable_size() >= len(reqs))

    def _chain_decode(self) -> None:
        """Overlap step: launch step N+1's forward on the tokens sampled in step N (still on
        the device), then, while the GPU runs it, process step N's tokens on the host (output,
        stop checks, grammar, streaming) and launch step N+1's sampling with the new grammar
        masks. A request that finished or jumped at step N drops its row of step N+1."""
        reqs, pending = self.inflight
        self.inflight = None
        logits = self._launch_decode(reqs, pending.token_ids)
        self.stats["overlap_steps"] += 1
        self._process_sampled(reqs, self.sampler.finish(pending))
        keep: list[int] = []
        for i, r in enumerate(reqs):
            if r.finished is not None:
                continue  # released: the token computed in step N+1 went into the tree with it
            if r.num_pending == 0:
                keep.append(i)
                continue
            # it jumped: step N+1 computed its last token for nothing, drop that KV (a draft
            # recomputes it with the draft so the draft can be verified from its logits)
            self._truncate_kv(r, r.seq_len - len(r.draft) - 1)
        self.running = [r for r in self.running if r.finished is None]
        if keep:
            cont = [reqs[i] for i in keep]
            rows = logits if len(keep) == len(reqs) else logits[torch.tensor(keep, device=logits.device)]
            self.inflight = (cont, self.sampler.launch(rows, cont))

    def _finish_inflight(self) -> None:
        """Process the tokens of the step in flight (back to the plain state)."""
        if self.inflight is None:
            return
        reqs, pending = self.inflight
        self.inflight = None
        self._process_sampled(reqs, self.sampler.finish(pending))
        self.running = [r for r in self.running if r.finished is None]

    def _run_extend(self, plan: list[tuple[Req, int]], riders: list[tuple[Req, int]] = ()) -> list[Req]:
        """Compute plan's tokens, and the riders' (running requests mixed into a prefill step:
        computed alike, but not put into the cache each step, as a decode step does not);
        sample for requests whose pending tokens are all computed. Returns those requests
        (finished or not)."""
        cached = len(plan)
        plan = list(plan) + list(riders)
        total = sum(n for _, n in plan)
        slots = self._alloc_slots(total)
        input_ids: list[int] = []
        positions: list[int] = []
        logits_rows: list[int] = []
        sample_reqs: list[Req] = []
        sample_rows: list[int] = []
        prompt_lp: list[tuple[Req, list[int], list[int]]] = []  # (req, logits rows, next ids)
        verify: list[tuple[Req, list[int]]] = []  # (req with a draft, its logits rows)
        for req, n in plan:
            start = req.kv_len
            fill = req.fill_ids
            base = len(input_ids)
            input_ids.extend(fill[start: start + n])
            positions.extend(range(start, start + n))
            if req.wants_prompt_logprobs:
                # logits at prompt position p score input_ids[p + 1]; the first scored token
                # is the one at logprob_start_len (position 0 has no score)
                first = max(start, req.logprob_start_len - 1, 0)
                ps = list(range(first, min(start + n, len(req.input_ids) - 1)))
                if ps:
                    prompt_lp.append((req, list(range(len(logits_rows), len(logits_rows) + len(ps))),
                                      [req.input_ids[p + 1] for p in ps]))
                    logits_rows.extend(base + p - start for p in ps)
            if req.draft:
                # a verified jump-forward: the logits after the last sampled token and after
                # each draft token (the last row gives the token after a fully accepted draft)
                k = len(req.draft)
                assert start + n == req.seq_len and n >= k + 1, "a draft is computed in one extend"
                verify.append((req, list(range(len(logits_rows), len(logits_rows) + k + 1))))
                logits_rows.extend(range(base + n - k - 1, base + n))
            elif start + n == req.seq_len:
                sample_reqs.append(req)
                sample_rows.append(len(logits_rows))
                logits_rows.append(base + n - 1)
        fb = ForwardBatch.build(
            ForwardMode.EXTEND, input_ids, positions, slots, [r.req_pool_idx for r, _ in plan],
            [r.kv_len for r, _ in plan], [n for _, n in plan], logits_rows, self.runner.device)
        rows = torch.repeat_interleave(fb.req_pool_indices, fb.extend_lens, output_size=total)
        self.req_to_token[rows, fb.positions] = fb.out_cache_loc.to(self.req_to_token.dtype)
        self._step_reqs = [r for r, _ in plan]
        logits = self.runner.forward(fb)
        self.stats["forward_steps"] += 1
        for req, n in plan:
            req.kv_len += n
        for req, rows, next_ids in prompt_lp:
            vals, tops = prompt_logprobs(logits[rows], next_ids, req.top_logprobs_num)
            req.input_logprobs.extend(vals)
            req.input_top_logprobs.extend(tops)
        for req, _ in plan[:cached]:
            # share what was just computed right away: a later chunk of this prompt, and other
            # requests with the same prefix admitted next step, reuse it (a draft is not
            # known to be output yet: it is verified first)
            if not req.draft:
                self._cache_unfinished(req)
        for req, rows in verify:
            self._verify_draft(req, logits[rows])
        # a request asking for no new tokens finishes once its prompt is computed (and cached)
        zero = [r for r in sample_reqs if r.params.max_new_tokens == 0]
        for r in zero:
            r.finish("length", length=0)
            self._release(r)
            self._emit(r)
        live = [(r, i) for r, i in zip(sample_reqs, sample_rows) if r.params.max_new_tokens > 0]
        if live:
            self._sample_and_process(logits[[i for _, i in live]], [r for r, _ in live])
        return sample_reqs

    # ================================================================== after sampling

    def _sample_and_process(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        self._process_sampled(reqs, self.sampler.sample(logits, reqs))

    def _process_sampled(self, reqs: list[Req], res) -> None:
        for i, req in enumerate(reqs):
            self._process_token(req, res.token_ids[i], res.logprobs[i], res.top_logprobs[i])

    def _process_token(self, req: Req, token: int, logprob: float, top: list | None, replay: bool = False) -> None:
        """Append one output token and act on it (grammar, finish checks, jump-forward,
        streaming). ``replay``: an accepted draft token, followed by more tokens this step:
        no jump-forward and no stream chunk for it yet. Token -1 (the sampler found its
        logits row non-finite) fails this request alone."""
        if token < 0 or req.grammar_error is not None:
            self._fail_alone(req, req.grammar_error)
            return
        req.output_ids.append(token)
        if req.first_token_at is None:
            req.first_token_at = time.monotonic()
        self.stats["generated_tokens"] += 1
        if req.return_logprob:
            req.output_logprobs.append(logprob)
            if req.top_logprobs_num:
                req.output_top_logprobs.append(top or [])
        if req.grammar is not None and not req.grammar.accept_token(token):
            req.finish("abort", message=f"token {token} rejected by the grammar")
        self._check_finished(req, token)
        if req.finished is None and not replay:
            drafted = False
            n = len(self.running)
            if req.grammar is not None and not self.args.disable_jump_forward and n <= self.jump_max_batch:
                drafted = self._propose_draft(req)
            if not drafted and self.ngram_drafts and n <= self.draft_max_batch:
                self._propose_ngram_draft(req)
        if req.finished is not None:
            if req in self.running or req.req_pool_idx is not None:
                self._release(req)
            self._emit(req)
        elif req.stream and not replay:
            self._emit(req)

    def _fail_alone(self, req: Req, grammar_error: str | None = None) -> None:
        """End a request whose logits were not finite (NaN or inf), or whose grammar could not
        give its next mask (``grammar_error``), with an error of its own; the rest of its batch
        goes on. Its KV past what the tree already holds is freed, not cached: values that made
        NaN logits must not be shared."""
        if grammar_error is not None:
            message = f"grammar could not go on: {grammar_error}"
            log.warning("request %s: %s; stopping it alone", req.rid, grammar_error)
        else:
            message = ("internal error: this request's logits were not finite (NaN or inf) and no token could be "
                       "drawn; the request was stopped")
            log.error("request %s: non-finite logits; stopping it alone", req.rid)
        self.stats["failed_rows"] += 1
        req.finish("abort", message=message)
        if req.req_pool_idx is not None:
            req.draft, req.draft_masks = [], None
            self._truncate_kv(req, req.prefix_len)
            self._release(req)
        self._emit(req, error=message, internal=grammar_error is None)

    def _check_finished(self, req: Req, token: int) -> None:
        p = req.params
        n_out = len(req.output_ids)
        if req.finished is not None:
            return
        if n_out >= p.min_new_tokens:
            if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_ids):
                req.finish("stop", matched=token)
                return
        if req.grammar is not None and req.grammar.is_terminated():
            req.finish("stop", matched=token)
            return
        if p.stop and n_out >= p.min_new_tokens and self.tokenizer is not None:
            window = req.output_ids[-self._stop_window(req):]
            tail = self.tokenizer.decode(window, skip_special_tokens=p.skip_special_tokens)
            new_from = 0  # with min_new_tokens: where this token's text starts in `tail`
            if p.min_new_tokens > 1 and any(s in tail for s in p.stop):
                new_from = len(self.tokenizer.decode(window[:-1], skip_special_tokens=p.skip_special_tokens))
            # a stop ending in an earlier token, one before min_new_tokens, is text; of those
            # found, the one the detokenizer cuts the text at: the first in the text
            found = [(at, s) for s in p.stop if s in tail and (at := tail.find(s, max(0, new_from - len(s) + 1))) >= 0]
            if found:  # before the length checks: a stop on the last allowed token is a stop
                req.finish("stop", matched=min(found, key=lambda f: f[0])[1])
                return
        if n_out >= p.max_new_tokens:
            req.finish("length", length=n_out)
            return
        if req.seq_len >= self.context_len:
            req.finish("length", length=n_out)
            return

    def _stop_window(self, req: Req) -> int:
        """How many trailing tokens hold any stop string that ends in the last one: a token
        adds at least a byte (a CJK character or an emoji is often 2-4 tokens: a window in
        characters missed them), plus one for a token that begins before the string, plus
        the special tokens among them that decoding skips."""
        p = req.params
        if req.stop_bytes is None:  # once a request: 128 stops of 50,000 characters re-encoded every token
            req.stop_bytes = max(len(s.encode("utf-8", "surrogatepass")) for s in p.stop)  # took seconds
        out = req.output_ids
        need = min(req.stop_bytes + 2, len(out))
        if not p.skip_special_tokens or not self.special_ids:
            return need
        # widen by the skipped ones until the window holds `need` others: one walk back from the
        # end (recounting the window at each widening cost its length squared over the need:
        # 8,000 special tokens, forced by logit_bias with a 1-character stop, took 2.2 s of every
        # step, and of every other request's in it)
        k = kept = 0
        special = self.special_ids
        while kept < need and k < len(out):
            k += 1
            kept += out[-k] not in special
        return k

    def _propose_draft(self, req: Req) -> bool:
        """Verified jump-forward, step 1: propose the grammar's forced text as draft tokens
        after the last output token (no rollback: the output so far is the model's own). The
        next extend computes them all; :meth:`_verify_draft` keeps the prefix the model agrees
        with. Returns whether a draft was set."""
        from treadle.constrained import plan_jump_forward

        jump = req.grammar.find_jump_forward_string()
        if not jump:
            return False
        table = self.grammar_compiler.token_bytes
        tail = req.output_ids[-JUMP_LOOKBACK:]
        plan = plan_jump_forward(self.tokenizer, table, tail, jump, holdback=0)
        if plan.num_rollback:
            # the canonical encoding would re-cut the tail: draft the forced text on its own
            plan = plan_jump_forward(self.tokenizer, table, [], jump, holdback=0)
        limit = min(req.remaining_new_tokens(), self.context_len - 1 - req.seq_len)
        if req.jump_cap is not None:
            limit = min(limit, req.jump_cap)
        accepted = self._set_draft(req, plan.new_token_ids[: max(0, limit)], "jump")
        self.stats["draft_tokens"] += accepted
        return accepted > 0

    def _set_draft(self, req: Req, draft: list[int], kind: str) -> int:
        """Make ``draft`` (or the prefix of it the grammar accepts) the request's draft, with
        the mask at each draft position where the request has a grammar or is still under
        min_new_tokens (the sampler verifies each position on it). Returns the draft length."""
        m, n_out = req.grammar, len(req.output_ids)
        if m is not None:  # the matcher walks the draft and rolls it back: no longer than it can undo
            draft = draft[: m.max_rollback]  # (a longer forced text is jumped over in the next steps)
        masks, accepted = None, len(draft)
        if draft and (m is not None or n_out < req.params.min_new_tokens):
            masks = torch.empty((len(draft) + 1, self.sampler.words), dtype=torch.int32)
            accepted, failed = 0, False
            for i in range(len(draft) + 1):
                if m is not None:
                    try:
                        m.fill_next_token_bitmask(masks, i)
                    except ValueError as e:  # a lazy index past its cap: the next step fails the request
                        req.grammar_error = str(e)
                        failed = True
                        break
                else:
                    masks[i].fill_(-1)
                self.sampler.forbid_early_stop(masks, i, req, n_out + i)
                if i == len(draft) or (m is not None and not m.accept_token(draft[i])):
                    break
                accepted += 1
            if m is not None:
                m.rollback(accepted)  # the matcher advances again as tokens are verified
            masks = masks[: accepted + 1]
            if failed:
                accepted = 0
        if accepted:
            req.draft, req.draft_masks, req.draft_kind = draft[:accepted], masks, kind
        return accepted

    def _propose_ngram_draft(self, req: Req) -> None:
        """Speculative decoding: draft what followed the last n tokens' latest earlier
        occurrence in the request (runtime/ngram_draft.py), cut where a grammar refuses it;
        verified like a jump's draft (a JSON value copied from the prompt, too)."""
        k = min(self.args.speculative_num_draft_tokens, req.remaining_new_tokens(),
                self.context_len - 1 - req.seq_len)
        if k < 1:
            return
        if req.ngram is None:
            req.ngram = NgramIndex(self.args.speculative_ngram_size)
        draft = req.ngram.draft(req.input_ids, req.output_ids, k)
        self.stats["spec_draft_tokens"] += self._set_draft(req, draft, "ngram")

    def _verify_draft(self, req: Req, logits: torch.Tensor) -> None:
        """Verified jump-forward, step 2: ``logits`` [k + 1, vocab] were computed after the
        last output token and after each of the k draft tokens. Keep the draft up to the first
        token the sampler would not have chosen, take the sampler's choice there (or after the
        whole draft), and free the KV of the rest: the output, its logprobs and, for a sampled
        request, its random draws (each row at its own output position) are token for token
        what decoding one step at a time gives, in one forward step."""
        draft, masks = req.draft, req.draft_masks
        req.draft, req.draft_masks = [], None
        k = len(draft)
        # the sampler itself, on the draft positions' masks: its choices are by construction
        # the ones decoding one token at a time would make
        res = self.sampler.sample(logits, [req] * (k + 1), masks, draft)
        a = 0
        while a < k and res.token_ids[a] == draft[a]:
            a += 1
        self._truncate_kv(req, req.kv_len - k + a)  # keep the last sampled token and the accepted draft
        if req.draft_kind == "jump":
            req.num_jump_tokens += a
            self.stats["jump_tokens"] += a
            # a model that spells the forced text in other tokens (smaller pieces) leaves each
            # draft at its first token: propose fewer next time rather than compute a 64-token
            # extend a step for nothing; drafts it takes whole grow back (outputs are the same
            # whatever the length: only the work differs)
            req.jump_cap = max(1, 2 * a) if a < k else 2 * k
        else:
            self.stats["spec_accepted_tokens"] += a
        for j in range(a + 1):
            token = draft[j] if j < a else res.token_ids[a]
            self._process_token(req, token, res.logprobs[j], res.top_logprobs[j], replay=j < a)
            if req.finished is not None:
                break

    def _emit(self, req: Req, error: str | None = None, internal: bool = True) -> None:
        """Queue the request's new tokens (and its end); ``error`` ends it: an internal error, or
        (``internal`` False) the request's own (its grammar could not go on)."""
        new = req.output_ids[req.sent_len:]
        out = ReqOutput(
            rid=req.rid, new_ids=new, finished=req.finished, prompt_tokens=len(req.input_ids),
            completion_tokens=len(req.output_ids), cached_tokens=req.cached_tokens,
            output_logprobs=req.output_logprobs[req.sent_len:],
            output_top_logprobs=req.output_top_logprobs[req.sent_len:], error=error,
            internal=error is not None and internal,
            first_token_at=req.first_token_at)
        if req.finished is not None:
            self._live.pop(req.rid, None)
            self._suspects.pop(req, None)
            self._strikes.pop(req, None)
        if req.wants_prompt_logprobs and not req.input_logprobs_sent and (req.finished is not None or new):
            # once, as soon as the prompt is computed (a stream's first token, e.g. to echo the
            # prompt first); aligned with input_ids[logprob_start_len:], the first prompt token
            # has no score
            out.input_logprobs = [None] * (req.logprob_start_len == 0) + req.input_logprobs
            out.input_top_logprobs = [[]] * (req.logprob_start_len == 0) + req.input_top_logprobs
            req.input_logprobs_sent = True
        req.sent_len = len(req.output_ids)
        self.outputs.append(out)

    def _reject(self, rid: str, message: str, prompt_tokens: int, internal: bool = False) -> None:
        self._live.pop(rid, None)
        self.outputs.append(ReqOutput(rid=rid, new_ids=[], finished={"type": "abort", "message": message},
                                      prompt_tokens=prompt_tokens, completion_tokens=0, cached_tokens=0,
                                      error=message, internal=internal))


def grammar_spec(p: Any):
    """The GrammarSpec of a request's output constraint (the compile cache's key)."""
    from treadle.constrained import GrammarSpec

    return GrammarSpec.from_params(regex=p.regex, json_schema=p.json_schema, choices=p.choices, ebnf=p.ebnf,
                                   structural_tag=p.structural_tag, reasoning=p.grammar_after_reasoning)


class GrammarCheck:
    """The grammars of a batch's prompts compiled before any of the batch is queued, so that
    one bad grammar refuses the batch whole (nothing of it half-run) naming each bad prompt.
    `grammars`: (index, SamplingParams) of the prompts with a grammar; the compiles go through
    `compiler` (the scheduler's: thread-safe, and its cache then serves the requests' own
    compiles). `errors` maps a bad prompt's index to the message the scheduler would give."""

    RETRIES = 3  # a compile cancelled under the check (its requests were aborted) is started again

    def __init__(self, compiler: Any, grammars: list[tuple[int, Any]]) -> None:
        self.compiler = compiler
        self.errors: dict[int, str] = {}
        self._pending: list[list] = []  # [index, spec, future, tries]
        for i, p in grammars:
            try:
                spec = grammar_spec(p)
                self._pending.append([i, spec, compiler.compile_async(spec), 1])
            except ValueError as e:
                self.errors[i] = str(e)

    def done(self) -> bool:
        """Whether every compile has settled (never blocks)."""
        still = []
        for item in self._pending:
            i, spec, fut, tries = item
            if not fut.done():
                still.append(item)
            elif fut.cancelled() and tries < self.RETRIES:
                item[2:] = [self.compiler.compile_async(spec), tries + 1]
                still.append(item)
            elif fut.cancelled():
                self.errors[i] = "grammar compilation failed: cancelled"
            elif fut.exception() is not None:
                self.errors[i] = f"grammar compilation failed: {fut.exception()}"
        self._pending = still
        return not still

    def cancel(self, needed: set) -> None:
        """Give up the check (its client left): stop the compiles of it not in `needed` (the
        futures queued requests or other checks wait for), freeing their workers at once."""
        for _, _, fut, _ in self._pending:
            if fut not in needed and not fut.done():
                self.compiler.cancel(fut)
        self._pending = []

    def futures(self) -> set:
        return {item[2] for item in self._pending}

    def wait(self) -> dict[int, str]:
        """Block until every compile has settled; returns `errors`."""
        import concurrent.futures

        while not self.done():
            concurrent.futures.wait([item[2] for item in self._pending])
        return self.errors


def _shares_uncached_prefix(ids: list[int], admitted: list[list[int]], cached: int) -> bool:
    """Whether ``ids`` shares its first ``cached`` + IN_BATCH_PREFIX_MIN tokens with one of
    ``admitted``: the window past the cached part first (one short C comparison for prompts
    that part there, as questions after a cached system prompt do), the cached part after."""
    end = cached + IN_BATCH_PREFIX_MIN
    if len(ids) < end:
        return False
    window = ids[cached:end]
    return any(a[cached:end] == window and a[:cached] == ids[:cached] for a in admitted)

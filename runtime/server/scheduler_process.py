"""The scheduler process: owns the model and the KV pool, runs `Scheduler.step()` in a loop and
pushes every step's outputs to the detokenizer.

Inputs (from the TokenizerManager): `TokenizedGenerateReq`, `AbortReq`, `ControlReq`.
Outputs (to the detokenizer): `DetokInit` before a request's first output, `ReqOutput`s, and
`ControlOut` answers (the detokenizer passes those through unchanged).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import zmq

from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.io_struct import AbortReq, ControlOut, ControlReq, TokenizedGenerateReq
from treadle.runtime.server.ipc import DetokInit, IpcPaths, parent_alive

log = logging.getLogger("treadle.scheduler")

# While idle, block on the input socket this long before re-checking that the parent lives.
IDLE_POLL_MS = 500
# How often, between steps, the scheduler sends its info() snapshot: what /metrics serves
# without waiting for a step, and the heartbeat the server's watchdog listens for.
STATS_PERIOD_S = 0.5


def run_scheduler_process(args: EngineArgs, paths: IpcPaths, conn: Connection, alive: Connection) -> None:
    """Process entry point. Reports ("ready", info) or ("error", traceback) on `conn`, then
    serves until the parent disappears. A failed batch step costs only the request that made
    it fail (`Scheduler._recover`); any other exception in the loop, or a step the
    scheduler cannot recover from, ends the process with a non-zero code (the server's
    watchdog then takes the whole server down)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # the launcher stops us with SIGTERM: unwind through `finally` so the grammar workers stop too
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(0))
    logging.basicConfig(level=args.log_level.upper(), format="[scheduler] %(levelname)s %(message)s")
    try:
        from treadle.runtime.model_runner import ModelRunner
        from treadle.runtime.scheduler import Scheduler
        from treadle.runtime.tokenizer import load_tokenizer

        tp = None
        if args.tp_size > 1:  # this process is rank 0; it starts and leads the other ranks
            from treadle.runtime.tp_worker import LeaderGroup

            tp = LeaderGroup(args)
            runner = ModelRunner(tp.args, tp.group.ctx)
            tokenizer = load_tokenizer(runner.source)
            sched = tp.make_scheduler(runner, tokenizer)
        else:
            from treadle.runtime.fault_injection import install_forward_faults, install_poison

            runner = ModelRunner(args)
            install_forward_faults(runner)  # tests only: a no-op unless TREADLE_FAULT_FORWARD_CALLS is set
            tokenizer = load_tokenizer(runner.source)
            sched = Scheduler(args, runner, tokenizer)
            install_poison(sched, tokenizer)  # tests only: a no-op unless TREADLE_FAULT_POISON_MARKER is set
        ctx = zmq.Context(1)
        pull = ctx.socket(zmq.PULL)
        pull.bind(paths.scheduler_in)
        push = ctx.socket(zmq.PUSH)
        push.connect(paths.detokenizer_in)
    except BaseException:
        # the launcher prints this traceback in its start-up error; exit without repeating it
        conn.send(("error", traceback.format_exc()))
        sys.exit(1)
    conn.send(("ready", {
        "pid": os.getpid(),
        "vocab_size": runner.config.vocab_size,
        "context_len": runner.context_len,
        "num_slots": runner.allocator.num_slots,
        "max_running": runner.max_running,
        "model_path": runner.source.path,
        "model_kind": runner.source.kind,
        "architecture": runner.config.architecture,
        "model_load_s": round(runner.load_s, 3),
        "quantization": runner.quantization.describe() if runner.quantization else None,
        "stats": {**sched.info(), "pid": os.getpid()},  # the first snapshot (see STATS_PERIOD_S)
    }))
    conn.close()
    healthy = False
    try:
        _loop(sched, pull, push, alive, tp)
        healthy = True
    finally:
        if sched._grammar_compiler is not None:
            sched._grammar_compiler.close()
        if tp is not None:
            tp.close(healthy=healthy)
        pull.close(linger=0)
        push.close(linger=0)
        ctx.term()


def _loop(sched: Any, pull: zmq.Socket, push: zmq.Socket, alive: Connection, tp: Any = None) -> None:
    from treadle.runtime.scheduler import GRAMMAR_POLL_S

    grammar_poll_ms = int(GRAMMAR_POLL_S * 1000)
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    last_stats = 0.0
    checks: list = []  # check_grammars requests whose compiles run: (ControlReq, GrammarCheck)
    while True:
        # busy: take whatever arrived without waiting; idle: sleep on the socket
        # (only grammars compiling: look again shortly)
        timeout = 0 if sched.has_runnable_work() else grammar_poll_ms if sched.has_work() or checks \
            else IDLE_POLL_MS
        to_send: list = []
        arrived = False
        if poller.poll(timeout):
            while True:
                try:
                    msgs = pull.recv_pyobj(zmq.NOBLOCK)
                except zmq.Again:
                    break
                for msg in msgs:
                    arrived |= isinstance(msg, TokenizedGenerateReq)
                    _handle(sched, msg, to_send, checks)
        elif not sched.has_work() and not checks:
            if not parent_alive(alive):
                log.info("parent process is gone; exiting")
                return
            if tp is not None:  # idle: make sure the other ranks are still there
                tp.heartbeat()
        # sent before a step that may be long, and as requests arrive (their long prefill then
        # shows as queued, not as an idle server)
        if arrived or time.monotonic() - last_stats >= STATS_PERIOD_S:
            last_stats = time.monotonic()
            to_send.append(ControlOut("stats", 0, {**sched.info(), "pid": os.getpid()}))
            push.send_pyobj(to_send)
            to_send = []
        if checks:  # answered once all their compiles have settled
            settled = [c for c in checks if c[1].done()]
            checks[:] = [c for c in checks if c not in settled]
            to_send.extend(ControlOut(m.kind, m.req_id, {"errors": c.errors}) for m, c in settled)
        if sched.has_work():
            to_send.extend(sched.step())
        else:  # aborts of waiting requests and rejections are emitted without a step
            to_send.extend(sched.outputs)
            sched.outputs = []
        if to_send:
            push.send_pyobj(to_send)


def _handle(sched: Any, msg: object, to_send: list, checks: list) -> None:
    if isinstance(msg, TokenizedGenerateReq):
        to_send.append(DetokInit.of(msg.rid, msg.sampling_params))
        sched.add_request(msg)
    elif isinstance(msg, AbortReq):
        sched.abort(msg.rid)
    elif isinstance(msg, ControlReq) and msg.kind == "cancel_check_grammars":  # its client left
        gone = [c for c in checks if c[0].req_id == msg.payload]
        for c in gone:
            checks.remove(c)
            needed = {r.grammar_future for r in sched.grammar_queue}.union(*(o.futures() for _, o in checks))
            c[1].cancel(needed)
    elif isinstance(msg, ControlReq) and msg.kind == "check_grammars":
        from treadle.runtime.scheduler import GrammarCheck

        try:  # the compiles start now; the answer waits for them (see _loop), the steps do not
            checks.append((msg, GrammarCheck(sched.grammar_compiler, msg.payload)))
        except ValueError as e:  # no compiler (a model without a tokenizer): every grammar's error
            to_send.append(ControlOut(msg.kind, msg.req_id, {"errors": {i: str(e) for i, _ in msg.payload}}))
        except Exception as e:  # noqa: BLE001 - reported back; the scheduler keeps serving
            log.exception("control request %s failed", msg.kind)
            to_send.append(ControlOut(msg.kind, msg.req_id, {"error": f"{type(e).__name__}: {e}"}))
    elif isinstance(msg, ControlReq):
        to_send.append(ControlOut(msg.kind, msg.req_id, _control(sched, msg.kind)))
    else:
        raise TypeError(f"scheduler got an unexpected message {type(msg).__name__}")


def _control(sched: Any, kind: str) -> object:
    """Answer a control request; failures are returned as {"error": ...} to the caller."""
    try:
        if kind == "flush_cache":
            return {"success": sched.flush_cache()}
        if kind == "get_info":
            return {**sched.info(), "pid": os.getpid()}
        if kind == "check_integrity":
            sched.check_integrity()
            return {"ok": True}
        return {"error": f"unknown control request {kind!r}"}
    except Exception as e:  # reported back over HTTP; the scheduler keeps serving
        log.exception("control request %s failed", kind)
        return {"error": f"{type(e).__name__}: {e}"}

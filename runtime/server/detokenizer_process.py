"""The detokenizer process: turns the scheduler's token ids into text deltas.

One `IncrementalDetokenizer` per live request, created from the request's `DetokInit` and
dropped at its finished output. `ControlOut` answers pass through unchanged.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection

import zmq

from treadle.runtime.detokenizer import IncrementalDetokenizer
from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.io_struct import ControlOut, ReqOutput
from treadle.runtime.server.ipc import DetokInit, IpcPaths, StrOutput, parent_alive

log = logging.getLogger("treadle.detokenizer")

IDLE_POLL_MS = 500


class DetokenizerManager:
    """The I/O-free part: feed it scheduler messages, get back messages for the HTTP side."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}

    def handle(self, msgs: list) -> list:
        out: list = []
        for msg in msgs:
            if isinstance(msg, DetokInit):
                self.states[msg.rid] = IncrementalDetokenizer.for_params(self.tokenizer, msg)
            elif isinstance(msg, ReqOutput):
                out.append(self._detok(msg))
            elif isinstance(msg, ControlOut):
                out.append(msg)
            else:
                raise TypeError(f"detokenizer got an unexpected message {type(msg).__name__}")
        return out

    def _detok(self, r: ReqOutput) -> StrOutput:
        if self.tokenizer is None:  # a dummy model without a tokenizer: ids only
            return StrOutput(r, "")
        state = self.states.get(r.rid)
        if state is None:  # defensive: an output whose init we never saw renders with defaults
            log.warning("output for unknown request %s; using default detokenization", r.rid)
            state = self.states[r.rid] = IncrementalDetokenizer(self.tokenizer)
        delta = state.add(r.new_ids, r.finished)
        if r.finished is not None:
            del self.states[r.rid]
        return StrOutput(r, delta)


def run_detokenizer_process(args: EngineArgs, paths: IpcPaths, conn: Connection, alive: Connection) -> None:
    """Process entry point: load the tokenizer, report ready on `conn`, then serve until the
    parent disappears."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=args.log_level.upper(), format="[detokenizer] %(levelname)s %(message)s")
    try:
        from treadle.runtime.model_source import resolve_model_source
        from treadle.runtime.tokenizer import load_tokenizer

        manager = DetokenizerManager(load_tokenizer(resolve_model_source(args.model_path, tokenizer_path=args.tokenizer_path)))
        ctx = zmq.Context(1)
        pull = ctx.socket(zmq.PULL)
        pull.bind(paths.detokenizer_in)
        push = ctx.socket(zmq.PUSH)
        push.connect(paths.tokenizer_in)
    except BaseException:
        # the launcher prints this traceback in its start-up error; exit without repeating it
        conn.send(("error", traceback.format_exc()))
        sys.exit(1)
    conn.send(("ready", {"pid": os.getpid()}))
    conn.close()
    try:
        while True:
            if not pull.poll(IDLE_POLL_MS):
                if not parent_alive(alive):
                    log.info("parent process is gone; exiting")
                    return
                continue
            out = manager.handle(pull.recv_pyobj())
            if out:
                push.send_pyobj(out)
    finally:
        pull.close(linger=0)
        push.close(linger=0)
        ctx.term()

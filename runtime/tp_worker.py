"""Tensor parallelism for the scheduler: every rank runs the same Scheduler over its shard of
the model, and rank 0 decides.

Rank 0 (the Engine's scheduler thread) receives requests. Before each step it sends what
changed since the last one to every follower (tp_control.py: queued on ZMQ sockets, so rank 0
does not wait for them):

    StepInputs(ops=[("add", req, arrival) | ("abort", rid) | ("flush",)], ready, starved, run_step, stop)

Followers (ranks 1..tp_size-1, `follow`) apply the ops in the same order and run the same
step, so all ranks admit, retract and sample alike (sampling is a function of (seed, step)
and of logits that are identical after the all-gather) and their collectives line up. Only
rank 0's outputs leave the group. The two scheduler decisions that read a clock or a
background thread, "which grammar compiles finished" and "which requests are starved", are
made by rank 0 and shipped in `ready` / `starved`.

While idle, rank 0 sends a heartbeat (run_step=False) every few seconds, so followers waiting
for a message do not hit their timeout; rank 0 checks that its local followers are alive
while idle and at most every 0.1 s while stepping.
Other nodes (nnodes > 1) run `python -m treadle.runtime.tp_worker --node-rank N ...`.
"""
from __future__ import annotations

import argparse
import logging
import math
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from treadle.runtime.distributed import (
    check_tp_config, destroy_tp_group, free_port, init_tp_group, local_ranks, parse_addr,
)
from treadle.runtime.engine_args import EngineArgs
from treadle.runtime.io_struct import TokenizedGenerateReq
from treadle.runtime.model_runner import ModelRunner
from treadle.runtime.scheduler import Scheduler
from treadle.runtime.tp_control import ControlReceiver, ControlSender

log = logging.getLogger("treadle")

_FAR = 1e9  # seconds: pushes a starved request's arrival far enough back to count as starved


@dataclass
class StepInputs:
    ops: list[tuple] = field(default_factory=list)
    ready: dict[str, bool] = field(default_factory=dict)  # rid -> rank 0's grammar compile succeeded
    starved: set[str] = field(default_factory=set)
    run_step: bool = False
    stop: bool = False


class TPScheduler(Scheduler):
    """A Scheduler that keeps its followers in lockstep (rank 0) or follows rank 0."""

    def __init__(self, args: EngineArgs, runner: ModelRunner, tokenizer: Any, control: object) -> None:
        super().__init__(args, runner, tokenizer)
        self.ctx = runner.ctx
        self.leader = self.ctx.rank == 0
        host, _ = parse_addr(args.dist_init_addr)
        self.channel = (ControlSender(control, args.tp_size, host, args.nnodes, args.dist_timeout_s) if self.leader
                        else ControlReceiver(control, self.ctx.rank, args.dist_timeout_s))
        self._peers_checked = 0.0
        self._ops: list[tuple] = []  # rank 0: mutations since the last broadcast, in order
        self._ready: dict[str, bool] = {}
        self._starved: set[str] = set()
        self._arrival: float | None = None  # add_request <-> _make_req hand-off
        self.check_peers: Callable[[], None] | None = None  # rank 0: raises naming a dead follower

    # ---- mutations: rank 0 records them, followers replay them

    def add_request(self, r: TokenizedGenerateReq) -> None:
        if not self.leader:  # followers get requests only through sync()
            return super().add_request(r)
        self._arrival = None
        super().add_request(r)
        self._ops.append(("add", r, self._arrival))  # rejected ones too: the rejection replays alike

    def _make_req(self, r: TokenizedGenerateReq):
        req = super()._make_req(r)
        if self.leader:
            self._arrival = req.arrival
        elif self._arrival is not None:
            req.arrival = self._arrival  # rank 0's clock: `starved` is judged against it
        return req

    def abort(self, rid: str) -> bool:
        if self.leader:
            self._ops.append(("abort", rid))
        return super().abort(rid)

    def flush_cache(self) -> bool:
        if self.leader:
            self._ops.append(("flush",))
        return super().flush_cache()

    # ---- the broadcast

    def sync(self, run_step: bool = False, stop: bool = False) -> StepInputs:
        """Rank 0: send the pending ops and this step's decisions (without waiting for the
        followers, tp_control.py). Followers: receive and apply them (waiting at most
        dist_timeout_s)."""
        if self.leader:
            now = time.monotonic()
            if self.check_peers is not None and now - self._peers_checked > 0.1:
                self.check_peers()  # a dead follower would otherwise show as a hung collective
                self._peers_checked = now
            bound = self.args.starvation_bound_s
            msg = StepInputs(self._ops, run_step=run_step, stop=stop)
            msg.ready = {r.rid: not r.grammar_future.cancelled() and r.grammar_future.exception() is None
                         for r in self.grammar_queue
                         if r.grammar_future.done()}
            msg.starved = {r.rid for q in (self.waiting, self.grammar_queue) for r in q if now - r.arrival > bound}
            self._ops = []
            self.channel.send(msg, check=self.check_peers)
        else:
            msg = self.channel.recv()
            for op in msg.ops:
                if op[0] == "add":
                    self._arrival = op[2]
                    super().add_request(op[1])
                    self._arrival = None
                elif op[0] == "abort":
                    super().abort(op[1])
                else:
                    super().flush_cache()
        self._ready, self._starved = msg.ready, msg.starved
        return msg

    def step(self):
        if not self.leader:
            return super().step()
        try:
            self.sync(run_step=True)
            return super().step()
        except Exception as e:  # a collective failed: name the dead rank when one is known
            if self.check_peers is not None:
                time.sleep(0.2)  # a crashed peer's socket closes before its process is reaped
                try:
                    self.check_peers()
                except RuntimeError as dead:
                    raise dead from e
            raise

    # ---- rank 0's decisions replace the clock and the compile threads

    def _poll_grammars(self) -> None:
        if not self.grammar_queue:
            return
        still = []
        for req in self.grammar_queue:
            if req.rid not in self._ready:
                still.append(req)
                continue
            fut, req.grammar_future = req.grammar_future, None
            if not self._ready[req.rid]:
                err = ("cancelled" if fut.cancelled() else fut.exception()) if self.leader else "failed on rank 0"
                self._reject(req.rid, f"grammar compilation failed: {err}", len(req.input_ids))
                continue
            try:  # a follower may still be compiling what rank 0 has
                grammar = fut.result(timeout=self.args.grammar_compile_timeout_s + 30)
            except Exception as e:
                raise RuntimeError(f"rank {self.ctx.rank}: grammar compile failed where rank 0's "
                                   f"succeeded ({e!r}); ranks would diverge") from e
            req.grammar = grammar.matcher()
            self.waiting.append(req)
        self.grammar_queue = still

    def _schedule_prefill(self):
        # order_waiting reads time.monotonic(): pin every arrival so that exactly rank 0's
        # starved set counts as starved (keeping their order), on every rank
        saved = [(r, r.arrival) for r in self.waiting]
        for r, a in saved:
            r.arrival = a - _FAR if r.rid in self._starved else math.inf
        try:
            return super()._schedule_prefill()
        finally:
            for r, a in saved:
                r.arrival = a


def follow(sched: TPScheduler) -> None:
    """A follower's loop: replay rank 0's steps until it says stop."""
    while True:
        msg = sched.sync()
        if msg.stop:
            return
        if msg.run_step:
            sched.step()
            sched.outputs = []  # only rank 0 reports


# ================================================================== processes


def _worker_main(args: EngineArgs, rank: int, status: Any) -> None:
    """Entry of a spawned follower: join the group, load this rank's shard, follow."""
    from treadle.runtime.tokenizer import load_tokenizer

    if args.device in ("cpu", "auto") and not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // (args.tp_size // args.nnodes)))
    sched = None
    try:
        from treadle.runtime.model_runner import resolve_device

        group = init_tp_group(rank, args, resolve_device(args.device).type)
        runner = ModelRunner(args, group.ctx)
        sched = TPScheduler(args, runner, load_tokenizer(runner.source), group.control)
        status.put((rank, None))
        follow(sched)
    except BaseException as e:
        status.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise
    finally:
        if sched is not None and sched._grammar_compiler is not None:
            sched._grammar_compiler.close()
        if sched is not None:
            sched.runner.release_graphs()
            sched.channel.close()
        destroy_tp_group()


class Followers:
    """The follower processes this node runs (spawn context, daemon)."""

    def __init__(self, args: EngineArgs, ranks: list[int]) -> None:
        ctx = mp.get_context("spawn")
        self.status = ctx.Queue()
        self.procs = {r: ctx.Process(target=_worker_main, args=(args, r, self.status), daemon=True,
                                     name=f"treadle-tp{r}") for r in ranks}
        for p in self.procs.values():
            p.start()
        self.errors: dict[int, str] = {}
        self.ready: set[int] = set()

    def _drain(self) -> None:
        while True:
            try:
                rank, err = self.status.get_nowait()
            except queue.Empty:
                return
            if err is None:
                self.ready.add(rank)
            else:
                self.errors[rank] = err

    def check(self) -> None:
        """Raise RuntimeError if a follower reported an error or exited."""
        self._drain()
        for rank, p in self.procs.items():
            if rank in self.errors or not p.is_alive():
                why = self.errors.get(rank) or f"exited with code {p.exitcode}"
                raise RuntimeError(f"tensor-parallel worker rank {rank} (pid {p.pid}) died: {why}")

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            if self.ready >= set(self.procs):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel workers {sorted(set(self.procs) - self.ready)} "
                                   f"not ready after {timeout_s:g}s")
            time.sleep(0.05)

    def kill(self) -> None:
        """Kill every follower now, without waiting (join reaps them later)."""
        for p in self.procs.values():
            if p.is_alive():
                p.kill()

    def join(self, timeout_s: float) -> None:
        """Wait for the processes to exit; kill those that do not in time."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(5)
        self.status.close()


class LeaderGroup:
    """Rank 0's side, owned by the Engine: start followers, join the group, heartbeat, stop."""

    def __init__(self, args: EngineArgs) -> None:
        from treadle.runtime.model_runner import resolve_device
        from treadle.runtime.model_source import resolve_model_source

        if args.node_rank != 0:
            raise ValueError(f"the Engine runs on node 0; node {args.node_rank} runs "
                             "`python -m treadle.runtime.tp_worker` with the same flags")
        check_tp_config(resolve_model_source(args.model_path).config, args.tp_size)
        if args.dist_init_addr is not None:
            parse_addr(args.dist_init_addr)  # a malformed address fails before anything starts
        else:
            args = args.replace(dist_init_addr=f"127.0.0.1:{free_port()}")
        self.args = args
        self.heartbeat_s = min(5.0, args.dist_timeout_s / 4)
        self.followers = Followers(args, [r for r in local_ranks(args) if r != 0])
        self.scheduler: TPScheduler | None = None
        # join in a thread, so that a follower dying at startup fails us now, not at the timeout.
        # A follower can die just after the group formed, before the thread has returned: the
        # group it joined is then left (under `lock`, by whichever of the two comes second), so a
        # failed start never leaves this process in a group no later Engine could replace
        joined: dict[str, Any] = {}
        lock = threading.Lock()

        def rendezvous() -> None:
            try:
                group = init_tp_group(0, args, resolve_device(args.device).type)
            except BaseException as e:
                joined["error"] = e
                return
            with lock:
                if joined.get("abandoned"):
                    destroy_tp_group()
                else:
                    joined["group"] = group

        t = threading.Thread(target=rendezvous, name="treadle-tp-rendezvous", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.1)
            try:
                self.followers.check()
            except RuntimeError:
                self.followers.join(0.0)
                with lock:
                    joined["abandoned"] = True
                    if "group" in joined:
                        destroy_tp_group()
                raise
        if "error" in joined:
            self._fail_start(joined["error"])
        self.group = joined["group"]

    def make_scheduler(self, runner: ModelRunner, tokenizer: Any) -> TPScheduler:
        self.scheduler = TPScheduler(self.args, runner, tokenizer, self.group.control)
        self.scheduler.check_peers = self.followers.check
        self.followers.wait_ready(self.args.dist_timeout_s)
        return self.scheduler

    def _fail_start(self, e: BaseException) -> None:
        """Startup failed on rank 0: prefer a follower's own error, which is usually the cause."""
        try:
            time.sleep(0.5)
            self.followers.check()
        except RuntimeError as worker_err:
            self.close(healthy=False)
            raise worker_err from e
        self.close(healthy=False)
        raise e

    def heartbeat(self) -> None:
        """Called by the idle engine thread every heartbeat_s."""
        self.followers.check()
        assert self.scheduler is not None
        self.scheduler.sync()

    def close(self, healthy: bool) -> None:
        """Stop the followers: a stop message when the group still works, then join (killing
        stragglers), then leave the group."""
        if healthy and self.scheduler is not None:
            try:
                self.followers.check()
                self.scheduler.sync(stop=True)
            except Exception as e:
                log.warning("tensor-parallel stop message failed (%r); killing the workers", e)
                healthy = False
        if self.scheduler is not None:
            self.scheduler.channel.close(flush_s=5.0 if healthy else 0.0)
        self.followers.join(10.0 if healthy else 0.0)
        destroy_tp_group()


# ================================================================== other nodes


def main(argv: list[str] | None = None) -> None:
    """Run this node's ranks of a multi-node TP group (node_rank > 0) until rank 0 stops."""
    parser = argparse.ArgumentParser(description="treadle tensor-parallel worker node")
    EngineArgs.add_cli_args(parser)
    args = EngineArgs.from_cli_args(parser.parse_args(argv))
    if args.node_rank == 0:
        raise SystemExit("node 0 runs the Engine (or `treadle serve`); start this on nodes 1..nnodes-1")
    followers = Followers(args, list(local_ranks(args)))
    while any(p.is_alive() for p in followers.procs.values()):
        followers._drain()
        if followers.errors:
            followers.join(0.0)
            raise SystemExit(next(iter(followers.errors.values())))
        time.sleep(0.5)
    followers.join(0.0)


if __name__ == "__main__":
    main()

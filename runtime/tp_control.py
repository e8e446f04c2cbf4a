"""Rank 0's per-step control messages to the other tensor-parallel ranks, over ZMQ.

Before every step rank 0 tells the followers what changed (tp_worker.StepInputs). Sent as a
collective (gloo's broadcast_object_list: two broadcasts, 0.45 ms on the 2-core dev box), that
made each step a host barrier that rank 0's next launch waited on. Here rank 0 owns one PUSH
socket per follower: a send only queues the pickled message and rank 0 goes on to launch its
step, while each follower reads the messages in order. The model's collectives (all-reduce,
all-gather) still keep every rank within a step of the others, so the queues stay short.

The endpoints are handed out once, at startup, over the gloo control group. Every wait is
bounded by dist_timeout_s: rank 0 heartbeats while idle, so a follower that hears nothing for
that long knows rank 0 is gone.
"""
from __future__ import annotations

import pickle
import time
from typing import Callable

import torch.distributed as dist
import zmq


class ControlSender:
    """Rank 0's end. `host` is the address the followers reach rank 0 at (the rendezvous host)."""

    def __init__(self, group: object, tp_size: int, host: str, nnodes: int, timeout_s: float) -> None:
        self._zmq = zmq.Context(1)
        self.socks = []
        endpoints = []
        bind = "tcp://127.0.0.1" if nnodes == 1 else "tcp://*"
        for _ in range(1, tp_size):
            s = self._zmq.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            port = s.bind_to_random_port(bind)
            endpoints.append(f"tcp://{'127.0.0.1' if nnodes == 1 else host}:{port}")
            self.socks.append(s)
        dist.broadcast_object_list([endpoints], src=0, group=group)
        self.timeout_s = timeout_s

    def send(self, msg: object, check: Callable[[], None] | None = None) -> None:
        """Queue `msg` for every follower. A follower whose queue takes nothing (it is gone,
        or not yet connected) is waited for up to timeout_s, calling `check` (which raises
        naming a dead follower) every half second meanwhile."""
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        for rank, s in enumerate(self.socks, start=1):
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:  # never a blocking send: the follower may vanish between a poll and a send
                    s.send(data, zmq.NOBLOCK, copy=False)
                    break
                except zmq.Again:
                    pass
                if check is not None:
                    check()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel rank {rank} took no control message for "
                                       f"{self.timeout_s:g}s (dist_timeout_s)")
                s.poll(500, zmq.POLLOUT)

    def close(self, flush_s: float = 0.0) -> None:
        """Close the sockets, first giving queued messages (the stop) up to `flush_s` to leave."""
        for s in self.socks:
            s.setsockopt(zmq.LINGER, int(flush_s * 1000))
            s.close()
        self._zmq.term()


class ControlReceiver:
    """A follower's end: messages from rank 0 in the order they were sent."""

    def __init__(self, group: object, rank: int, timeout_s: float) -> None:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        self._zmq = zmq.Context(1)
        self.sock = self._zmq.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(box[0][rank - 1])
        self.rank = rank
        self.timeout_s = timeout_s

    def recv(self) -> object:
        if not self.sock.poll(int(self.timeout_s * 1000)):
            raise RuntimeError(f"tensor-parallel rank {self.rank} heard nothing from rank 0 for "
                               f"{self.timeout_s:g}s (dist_timeout_s): is it alive?")
        return pickle.loads(self.sock.recv(copy=False).buffer)

    def close(self) -> None:
        self.sock.close()
        self._zmq.term()

"""IPC plumbing between the server's processes: ZMQ socket addresses, the ready handshake and
the messages that only exist on the server path.

Topology (every arrow is a ZMQ PUSH -> PULL over an `ipc://` socket; the PULL side binds):

    HTTP process (TokenizerManager) --> scheduler --> detokenizer --> HTTP process

Objects cross as pickled dataclasses (`send_pyobj`), always a list per message so one
ZMQ frame carries a whole scheduler step.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from treadle.runtime.io_struct import ReqOutput


@dataclass(frozen=True)
class IpcPaths:
    """The three `ipc://` endpoints, inside a private temp dir the launcher removes at exit."""
    root: str
    scheduler_in: str
    detokenizer_in: str
    tokenizer_in: str

    @classmethod
    def create(cls) -> "IpcPaths":
        # /tmp paths stay well under the 107-byte unix socket name limit
        root = tempfile.mkdtemp(prefix="treadle-ipc-")
        return cls(root, f"ipc://{root}/sched", f"ipc://{root}/detok", f"ipc://{root}/tok")

    def cleanup(self) -> None:
        """Remove the socket files and the dir (only what we created)."""
        for name in ("sched", "detok", "tok"):
            path = os.path.join(self.root, name)
            if os.path.exists(path):
                os.unlink(path)
        if os.path.isdir(self.root):
            os.rmdir(self.root)


@dataclass(slots=True)
class DetokInit:
    """Scheduler -> detokenizer, sent on the same socket before any output of `rid`, so the
    detokenizer knows how to render it (ZMQ keeps per-socket order)."""
    rid: str
    skip_special_tokens: bool
    stop: list[str]
    no_stop_trim: bool
    spaces_between_special_tokens: bool
    min_new_tokens: int = 0  # stop strings count only from there (IncrementalDetokenizer)
    include_stop_str_in_output: bool = False  # the text ends right after a matched stop string (vLLM's)

    @classmethod
    def of(cls, rid: str, p: Any) -> "DetokInit":
        """The rendering fields of SamplingParams `p` (IncrementalDetokenizer.for_params reads them)."""
        return cls(rid, p.skip_special_tokens, list(p.stop), p.no_stop_trim, p.spaces_between_special_tokens,
                   p.min_new_tokens, p.include_stop_str_in_output)


@dataclass(slots=True)
class StrOutput:
    """Detokenizer -> TokenizerManager: a scheduler output plus the text it adds."""
    out: ReqOutput
    text_delta: str


def parent_alive(alive: Connection) -> bool:
    """Whether the launching process still exists: children exit on their own when it is gone
    (e.g. SIGKILLed), instead of lingering as orphans holding memory. `alive` is the read end of
    a pipe whose write end only the launcher holds and never writes to: it reads as EOF (poll()
    is true) once the launcher has exited, however it ended. (The parent pid cannot tell: the
    children's parent is multiprocessing's fork server, which outlives the launcher while they
    run.)"""
    return not alive.poll()

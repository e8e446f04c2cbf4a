"""Test-only fault injection, for the failure paths of the real server processes.

``TREADLE_FAULT_FORWARD_CALLS="2,4"`` makes the model runner's 2nd and 4th forward calls
raise, so a failed batch step (the scheduler's recovery, an HTTP 500 or an SSE error event for
the requests of that step, the server serving on) can be exercised end to end, where no test
can reach into the scheduler process. ``TREADLE_FAULT_SLOW_FORWARD="1:12"`` makes forward
call 1 sleep 12 s first: a step longer than any timeout around it (the shutdown drain).
``TREADLE_FAULT_HOLD_TOKENIZE=<path>`` makes the server's tokenizer wait, for a text that
contains ``HOLD_MARKER``, until a file exists at ``<path>`` (it creates ``<path>.held`` as it
starts waiting): a tokenization as long as the test wants, to show that nothing else waits for it.
``TREADLE_FAULT_RECV_CALLS="3"`` makes the server's 3rd receive that carries request output
raise: its output loop fails (the server must then exit, not leave every request waiting).
Unset (the normal case), nothing is wrapped.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

__all__ = ["FAULT_ENV", "HOLD_ENV", "HOLD_MARKER", "RECV_ENV", "SLOW_ENV", "install_forward_faults",
           "install_recv_fault", "install_tokenize_hold"]

FAULT_ENV = "TREADLE_FAULT_FORWARD_CALLS"
SLOW_ENV = "TREADLE_FAULT_SLOW_FORWARD"
HOLD_ENV = "TREADLE_FAULT_HOLD_TOKENIZE"
HOLD_MARKER = "treadle-hold-tokenize"
RECV_ENV = "TREADLE_FAULT_RECV_CALLS"
HOLD_MAX_S = 300.0
log = logging.getLogger(__name__)


def install_forward_faults(runner: Any, spec: str | None = None) -> bool:
    """Wrap ``runner.forward`` to raise at the 1-based call numbers in ``spec`` (default: the
    environment variable); returns whether it did. Raises ``ValueError`` on a bad spec."""
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    slow = os.environ.get(SLOW_ENV, "")
    if not spec.strip() and not slow.strip():
        return False
    try:
        calls = {int(x) for x in spec.split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"{FAULT_ENV} must be comma-separated forward call numbers, got {spec!r}") from None
    if calls and min(calls) < 1:
        raise ValueError(f"{FAULT_ENV} call numbers start at 1, got {spec!r}")
    try:
        slow_call, slow_s = (int(slow.split(":")[0]), float(slow.split(":")[1])) if slow.strip() else (0, 0.0)
    except (ValueError, IndexError):
        raise ValueError(f"{SLOW_ENV} must be '<call>:<seconds>', got {slow!r}") from None
    real = runner.forward
    count = [0]

    def forward(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if count[0] in calls:
            raise RuntimeError(f"injected fault ({FAULT_ENV}) at forward call {count[0]}")
        if count[0] == slow_call:
            time.sleep(slow_s)
        return real(*args, **kwargs)

    runner.forward = forward
    log.warning("fault injection for tests: forward calls %s raise; call %s sleeps %gs", sorted(calls), slow_call,
                slow_s)
    return True


def install_tokenize_hold(tokenizer: Any) -> bool:
    """Wrap ``tokenizer.encode`` so that a text containing HOLD_MARKER waits (at most
    HOLD_MAX_S) for the file named by the environment variable; returns whether it did."""
    path = os.environ.get(HOLD_ENV, "")
    if not path or tokenizer is None:
        return False
    real = tokenizer.encode

    def encode(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str) and HOLD_MARKER in text:
            open(path + ".held", "w").close()  # tells the test the hold has begun
            deadline = time.monotonic() + HOLD_MAX_S
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.02)
        return real(text, *args, **kwargs)

    tokenizer.encode = encode
    log.warning("fault injection for tests: texts containing %r wait for %s before tokenizing", HOLD_MARKER, path)
    return True


def install_recv_fault(tm: Any) -> bool:
    """Wrap the TokenizerManager's output socket so that its receive number ``RECV_ENV`` among
    those carrying request output (not the scheduler's stats) raises; returns whether it did."""
    spec = os.environ.get(RECV_ENV, "").strip()
    if not spec:
        return False
    if not spec.isdigit() or int(spec) < 1:
        raise ValueError(f"{RECV_ENV} must be a receive number >= 1, got {spec!r}")
    nth, count, sock = int(spec), [0], tm._pull
    real = sock.recv_pyobj

    async def recv_pyobj(*args: Any, **kwargs: Any) -> Any:
        msgs = await real(*args, **kwargs)
        if any(type(m).__name__ == "StrOutput" for m in msgs):
            count[0] += 1
            if count[0] == nth:
                raise RuntimeError(f"injected fault ({RECV_ENV}) at output receive {nth}")
        return msgs

    sock.recv_pyobj = recv_pyobj
    log.warning("fault injection for tests: output receive %d raises", nth)
    return True

"""Test-only fault injection, for the failure paths of the real server processes.

``TREADLE_FAULT_FORWARD_CALLS="2,4"`` makes the model runner's 2nd and 4th forward calls
raise, so a failed batch step (the scheduler's recovery: the step's requests run again, a
fault that does not recur costing none of them; the server serving on) can be exercised end
to end, where no test can reach into the scheduler process. Every forward from a call on
(``"3-"``) failing is a broken model: the scheduler must then give up and the server exit.
``TREADLE_FAULT_SLOW_FORWARD="1:12"`` makes forward call 1 sleep 12 s first: a step longer
than any timeout around it (the shutdown drain).
``TREADLE_FAULT_HOLD_TOKENIZE=<path>`` makes the server's tokenizer wait, for a text that
contains ``HOLD_MARKER``, until a file exists at ``<path>`` (it creates ``<path>.held`` as it
starts waiting): a tokenization as long as the test wants, to show that nothing else waits for it.
``TREADLE_FAULT_RECV_CALLS="3"`` makes the server's 3rd receive that carries request output
raise: its output loop fails (the server must then exit, not leave every request waiting).
``TREADLE_FAULT_POISON_MARKER=<text>`` makes every batch step that computes tokens for a request
whose prompt contains ``<text>`` raise (``<text>@<k>``: once the request has k output tokens): a
request that makes every step it is in fail, wherever and beside whatever it runs, as one that
trips a bug does; the requests beside it must not be hurt (scheduler._recover).
Unset (the normal case), nothing is wrapped; no client can set any of these.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

__all__ = ["FAULT_ENV", "HOLD_ENV", "HOLD_MARKER", "POISON_ENV", "RECV_ENV", "SLOW_ENV", "install_forward_faults",
           "install_poison", "install_recv_fault", "install_tokenize_hold"]

FAULT_ENV = "TREADLE_FAULT_FORWARD_CALLS"
SLOW_ENV = "TREADLE_FAULT_SLOW_FORWARD"
HOLD_ENV = "TREADLE_FAULT_HOLD_TOKENIZE"
HOLD_MARKER = "treadle-hold-tokenize"
RECV_ENV = "TREADLE_FAULT_RECV_CALLS"
POISON_ENV = "TREADLE_FAULT_POISON_MARKER"
HOLD_MAX_S = 300.0
log = logging.getLogger(__name__)


def install_forward_faults(runner: Any, spec: str | None = None) -> bool:
    """Wrap ``runner.forward`` to raise at the 1-based call numbers in ``spec`` (default: the
    environment variable); returns whether it did. Raises ``ValueError`` on a bad spec."""
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    slow = os.environ.get(SLOW_ENV, "")
    if not spec.strip() and not slow.strip():
        return False
    items = [x.strip() for x in spec.split(",") if x.strip()]
    try:  # "N-": every call from N on
        calls = {int(x) for x in items if not x.endswith("-")}
        from_call = min((int(x[:-1]) for x in items if x.endswith("-")), default=None)
    except ValueError:
        raise ValueError(f"{FAULT_ENV} must be comma-separated forward call numbers (or 'N-'), got {spec!r}") from None
    if min(calls | ({from_call} if from_call is not None else set()), default=1) < 1:
        raise ValueError(f"{FAULT_ENV} call numbers start at 1, got {spec!r}")
    try:
        slow_call, slow_s = (int(slow.split(":")[0]), float(slow.split(":")[1])) if slow.strip() else (0, 0.0)
    except (ValueError, IndexError):
        raise ValueError(f"{SLOW_ENV} must be '<call>:<seconds>', got {slow!r}") from None
    real = runner.forward
    count = [0]

    def forward(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if count[0] in calls or (from_call is not None and count[0] >= from_call):
            raise RuntimeError(f"injected fault ({FAULT_ENV}) at forward call {count[0]}")
        if count[0] == slow_call:
            time.sleep(slow_s)
        return real(*args, **kwargs)

    runner.forward = forward
    log.warning("fault injection for tests: forward calls %s (and from %s on) raise; call %s sleeps %gs",
                sorted(calls), from_call, slow_call, slow_s)
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


def install_poison(sched: Any, tokenizer: Any) -> bool:
    """Wrap ``sched.runner.forward`` to raise in a step computing tokens for a request whose
    prompt (decoded) contains the marker of POISON_ENV; ``<marker>@<k>`` in the prompt waits
    for k output tokens. Returns whether it did."""
    import re

    marker = os.environ.get(POISON_ENV, "")
    if not marker or tokenizer is None:
        return False
    pattern = re.compile(re.escape(marker) + r"(?:@(\d+))?")
    after: dict[tuple[str, int], int | None] = {}  # (rid, prompt length) -> output tokens to wait for
    real = sched.runner.forward

    def poisoned_after(req: Any) -> int | None:
        key = (req.rid, len(req.input_ids))
        if key not in after:
            if len(after) > 10_000:
                after.clear()
            m = pattern.search(tokenizer.decode(req.input_ids))
            after[key] = None if m is None else int(m.group(1) or 0)
        return after[key]

    def forward(fb: Any, *args: Any, **kwargs: Any) -> Any:
        rows = set(fb.req_pool_indices.tolist())  # the step's requests: those holding its rows
        for req in [r for r in sched._live.values() if r.req_pool_idx in rows]:
            k = poisoned_after(req)
            if k is not None and len(req.output_ids) >= k:
                raise RuntimeError(f"injected fault ({POISON_ENV}): request {req.rid} poisons its step")
        return real(fb, *args, **kwargs)

    sched.runner.forward = forward
    log.warning("fault injection for tests: steps of requests whose prompt contains %r raise", marker)
    return True

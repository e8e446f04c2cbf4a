"""Which waiting requests to admit next: ordering (lpm / fcfs with a starvation bound) and the
token budget of one prefill step."""
from __future__ import annotations

import time
from collections import deque

from treadle.radix_cache import RadixCache
from treadle.runtime.request import Req

# Beyond this many waiting requests, matching every one against the tree each step costs more
# than the cache-aware order saves: fall back to arrival order.
LPM_MAX_QUEUE = 128


def order_waiting(waiting: deque[Req], policy: str, tree: RadixCache, starvation_bound_s: float) -> list[Req]:
    """Return the waiting requests in admission order. Requests waiting longer than the
    starvation bound come first (oldest first) under every policy."""
    now = time.monotonic()
    first = [r for r in waiting if starved(r, now, starvation_bound_s)]
    rest = [r for r in waiting if not starved(r, now, starvation_bound_s)]
    if policy == "lpm" and not tree.disable and len(waiting) <= LPM_MAX_QUEUE:
        # longest cached prefix first; arrival order breaks ties (sort is stable)
        rest.sort(key=lambda r: -len(tree.match_prefix(match_key(r)).slots))
    first.sort(key=lambda r: r.arrival)
    return first + rest


def starved(req: Req, now: float, starvation_bound_s: float) -> bool:
    """Whether `req` has waited past the starvation bound (since its arrival, or since its
    retraction: scheduler._retract restarts the clock)."""
    return now - req.arrival > starvation_bound_s


def match_key(req: Req) -> list[int]:
    """The tokens whose cached KV a request may reuse. At least one token is always recomputed
    (its logits start generation), and prompt positions whose logprobs were asked for must be
    computed, so the key stops before them."""
    ids = req.fill_ids
    end = len(ids) - 1
    if req.wants_prompt_logprobs:
        # token s is scored by the logits at position s - 1, which must be computed
        end = min(end, req.logprob_start_len - 1)
    return ids[: max(0, end)]


class PrefillBudget:
    """Token budget of one prefill step.

    total: free + evictable KV slots minus what running requests are expected to still need
    input: max_prefill_tokens; chunk: chunked_prefill_size (None: no chunking)
    """

    def __init__(self, total: int, max_prefill: int, chunk: int | None) -> None:
        self.total = total
        self.input = max_prefill
        self.chunk = chunk

    def take(self, extend: int, reserve: int) -> None:
        self.total -= extend + reserve
        self.input -= extend
        if self.chunk is not None:
            self.chunk -= extend

    def max_extend(self) -> int:
        """The most new tokens one more request could prefill now."""
        caps = [self.total, self.input] + ([self.chunk] if self.chunk is not None else [])
        return max(0, min(caps))

"""Stateful property test: RadixCache + TokenSlotAllocator against a naive reference model.

The reference is a dict from every cached prefix (tuple of token ids) to the KV slot of its
last token; the radix tree must agree with it on every match. Requests follow the
scheduler's protocol: match -> lock -> alloc (evicting if needed) -> insert -> free the
duplicate slots -> unlock, or abort (free new slots, unlock). `check_integrity` runs after
every step with the running requests' own slots as `owned`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from treadle.radix_cache import RadixCache, TokenSlotAllocator, TreeNode

NUM_SLOTS = 40
# a tiny alphabet and short keys so prefixes collide and nodes split often
KEYS = st.lists(st.integers(0, 1), min_size=1, max_size=6).map(tuple)


@dataclass
class Running:
    key: tuple[int, ...]
    prefix_len: int          # tokens whose slots came from the tree (locked, not owned)
    slots: torch.Tensor      # int64 [len(key)]: tree prefix slots + own slots
    node: TreeNode           # locked last node of the matched prefix


def tree_contents(cache: RadixCache) -> dict[tuple[int, ...], int]:
    """Every cached prefix -> slot of its last token, read straight from the tree."""
    out: dict[tuple[int, ...], int] = {}
    stack = [(cache.root_node, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            p = prefix
            for tok, slot in zip(child.key, child.value.tolist()):
                p = p + (tok,)
                out[p] = slot
            stack.append((child, p))
    return out


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = TokenSlotAllocator(NUM_SLOTS, debug=True)
        self.cache = RadixCache(self.alloc)
        self.ref: dict[tuple[int, ...], int] = {}
        self.running: list[Running] = []

    def expected_match(self, key: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        for i in range(1, len(key) + 1):
            if key[:i] not in self.ref:
                break
            out.append(self.ref[key[:i]])
        return out

    def check_eviction(self, before: dict[tuple[int, ...], int], freed: int, asked: int) -> None:
        """Evicted entries are a subset of unlocked ones; the rest is untouched."""
        after = tree_contents(self.cache)
        assert after.items() <= before.items()
        assert len(before) - len(after) == freed
        for r in self.running:
            for i in range(1, r.prefix_len + 1):
                assert r.key[:i] in after, "a locked prefix was evicted"
        for p in after:  # the cache stays prefix-closed
            assert len(p) == 1 or p[:-1] in after
        if freed < asked:
            assert self.cache.evictable_size() == 0
        self.ref = after

    @rule(key=KEYS)
    def match(self, key: tuple[int, ...]) -> None:
        m = self.cache.match_prefix(key)
        assert m.slots.tolist() == self.expected_match(key)

    @rule(key=KEYS)
    def start_request(self, key: tuple[int, ...]) -> None:
        self._start(key)

    @rule(key=KEYS)
    def serve_request(self, key: tuple[int, ...]) -> None:
        """Start and finish at once, so inserts (and the splits they cause) are frequent."""
        if self._start(key):
            self._finish(len(self.running) - 1)

    def _start(self, key: tuple[int, ...]) -> bool:
        m = self.cache.match_prefix(key)
        assert m.slots.tolist() == self.expected_match(key)
        self.cache.inc_lock_ref(m.last_node)
        need = len(key) - m.slots.numel()
        if self.alloc.available_size() < need:
            before = tree_contents(self.cache)
            asked = need - self.alloc.available_size()
            self.check_eviction(before, self.cache.evict(asked), asked)
        new = self.alloc.alloc(need)
        if new is None:  # out of memory even after eviction: give up like a retract
            self.cache.dec_lock_ref(m.last_node)
            return False
        self.running.append(Running(key, m.slots.numel(), torch.cat([m.slots, new]), m.last_node))
        return True

    @precondition(lambda self: self.running)
    @rule(which=st.integers(0, 1000))
    def finish_request(self, which: int) -> None:
        self._finish(which % len(self.running))

    def _finish(self, index: int) -> None:
        r = self.running.pop(index)
        cached = self.cache.insert(r.key, r.slots)
        assert cached >= r.prefix_len
        assert cached == len(self.expected_match(r.key))
        # slots[:prefix_len] are the tree's own; [prefix_len:cached] duplicate tree slots
        self.alloc.free(r.slots[r.prefix_len:cached])
        for i in range(len(r.key)):
            self.ref.setdefault(r.key[: i + 1], int(r.slots[i]))
        self.cache.dec_lock_ref(r.node)

    @precondition(lambda self: self.running)
    @rule(which=st.integers(0, 1000))
    def abort_request(self, which: int) -> None:
        r = self.running.pop(which % len(self.running))
        self.alloc.free(r.slots[r.prefix_len:])
        self.cache.dec_lock_ref(r.node)

    @rule(n=st.integers(0, NUM_SLOTS))
    def evict(self, n: int) -> None:
        # evictions also happen inside start_request when memory runs out
        before = tree_contents(self.cache)
        self.check_eviction(before, self.cache.evict(n), n)

    @precondition(lambda self: not self.running)
    @rule(dice=st.integers(0, 9))
    def reset(self, dice: int) -> None:
        if dice:  # reset wipes the state the other rules build up: keep it rare
            return
        self.cache.reset()
        self.ref = {}
        assert self.alloc.available_size() == NUM_SLOTS

    @invariant()
    def integrity(self) -> None:
        owned = [r.slots[r.prefix_len:] for r in self.running]
        self.cache.check_integrity(owned=owned)
        assert tree_contents(self.cache) == self.ref
        assert self.cache.total_size() == len(self.ref)
        locked = sum(1 for r in self.running if r.prefix_len)
        assert (self.cache.protected_size() > 0) == (locked > 0)


RadixMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixMachine = RadixMachine.TestCase

r"""The radix-tree prefix cache over token ids.

Each non-root node holds a run of token ids (`key`) and the KV slots of those tokens
(`value`, int64 [len(key)]), never KV data itself, so the tree is testable on the CPU with
no KV tensors at all (`allocator=None`). A path root..node spells a cached token prefix:

    root --(1,2,3)--> A --(4,5)--> B          cached: 1 2 3 4 5
                       \--(9)----> C          cached: 1 2 3 9

Children are keyed by their first token (page size 1), so a lookup is one dict access per
node. Slot ownership: a slot in the tree belongs to the tree; running requests lock the
path they read (`inc_lock_ref`) so eviction cannot free it under them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

from .allocator import TokenSlotAllocator

_EMPTY_KEY: tuple[int, ...] = ()
_BLOCK = 64  # tokens compared at a time while looking for where two runs part


class TreeNode:
    """One edge of the radix tree: a run of tokens and their KV slots."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access", "id")

    def __init__(self, node_id: int, parent: TreeNode | None, key: tuple[int, ...], value: torch.Tensor) -> None:
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key = key                  # token ids, tuple[int, ...]
        self.value = value              # int64 [len(key)] KV slots
        self.lock_ref = 0               # running requests whose path includes this node
        self.last_access = 0            # logical clock tick (deterministic LRU)
        self.id = node_id               # heap tie-break and debugging

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, key={self.key}, lock_ref={self.lock_ref})"


class MatchResult(NamedTuple):
    """`slots`: int64 [m] KV slots of the longest cached prefix; `last_node`: its last node."""

    slots: torch.Tensor
    last_node: TreeNode


class RadixCache:
    """Prefix cache mapping token-id sequences to KV slots, with LRU eviction of unlocked leaves."""

    def __init__(self, allocator: TokenSlotAllocator | None, page_size: int = 1, disable: bool = False) -> None:
        """Build an empty tree.

        `allocator` receives evicted slots; with None (CPU tests, no KV pool) evicted slots
        are recorded in `evicted_slots` instead. Only page_size == 1 is supported.
        """
        if page_size != 1:
            raise ValueError(f"page_size={page_size} is not supported yet; RadixCache needs page_size=1")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.device = allocator.device if allocator is not None else torch.device("cpu")
        self.evicted_slots: list[torch.Tensor] = []
        self.num_evicted_tokens = 0
        self._ids = itertools.count()
        self._clock = itertools.count(1)
        self._init_empty()

    # ================================================================== public API

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Find the longest cached prefix of `key`.

        Returns its KV slots (int64 [m], m <= len(key)) and `last_node`, the node whose path
        from the root spells exactly key[:m]. When the match ends inside a node's run, that
        node is split in two at the match boundary so that `last_node` ends exactly there;
        this changes the tree's shape but not its content, sizes or lock state. The
        last-access time of every node on the matched path is refreshed (for LRU).

        Lock `last_node` with `inc_lock_ref` before relying on the slots across an `evict`.
        With `disable=True`, or an empty key, returns an empty tensor and the root.
        """
        key = tuple(key)
        if self.disable or not key:
            return MatchResult(self._empty_slots(), self.root_node)
        node, matched, values = self._walk(key)
        slots = torch.cat(values) if values else self._empty_slots()
        assert slots.numel() == matched
        return MatchResult(slots, node)

    def insert(self, key: Sequence[int], slots: torch.Tensor) -> int:
        """Cache `key` with its KV `slots` (int64 [len(key)]); returns the already-cached length p.

        key[:p] was in the tree before the call, so the tree keeps its own slots for those
        tokens and the new ones `slots[:p]` become duplicates: the caller must free the
        slots in `slots[:p]` that it allocated itself (those beyond the prefix it got from
        `match_prefix`, which are the tree's own) and hands `slots[p:]` over to the tree.
        The path's last-access time is refreshed. With `disable=True` nothing is stored and
        len(key) is returned, so the caller frees everything it allocated.
        """
        key = tuple(key)
        if len(key) != slots.numel():
            raise ValueError(f"insert needs one slot per token: key has {len(key)} tokens, slots has {slots.numel()}")
        if self.disable:
            return len(key)
        if not key:
            return 0
        node, matched, _ = self._walk(key)
        if matched < len(key):
            # a copy on the tree's device (the allocator's, the host): a caller may pass a slice
            # of a GPU table, and a match must never cat slots of two devices
            self._add_leaf(node, key[matched:], slots.reshape(-1)[matched:].to(self.device, torch.int64, copy=True))
        return matched

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock the path root..node against eviction; returns the evictable-size change (<= 0)."""
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one `inc_lock_ref(node)`; returns the evictable-size change (>= 0)."""
        delta = 0
        while node is not self.root_node:
            assert node.lock_ref > 0, f"dec_lock_ref on unlocked {node!r}"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                delta += len(node.key)
            node = node.parent
        return delta

    def evict(self, num_tokens: int) -> int:
        """Free least-recently-used unlocked leaves until >= num_tokens slots are freed.

        Stops early when nothing evictable remains. A parent left childless and unlocked
        becomes a candidate in the same call. Freed slots go to the allocator (or to
        `evicted_slots` when there is none). Returns the number of slots freed.
        """
        if self.disable or num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._iter_nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            self._release(node.value)
            del parent.children[node.key[0]]
            self._evictable -= len(node.key)
            self._num_nodes -= 1
            freed += len(node.key)
            if parent is not self.root_node and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.num_evicted_tokens += freed
        return freed

    def reset(self) -> None:
        """Drop every cached prefix, freeing all its slots. Requires that nothing is locked."""
        if self._protected:
            raise ValueError(
                f"cannot reset the radix cache while {self._protected} tokens are locked by running requests"
            )
        for node in self._iter_nodes():
            self._release(node.value)
        self._init_empty()

    def forget(self) -> None:
        """Drop every node, locked or not, without handing its slots back: for a caller that
        resets the allocator and every request's hold on the tree at the same time (the
        scheduler after a failed step)."""
        self._init_empty()

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (O(1))."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes (O(1))."""
        return self._protected

    def total_size(self) -> int:
        """Tokens cached in the tree."""
        return self._evictable + self._protected

    def num_nodes(self) -> int:
        """Non-root nodes in the tree."""
        return self._num_nodes

    def check_integrity(self, owned: Iterable[torch.Tensor] = ()) -> None:
        """Raise AssertionError unless the tree and slot accounting are consistent.

        Tree checks: non-empty keys with one slot per token, children keyed by their first
        token, parent links, lock counts >= 0 and never above the parent's, node count and
        evictable/protected sizes equal to a recount. Slot checks (with an allocator): every
        slot 1..num_slots is in exactly one of the free list, one tree node, or one `owned`
        tensor (slots held by running requests outside the tree). Without an allocator:
        no slot appears twice across the tree and `owned`.
        """
        evictable = protected = count = 0
        tree_slots: list[torch.Tensor] = []
        for node in self._iter_nodes():
            count += 1
            assert node.key, f"empty non-root node {node!r}"
            assert node.value.numel() == len(node.key), f"{node!r} has {node.value.numel()} slots"
            assert node.parent.children.get(node.key[0]) is node, f"{node!r} not under its first token"
            assert node.lock_ref >= 0, f"negative lock_ref on {node!r}"
            if node.parent is not self.root_node:
                assert node.lock_ref <= node.parent.lock_ref, f"{node!r} locked more than its parent"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            tree_slots.append(node.value.reshape(-1).cpu())
        assert count == self._num_nodes, f"num_nodes {self._num_nodes} != recount {count}"
        assert evictable == self._evictable, f"evictable_size {self._evictable} != recount {evictable}"
        assert protected == self._protected, f"protected_size {self._protected} != recount {protected}"
        owned_slots = [t.reshape(-1).cpu().to(torch.int64) for t in owned]
        self._check_slot_accounting(tree_slots, owned_slots)

    # ================================================================== internal helpers

    def _init_empty(self) -> None:
        self.root_node = TreeNode(next(self._ids), None, _EMPTY_KEY, self._empty_slots())
        self.root_node.lock_ref = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0
        self._num_nodes = 0

    def _empty_slots(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    @staticmethod
    def _child_key(key: tuple[int, ...]) -> int:
        """The dict key under which a run starting with `key` hangs (page size 1: first token)."""
        return key[0]

    @staticmethod
    def _match_len(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        """Length of the common prefix of two token runs (page size 1: token granularity).
        Slices compare in C: a node matched whole (a long shared system prompt) costs one
        comparison, a mismatch a run of 64-token blocks and at most 63 single steps."""
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        i = 0
        while a[i: i + _BLOCK] == b[i: i + _BLOCK]:  # the mismatch is before n: this ends
            i += _BLOCK
        while a[i] == b[i]:
            i += 1
        return i

    def _walk(self, key: tuple[int, ...]) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Descend along `key`, splitting the node where the match ends inside it.

        Returns (last matched node, matched length, slot tensors along the path) and
        refreshes last-access times on the path. All key matching lives here.
        """
        node, pos, values = self.root_node, 0, []
        while pos < len(key):
            child = node.children.get(self._child_key(key[pos:]))
            if child is None:
                break
            n = self._match_len(child.key, key[pos:])
            assert n > 0
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            child.last_access = next(self._clock)
            values.append(child.value)
            node, pos = child, pos + n
            if partial:
                break  # key[pos] differs from the split-off lower half, or key is exhausted
        return node, pos, values

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child` after its first n tokens; returns the new upper node (key[:n]).

        The upper node inherits the lock count: every lock through `child` also passes
        through it, so sizes and lock invariants are unchanged.
        """
        assert 0 < n < len(child.key)
        parent = child.parent
        upper = TreeNode(next(self._ids), parent, child.key[:n], child.value[:n].clone())
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.key = child.key[n:]
        child.value = child.value[n:].clone()
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        parent.children[self._child_key(upper.key)] = upper
        self._num_nodes += 1
        return upper

    def _add_leaf(self, parent: TreeNode, key: tuple[int, ...], value: torch.Tensor) -> TreeNode:
        assert self._child_key(key) not in parent.children
        leaf = TreeNode(next(self._ids), parent, key, value)
        leaf.last_access = next(self._clock)
        parent.children[self._child_key(key)] = leaf
        self._evictable += len(key)
        self._num_nodes += 1
        return leaf

    def _iter_nodes(self) -> Iterable[TreeNode]:
        """All non-root nodes, parents before children."""
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _release(self, slots: torch.Tensor) -> None:
        if self.allocator is not None:
            self.allocator.free(slots)
        else:
            self.evicted_slots.append(slots)

    def _check_slot_accounting(self, tree_slots: list[torch.Tensor], owned_slots: list[torch.Tensor]) -> None:
        """Count each slot's owners in the tree, the free list and `owned`, and compare to one."""
        all_parts = tree_slots + owned_slots
        size = 1 + max([self.allocator.num_slots if self.allocator else 0]
                       + [int(t.max()) for t in all_parts if t.numel()])

        def counts(parts: list[torch.Tensor]) -> torch.Tensor:
            flat = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
            assert flat.numel() == 0 or int(flat.min()) >= 0, "negative slot index"
            return torch.bincount(flat, minlength=size)

        in_tree, in_owned = counts(tree_slots), counts(owned_slots)
        in_free = counts([self.allocator.free_slots()]) if self.allocator else torch.zeros_like(in_tree)
        total = in_tree + in_free + in_owned
        assert int(total[0]) == 0, "the dummy slot 0 is held by the tree, the free list or a request"

        def describe(idx: torch.Tensor) -> str:
            return "; ".join(
                f"slot {s}: tree={int(in_tree[s])} free={int(in_free[s])} owned={int(in_owned[s])}"
                for s in idx[:10].tolist()
            )

        double = torch.nonzero(total > 1).reshape(-1)
        assert double.numel() == 0, f"{double.numel()} slots have several owners: {describe(double)}"
        if self.allocator is not None:
            leaked = torch.nonzero(total[1:] == 0).reshape(-1) + 1
            assert leaked.numel() == 0, f"{leaked.numel()} slots leaked (no owner): {describe(leaked)}"
            beyond = torch.nonzero(total[self.allocator.num_slots + 1:]).reshape(-1)
            assert beyond.numel() == 0, f"slots beyond num_slots={self.allocator.num_slots} are in use"

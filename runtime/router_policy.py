"""Routing policies for the data-parallel router: which replica gets a request.

`cache_aware` keeps, per replica, an approximate radix tree over the *text* of the prompts
recently routed there (the router never tokenizes). A prompt goes to the replica whose tree
shares the longest prefix with it, when that prefix is long enough and the replicas' loads
are balanced; otherwise to the least loaded replica (ties: the one caching the least text,
so new prefix groups spread out). The tree only approximates each replica's radix cache:
the replica may have evicted what the router still remembers, and vice versa after a
restart (the tree is cleared when a replica is seen unhealthy).

`round_robin` cycles through the healthy replicas, ignoring prefixes (the baseline).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class _Node:
    key: str  # the edge label leading into this node ("" for the root)
    parent: "_Node | None"
    children: dict[str, "_Node"] = field(default_factory=dict)  # first char of child.key -> child
    last_access: int = 0


class TextPrefixTree:
    """A radix tree over characters with a bound on the characters it stores; inserting past
    the bound evicts least-recently-used leaves.

        root --"You are a helpful"--> n1 --" assistant. Q: 2+2"--> leaf
                                         \\-" critic. Review"--> leaf
    """

    def __init__(self, max_chars: int) -> None:
        if max_chars <= 0:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        self.max_chars = max_chars
        self.root = _Node("", None)
        self.size = 0  # sum of len(node.key) over all nodes
        self._clock = itertools.count(1)

    # ---- public API ----

    def match(self, text: str) -> int:
        """Length of the longest prefix of `text` stored in the tree (partial edges count).
        Touches the matched path so it is evicted last; changes nothing else."""
        node, pos, now = self.root, 0, next(self._clock)
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                break
            n = _common_len(child.key, text, pos)
            child.last_access = now
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def insert(self, text: str) -> None:
        """Add `text` (splitting an edge where it diverges), then evict LRU leaves until the
        tree holds at most `max_chars` characters. Touches the whole path of `text`. A text
        longer than `max_chars` is never held (it would evict every leaf, itself last): it only
        touches what of it the tree holds."""
        if len(text) > self.max_chars:
            self.match(text)
            return
        node, pos, now = self.root, 0, next(self._clock)
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                leaf = _Node(text[pos:], node, last_access=now)
                node.children[text[pos]] = leaf
                self.size += len(leaf.key)
                break
            n = _common_len(child.key, text, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            pos += n
            node = child
        if self.size > self.max_chars:
            self._evict(self.size - self.max_chars)

    def clear(self) -> None:
        self.root = _Node("", None)
        self.size = 0

    # ---- internal helpers ----

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut `child`'s edge after n chars: parent -> mid(key[:n]) -> child(key[n:])."""
        assert 0 < n < len(child.key)
        parent = child.parent
        assert parent is not None
        mid = _Node(child.key[:n], parent, last_access=child.last_access)
        parent.children[mid.key[0]] = mid
        child.key = child.key[n:]
        child.parent = mid
        mid.children[child.key[0]] = child
        return mid

    def _evict(self, need: int) -> None:
        """Drop whole leaves, oldest first, until `need` characters are freed; a parent left
        childless becomes a leaf and may go in the same pass."""
        leaves = sorted(self._leaves(), key=lambda x: x.last_access)
        while need > 0 and leaves:
            leaf = leaves.pop(0)
            parent = leaf.parent
            assert parent is not None and parent.children.get(leaf.key[0]) is leaf
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            need -= len(leaf.key)
            if parent is not self.root and not parent.children:
                # insert in access order (parents are touched no later than their leaves)
                i = next((k for k, x in enumerate(leaves) if x.last_access > parent.last_access), len(leaves))
                leaves.insert(i, parent)

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            else:
                out.append(n)
        return out


def _common_len(key: str, text: str, pos: int) -> int:
    """Number of leading chars `key` shares with text[pos:]."""
    n, limit = 0, min(len(key), len(text) - pos)
    while n < limit and key[n] == text[pos + n]:
        n += 1
    return n


@dataclass(frozen=True)
class CacheAwareConfig:
    match_ratio: float = 0.5  # route by prefix when matched chars >= this share of the prompt ...
    match_chars: int = 256  # ... or at least this many chars match
    balance_abs: int = 4  # loads are imbalanced when max - min in-flight exceeds this
    max_tree_chars: int = 1 << 20  # per replica


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self._next = 0

    def choose(self, text: str, candidates: list[int], loads: list[int]) -> tuple[int, int]:
        """(replica index, matched chars); `candidates` are the healthy replicas not yet tried."""
        assert candidates
        pick = min(candidates, key=lambda i: (i - self._next) % self.num_replicas)
        self._next = pick + 1
        return pick, 0

    def on_routed(self, replica: int, text: str) -> None:
        pass

    def on_unhealthy(self, replica: int) -> None:
        pass

    def reset(self) -> None:
        pass


class CacheAwarePolicy:
    name = "cache_aware"

    def __init__(self, num_replicas: int, config: CacheAwareConfig | None = None) -> None:
        self.config = config or CacheAwareConfig()
        self.trees = [TextPrefixTree(self.config.max_tree_chars) for _ in range(num_replicas)]

    def choose(self, text: str, candidates: list[int], loads: list[int]) -> tuple[int, int]:
        """(replica index, matched chars); `loads` are in-flight counts of every replica."""
        assert candidates
        c = self.config
        cand_loads = [loads[i] for i in candidates]
        balanced = max(cand_loads) - min(cand_loads) <= c.balance_abs
        matches = {i: self.trees[i].match(text) for i in candidates} if text else {}
        if balanced and matches:
            best = max(candidates, key=lambda i: (matches[i], -loads[i]))
            m = matches[best]
            if m > 0 and (m >= c.match_ratio * len(text) or m >= c.match_chars):
                return best, m
        least = min(candidates, key=lambda i: (loads[i], self.trees[i].size))
        return least, matches.get(least, 0)

    def on_routed(self, replica: int, text: str) -> None:
        if text:
            self.trees[replica].insert(text)

    def on_unhealthy(self, replica: int) -> None:
        # a replica that went away has (or will restart with) an empty cache
        self.trees[replica].clear()

    def reset(self) -> None:
        for t in self.trees:
            t.clear()


def make_policy(name: str, num_replicas: int, config: CacheAwareConfig | None = None):
    if name == "cache_aware":
        return CacheAwarePolicy(num_replicas, config)
    if name == "round_robin":
        return RoundRobinPolicy(num_replicas)
    raise ValueError(f"unknown routing policy {name!r}; choose cache_aware or round_robin")

"""Unit tests for RadixCache: matching, splitting, insert accounting, locks, LRU eviction."""

from __future__ import annotations

import pytest
import torch

from treadle.radix_cache import RadixCache, TokenSlotAllocator, TreeNode


def t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def keys_of(cache: RadixCache) -> set[tuple[int, ...]]:
    """Every cached full path that ends at a leaf."""
    out: set[tuple[int, ...]] = set()

    def rec(node: TreeNode, prefix: tuple[int, ...]) -> None:
        if not node.children and node is not cache.root_node:
            out.add(prefix)
        for c in node.children.values():
            rec(c, prefix + c.key)

    rec(cache.root_node, ())
    return out


def test_match_on_empty_tree() -> None:
    c = RadixCache(None)
    m = c.match_prefix([1, 2, 3])
    assert m.slots.numel() == 0 and m.last_node is c.root_node
    assert c.match_prefix([]).last_node is c.root_node


def test_insert_returns_already_cached_length() -> None:
    c = RadixCache(None)
    assert c.insert([1, 2, 3], t(11, 12, 13)) == 0
    assert c.insert([1, 2, 3, 4], t(21, 22, 23, 24)) == 3
    assert c.insert([1, 2, 9], t(31, 32, 33)) == 2
    assert c.insert([1, 2], t(41, 42)) == 2
    assert c.total_size() == 5  # tokens 1 2 3 4 9
    # the tree keeps its first slots for a shared prefix
    assert c.match_prefix([1, 2, 3, 4]).slots.tolist() == [11, 12, 13, 24]
    assert c.match_prefix([1, 2, 9, 9]).slots.tolist() == [11, 12, 33]
    c.check_integrity()


def test_insert_stores_copies_on_the_tree_device() -> None:
    """The scheduler inserts slices of its request table (int32, on the GPU there): the tree
    keeps int64 copies on its own device, so a match spanning nodes from different callers
    concatenates tensors of one device and the caller's later writes do not reach the tree."""
    c = RadixCache(None)
    table = torch.tensor([[11, 12, 13, 14, 15]], dtype=torch.int32)
    c.insert([1, 2, 3], table[0, :3])
    c.insert([1, 2, 3, 4, 5], table[0, :5].long())
    table.zero_()
    m = c.match_prefix([1, 2, 3, 4, 5])
    assert m.slots.tolist() == [11, 12, 13, 14, 15] and m.slots.dtype == torch.int64
    assert {(n.value.device, n.value.dtype) for n in c._iter_nodes()} == {(c.device, torch.int64)}


def test_insert_length_mismatch_raises() -> None:
    c = RadixCache(None)
    with pytest.raises(ValueError, match="one slot per token"):
        c.insert([1, 2], t(1))


def test_partial_match_splits_node() -> None:
    c = RadixCache(None)
    c.insert([1, 2, 3, 4], t(11, 12, 13, 14))
    assert c.num_nodes() == 1
    m = c.match_prefix([1, 2, 7])
    assert m.slots.tolist() == [11, 12]
    assert c.num_nodes() == 2
    assert m.last_node.key == (1, 2)
    assert [n.key for n in m.last_node.children.values()] == [(3, 4)]
    # a match ending exactly at the key's end inside a node splits too
    m2 = c.match_prefix([1])
    assert m2.last_node.key == (1,) and c.num_nodes() == 3
    assert c.total_size() == 4 and c.evictable_size() == 4
    c.check_integrity()


def test_split_keeps_locks() -> None:
    c = RadixCache(None)
    c.insert([1, 2, 3, 4], t(11, 12, 13, 14))
    node = c.match_prefix([1, 2, 3, 4]).last_node
    assert c.inc_lock_ref(node) == -4
    m = c.match_prefix([1, 2])  # splits the locked node
    assert m.last_node.lock_ref == 1
    assert c.protected_size() == 4 and c.evictable_size() == 0
    c.check_integrity()
    assert c.dec_lock_ref(node) == 4
    assert c.protected_size() == 0 and c.evictable_size() == 4
    c.check_integrity()


def test_lock_prevents_eviction() -> None:
    alloc = TokenSlotAllocator(8, debug=True)
    c = RadixCache(alloc)
    s1, s2 = alloc.alloc(3), alloc.alloc(2)
    assert s1 is not None and s2 is not None
    c.insert([1, 2, 3], s1)
    c.insert([5, 6], s2)
    locked = c.match_prefix([1, 2, 3]).last_node
    c.inc_lock_ref(locked)
    assert c.evictable_size() == 2 and c.protected_size() == 3
    assert c.evict(100) == 2
    assert c.match_prefix([1, 2, 3]).slots.tolist() == s1.tolist()
    assert c.evict(100) == 0
    c.dec_lock_ref(locked)
    assert c.evict(1) == 3
    assert alloc.available_size() == 8 and c.total_size() == 0
    c.check_integrity()


def test_evict_lru_order() -> None:
    c = RadixCache(None)
    c.insert([1], t(1))
    c.insert([2], t(2))
    c.insert([3], t(3))
    c.match_prefix([1])  # 1 is now the most recently used; LRU order is 2, 3, 1
    assert c.evict(1) == 1
    assert keys_of(c) == {(1,), (3,)}
    assert c.evict(1) == 1
    assert keys_of(c) == {(1,)}
    assert [s.tolist() for s in c.evicted_slots] == [[2], [3]]
    assert c.num_evicted_tokens == 2


def test_parent_becomes_leaf_and_is_evicted_in_same_call() -> None:
    c = RadixCache(None)
    c.insert([1, 2], t(1, 2))
    c.insert([1, 2, 3], t(1, 2, 3))  # child (3) under (1, 2)
    c.insert([9], t(9))              # most recent
    assert c.evict(2) == 3           # (3) then its parent (1, 2), which is older than (9)
    assert keys_of(c) == {(9,)}
    assert c.evictable_size() == 1
    c.check_integrity()


def test_evict_stops_when_nothing_left() -> None:
    c = RadixCache(None)
    c.insert([1, 2], t(1, 2))
    assert c.evict(10) == 2
    assert c.num_nodes() == 0 and c.evict(10) == 0


def test_disable_mode() -> None:
    c = RadixCache(None, disable=True)
    assert c.insert([1, 2, 3], t(1, 2, 3)) == 3
    m = c.match_prefix([1, 2, 3])
    assert m.slots.numel() == 0 and m.last_node is c.root_node
    assert c.total_size() == 0 and c.evict(5) == 0
    c.check_integrity()


def test_page_size_other_than_one_rejected() -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(None, page_size=16)


def test_reset_frees_everything_and_refuses_when_locked() -> None:
    alloc = TokenSlotAllocator(6, debug=True)
    c = RadixCache(alloc)
    s = alloc.alloc(4)
    assert s is not None
    c.insert([1, 2, 3, 4], s)
    node = c.match_prefix([1, 2]).last_node
    c.inc_lock_ref(node)
    with pytest.raises(ValueError, match="locked"):
        c.reset()
    c.dec_lock_ref(node)
    c.reset()
    assert alloc.available_size() == 6
    assert c.total_size() == 0 and c.num_nodes() == 0
    c.check_integrity()


def test_lock_ref_underflow_asserts() -> None:
    c = RadixCache(None)
    c.insert([1], t(1))
    with pytest.raises(AssertionError, match="unlocked"):
        c.dec_lock_ref(c.match_prefix([1]).last_node)


def test_integrity_detects_leaked_slot() -> None:
    alloc = TokenSlotAllocator(6)
    c = RadixCache(alloc)
    s = alloc.alloc(3)
    assert s is not None
    c.insert([1, 2], s[:2])
    c.check_integrity(owned=[s[2:]])
    with pytest.raises(AssertionError, match="leaked"):
        c.check_integrity()


def test_integrity_detects_double_owned_slot() -> None:
    alloc = TokenSlotAllocator(6)
    c = RadixCache(alloc)
    s = alloc.alloc(2)
    assert s is not None
    c.insert([1, 2], s)
    with pytest.raises(AssertionError, match="several owners"):
        c.check_integrity(owned=[s[:1]])
    # a slot that is both free and in the tree
    alloc.free(s[1:])
    with pytest.raises(AssertionError, match="several owners"):
        c.check_integrity()


def test_integrity_without_allocator_detects_duplicate() -> None:
    c = RadixCache(None)
    c.insert([1], t(5))
    c.insert([2], t(5))
    with pytest.raises(AssertionError, match="several owners"):
        c.check_integrity()


def test_integrity_detects_bad_size_counter() -> None:
    c = RadixCache(None)
    c.insert([1, 2], t(1, 2))
    c._evictable += 1  # simulate an accounting bug
    with pytest.raises(AssertionError, match="evictable_size"):
        c.check_integrity()


def test_realistic_request_cycle_with_allocator() -> None:
    """match -> lock -> alloc the rest -> insert -> free duplicates -> unlock, twice."""
    alloc = TokenSlotAllocator(16, debug=True)
    c = RadixCache(alloc)
    for key in ([1, 2, 3, 4], [1, 2, 3, 5, 6]):
        m = c.match_prefix(key)
        c.inc_lock_ref(m.last_node)
        new = alloc.alloc(len(key) - m.slots.numel())
        assert new is not None
        c.check_integrity(owned=[new])
        slots = torch.cat([m.slots, new])
        cached = c.insert(key, slots)
        alloc.free(slots[m.slots.numel():cached])
        c.dec_lock_ref(m.last_node)
        c.check_integrity()
    assert c.total_size() == 6 and alloc.available_size() == 10


def test_match_len_agrees_with_a_token_by_token_scan() -> None:
    import random

    rng = random.Random(3)
    for _ in range(2000):
        n = rng.randrange(0, 300)
        a = tuple(rng.randrange(3) for _ in range(n))
        b = a[: rng.randrange(0, n + 1)] + tuple(rng.randrange(3) for _ in range(rng.randrange(0, 200)))
        if rng.random() < 0.5:
            a, b = b, a
        expect = 0
        while expect < min(len(a), len(b)) and a[expect] == b[expect]:
            expect += 1
        assert RadixCache._match_len(a, b) == expect

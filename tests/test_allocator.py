"""Tests for the KV slot allocator, the request-to-token table and the KV pool."""

from __future__ import annotations

import pytest
import torch

from treadle.radix_cache import MIN_USEFUL_SLOTS, ReqToTokenPool, TokenSlotAllocator, TokenToKVPool


# ---------------------------------------------------------------- TokenSlotAllocator


def test_alloc_never_returns_slot_zero_and_covers_all_slots() -> None:
    a = TokenSlotAllocator(10)
    got = a.alloc(10)
    assert got is not None and got.dtype == torch.int64
    assert sorted(got.tolist()) == list(range(1, 11))
    assert a.available_size() == 0
    assert a.alloc(1) is None


def test_alloc_zero_and_too_many() -> None:
    a = TokenSlotAllocator(4)
    empty = a.alloc(0)
    assert empty is not None and empty.numel() == 0 and empty.dtype == torch.int64
    assert a.alloc(5) is None
    assert a.available_size() == 4  # a failed alloc changes nothing
    with pytest.raises(ValueError):
        a.alloc(-1)


def test_free_then_realloc_uses_pending_frees() -> None:
    a = TokenSlotAllocator(6)
    x = a.alloc(4)
    y = a.alloc(2)
    assert x is not None and y is not None
    a.free(x[:2])
    a.free(x[2:])
    assert a.available_size() == 4
    z = a.alloc(4)
    assert z is not None and sorted(z.tolist()) == sorted(x.tolist())
    a.free(y)
    a.free(z)
    assert sorted(a.free_slots().tolist()) == list(range(1, 7))


def test_freed_slots_are_reused_last() -> None:
    a = TokenSlotAllocator(6)
    first = a.alloc(2)
    assert first is not None
    a.free(first)
    nxt = a.alloc(4)
    assert nxt is not None and set(nxt.tolist()).isdisjoint(first.tolist())


def test_free_is_not_aliased_to_caller_tensor() -> None:
    a = TokenSlotAllocator(4)
    x = a.alloc(2)
    assert x is not None
    expect = sorted(x.tolist())
    a.free(x)
    x.fill_(99)  # the caller reuses its buffer; the free list must not change
    assert sorted(a.free_slots().tolist()) == sorted([3, 4] + expect)


def test_free_slot_zero_or_out_of_range_asserts() -> None:
    a = TokenSlotAllocator(4)
    with pytest.raises(AssertionError, match="slot 0"):
        a.free(torch.tensor([0]))
    with pytest.raises(AssertionError, match="out of range"):
        a.free(torch.tensor([5]))


def test_debug_detects_double_free() -> None:
    a = TokenSlotAllocator(4, debug=True)
    x = a.alloc(2)
    assert x is not None
    a.free(x)
    with pytest.raises(AssertionError, match="double free"):
        a.free(x[:1])
    y = a.alloc(4)
    assert y is not None
    with pytest.raises(AssertionError, match="more than once"):
        a.free(torch.tensor([y[0].item(), y[0].item()]))


def test_clear_restores_everything() -> None:
    a = TokenSlotAllocator(5)
    assert a.alloc(3) is not None
    a.clear()
    assert a.available_size() == 5 and a.num_slots == 5
    assert sorted(a.free_slots().tolist()) == [1, 2, 3, 4, 5]


def test_allocator_rejects_zero_slots() -> None:
    with pytest.raises(ValueError, match="num_slots"):
        TokenSlotAllocator(0)


# ---------------------------------------------------------------- ReqToTokenPool


def test_req_to_token_rows_reused() -> None:
    p = ReqToTokenPool(2, 8)
    assert p.req_to_token.shape == (2, 8) and p.req_to_token.dtype == torch.int32
    r0, r1 = p.alloc(), p.alloc()
    assert {r0, r1} == {0, 1}
    assert p.alloc() is None and p.available_size() == 0
    assert r0 is not None
    p.free(r0)
    assert p.available_size() == 1
    assert p.alloc() == r0
    with pytest.raises(AssertionError, match="double free"):
        p.free(r0)
        p.free(r0)
    p.clear()
    assert p.available_size() == 2


def test_req_to_token_reserved_row_survives_clear() -> None:
    p = ReqToTokenPool(3, 4)
    spare = p.reserve()
    assert spare == 0 and p.reserved_rows() == [0] and p.available_size() == 2
    p.alloc()
    p.clear()  # a failed step's recovery: every row free but the reserved one
    assert p.available_size() == 2 and sorted(p.free_rows()) == [1, 2]
    assert {p.alloc(), p.alloc()} == {1, 2} and p.alloc() is None


# ---------------------------------------------------------------- TokenToKVPool


def test_kv_pool_set_get_roundtrip() -> None:
    pool = TokenToKVPool(8, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float16)
    k_buf, v_buf = pool.get_kv(1)
    assert k_buf.shape == (9, 2, 4) and v_buf.dtype == torch.float16
    slots = torch.tensor([3, 7], dtype=torch.int64)
    k = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(0))
    v = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(1))
    pool.set_kv(1, slots, k, v)
    k_buf, v_buf = pool.get_kv(1)
    torch.testing.assert_close(k_buf[slots], k.half())
    torch.testing.assert_close(v_buf[slots], v.half())
    assert float(pool.get_kv(0)[0].abs().sum()) == 0.0  # other layers untouched
    with pytest.raises(AssertionError, match="expected"):
        pool.set_kv(0, slots, k[:1], v)


def test_kv_pool_budget_math() -> None:
    per = TokenToKVPool.bytes_per_slot(4, 2, 8, torch.bfloat16)
    assert per == 2 * 4 * 2 * 8 * 2
    assert TokenToKVPool.slots_for_budget(per * 101, 4, 2, 8, torch.bfloat16) == 100
    with pytest.raises(ValueError, match=f"{per} bytes per slot"):
        TokenToKVPool.slots_for_budget(per * MIN_USEFUL_SLOTS, 4, 2, 8, torch.bfloat16)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e5m2])
def test_kv_pool_on_cpu_is_zero_and_costs_its_pages_only_as_they_fill(dtype: torch.dtype) -> None:
    """The buffers read as zeros, but a fresh pool does not write them: its resident memory
    grows only as slots are written (torch.zeros wrote them all up front). Each buffer is over
    glibc's largest mmap threshold (32 MiB), so calloc maps fresh pages for it."""
    before = _rss_bytes()
    pool = TokenToKVPool(num_slots=(1 << 19) - 1, num_layers=2, num_kv_heads=4, head_dim=32, dtype=dtype)
    k0, v0 = pool.get_kv(0)
    assert k0.dtype == dtype and tuple(k0.shape) == (1 << 19, 4, 32)
    pool_bytes = 2 * 2 * k0.numel() * k0.element_size()
    assert k0.numel() * k0.element_size() >= 64 << 20
    assert _rss_bytes() - before < pool_bytes // 8, (before, _rss_bytes(), pool_bytes)
    slots = torch.tensor([1, 5000, (1 << 19) - 1])
    k = torch.ones(3, 4, 32)
    pool.set_kv(1, slots, k, -k)
    k3, v3 = pool.get_kv(1)
    assert torch.equal(k3[slots].float(), k) and torch.equal(v3[slots].float(), -k)
    k_buf, v_buf = pool.get_kv(0)
    assert not k_buf.float().any() and not v_buf.float().any()
    assert k3.float().abs().sum().item() == 3 * 4 * 32

"""The KV cache storage: per-layer K and V buffers indexed by token slot.

Row 0 of every buffer is the dummy slot (padded writes land there), rows 1..num_slots
belong to the slots that `TokenSlotAllocator` hands out.

The storage dtype is the model dtype, or torch.float8_e5m2 for an fp8 KV cache: K/V are cast
on store (no scales) and upcast by the attention backends on read, so a slot costs half the
bytes of bf16 and the same memory budget holds twice the slots.
"""

from __future__ import annotations

import numpy as np
import torch

# Below this many slots a pool cannot hold even one short prompt plus its decode; treat the
# budget as a configuration mistake rather than starting a server that can serve nothing.
MIN_USEFUL_SLOTS = 16


# storage dtypes the attention backends read: the model dtypes, and e5m2 as the fp8 KV cache
KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e5m2)


_NUMPY_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32}  # all-zero bits are 0.0 in every KV dtype


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer. On the CPU its memory comes from calloc (numpy), which gets large blocks
    as fresh pages the OS zeroes when first touched, instead of torch.zeros writing every byte
    up front: a pool's pages cost only as its slots fill (the embedded model's default pool,
    755 MB, took ~0.8 s of an Engine start to zero-fill)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(shape, dtype=_NUMPY_BITS[size])).view(dtype)


def _dtype_size(dtype: torch.dtype) -> int:
    """Bytes of one pool element; ValueError for a dtype the attention backends cannot read."""
    if dtype not in KV_DTYPES:
        raise ValueError(f"KV pool dtype must be one of {', '.join(str(d) for d in KV_DTYPES)}, got {dtype}")
    return torch.empty((), dtype=dtype).element_size()


class TokenToKVPool:
    """K and V buffers: `k_buffers[l]`, `v_buffers[l]` each [num_slots + 1, kv_heads, head_dim]."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ) -> None:
        """Allocate zeroed buffers of `dtype` (one of KV_DTYPES) for `num_slots` usable slots
        (plus the dummy row 0)."""
        _dtype_size(dtype)  # the dtype check
        for name, value in (("num_slots", num_slots), ("num_layers", num_layers),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_slots = int(num_slots)
        self.num_layers = int(num_layers)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (self.num_slots + 1, self.num_kv_heads, self.head_dim)
        self.k_buffers: list[torch.Tensor] = [_zeros(shape, dtype, self.device) for _ in range(self.num_layers)]
        self.v_buffers: list[torch.Tensor] = [_zeros(shape, dtype, self.device) for _ in range(self.num_layers)]

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of `n` tokens into `layer` at `slots` (int64 [n]).

        Requires k, v of shape [n, kv_heads, head_dim]; they are cast to the pool dtype
        (rounded to nearest even into an fp8 pool).
        Slot 0 may appear (padding); its contents are garbage by design.
        """
        n = slots.shape[0]
        expected = (n, self.num_kv_heads, self.head_dim)
        assert tuple(k.shape) == expected, f"k has shape {tuple(k.shape)}, expected {expected}"
        assert tuple(v.shape) == expected, f"v has shape {tuple(v.shape)}, expected {expected}"
        self.k_buffers[layer][slots] = k.to(self.dtype)
        self.v_buffers[layer][slots] = v.to(self.dtype)

    def get_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (K, V) buffers of `layer`, each [num_slots + 1, kv_heads, head_dim] (no copy)."""
        return self.k_buffers[layer], self.v_buffers[layer]

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one token slot costs across all layers, K and V together, stored as `dtype`."""
        return 2 * num_layers * num_kv_heads * head_dim * _dtype_size(dtype)

    @staticmethod
    def slots_for_budget(
        budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """How many usable slots fit in `budget_bytes` (the dummy row 0 is paid for too).

        Raises ValueError when fewer than MIN_USEFUL_SLOTS fit.
        """
        per_slot = TokenToKVPool.bytes_per_slot(num_layers, num_kv_heads, head_dim, dtype)
        slots = int(budget_bytes) // per_slot - 1
        if slots < MIN_USEFUL_SLOTS:
            raise ValueError(
                f"KV budget of {int(budget_bytes)} bytes holds only {max(slots, 0)} token slots at "
                f"{per_slot} bytes per slot; at least {MIN_USEFUL_SLOTS} are needed "
                f"(need >= {(MIN_USEFUL_SLOTS + 1) * per_slot} bytes): raise the memory fraction "
                f"or use a smaller model / dtype (or kv_cache_dtype fp8_e5m2: one byte an element)"
            )
        return slots

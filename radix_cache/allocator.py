"""Free-list allocator of KV token slots.

Slots are row indices into the per-layer K/V buffers of `TokenToKVPool`. Usable slots are
1..num_slots; slot 0 is a dummy row that padded writes (e.g. CUDA-graph padding) may
scribble on, so it is never handed out.

The free list is an int64 CPU tensor so that a batch of n slots is allocated with one slice
and freed with one append. Frees are buffered as a list of pending tensors and concatenated
only when an allocation needs them, which keeps `free` O(1) amortised per call.
"""

from __future__ import annotations

import torch


class TokenSlotAllocator:
    """Hands out and takes back KV slot indices (page size 1).

    Allocation takes from the front of the free list and frees append to the back, so a
    freshly freed slot is reused last (a cheap guard against use-after-free bugs showing up
    as silently correct output).
    """

    def __init__(self, num_slots: int, device: str | torch.device = "cpu", debug: bool = False) -> None:
        """Create an allocator whose free list holds slots 1..num_slots.

        `device` is where `alloc` places the returned tensors (the free list itself stays on
        the CPU). `debug=True` makes every `free` verify that no slot is freed twice, at a
        cost of O(num_slots) per call; integrity checks in tests use it.
        """
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self._num_slots = int(num_slots)
        self.device = torch.device(device)
        self.debug = debug
        self.clear()

    # ------------------------------------------------------------------ public API

    @property
    def num_slots(self) -> int:
        """Number of usable slots (slot 0 excluded)."""
        return self._num_slots

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` free slots; returns int64 [n] on `self.device`, or None if fewer are free.

        Nothing changes when None is returned. n == 0 returns an empty tensor.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of slots ({n})")
        if n > self._size:
            return None
        if n > self._free.numel():
            self._flush_pending()
        out = self._free[:n]
        self._free = self._free[n:]
        self._size -= n
        # clone so the caller never holds a view of the free-list storage
        return out.to(self.device, copy=True)

    def free(self, slots: torch.Tensor) -> None:
        """Return `slots` (int64 [n], any device) to the free list.

        Requires every slot to be in 1..num_slots and currently allocated. Slot 0 and
        out-of-range slots always raise AssertionError; double frees are detected when the
        allocator was built with `debug=True`.
        """
        if slots.numel() == 0:
            return
        slots = slots.reshape(-1).to("cpu", torch.int64)
        assert int(slots.min()) >= 1, "slot 0 is the dummy slot and is never allocated; it must not be freed"
        assert int(slots.max()) <= self._num_slots, (
            f"slot {int(slots.max())} is out of range 1..{self._num_slots}"
        )
        if self.debug:
            self._debug_check_free(slots)
        # copy: the caller may later overwrite the tensor it passed in
        self._pending.append(slots.clone())
        self._size += slots.numel()

    def available_size(self) -> int:
        """Number of slots that `alloc` can hand out right now."""
        return self._size

    def clear(self) -> None:
        """Mark every slot 1..num_slots free again (drops all outstanding allocations)."""
        self._free = torch.arange(1, self._num_slots + 1, dtype=torch.int64)
        self._pending: list[torch.Tensor] = []
        self._size = self._num_slots

    def free_slots(self) -> torch.Tensor:
        """A copy of the free list, int64 [available_size()] on the CPU (for integrity checks)."""
        self._flush_pending()
        return self._free.clone()

    # ------------------------------------------------------------------ internal helpers

    def _flush_pending(self) -> None:
        if self._pending:
            self._free = torch.cat([self._free, *self._pending])
            self._pending = []
        assert self._free.numel() == self._size

    def _debug_check_free(self, slots: torch.Tensor) -> None:
        """Assert that none of `slots` is already free nor repeated within `slots`."""
        counts = torch.bincount(slots, minlength=self._num_slots + 1)
        repeated = torch.nonzero(counts > 1).reshape(-1)
        assert repeated.numel() == 0, f"slots {repeated.tolist()} appear more than once in one free() call"
        self._flush_pending()
        already = slots[torch.isin(slots, self._free)]
        assert already.numel() == 0, f"double free of slots {already.tolist()}"

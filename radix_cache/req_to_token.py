"""The request-to-token table: one row per running request, position -> KV slot.

Attention kernels read a request's KV through this table: row `r`, column `p` holds the KV
slot of the token at position `p` of the request that owns row `r`. Rows are reused after
a request finishes; stale entries past a request's length are never read.
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """A fixed table `req_to_token` int32 [max_requests, max_context_len] plus a row free list."""

    def __init__(self, max_requests: int, max_context_len: int, device: str | torch.device = "cpu") -> None:
        """Allocate the (zeroed) table on `device`; every row starts free."""
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        if max_context_len < 1:
            raise ValueError(f"max_context_len must be >= 1, got {max_context_len}")
        self.max_requests = int(max_requests)
        self.max_context_len = int(max_context_len)
        self.device = torch.device(device)
        self._reserved: list[int] = []  # rows taken for good (reserve()): clear() keeps them
        # [max_requests, max_context_len]; int32 halves the bytes the attention kernels read
        self.req_to_token = torch.zeros(
            (self.max_requests, self.max_context_len), dtype=torch.int32, device=self.device
        )
        self.clear()

    def alloc(self) -> int | None:
        """Take a free row index, or None when all rows are in use."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._is_free[row] = False
        return row

    def reserve(self) -> int | None:
        """Take a free row for good (CUDA-graph padding): never handed out again, even after
        :meth:`clear`. None when all rows are in use."""
        row = self.alloc()
        if row is not None:
            self._reserved.append(row)
        return row

    def free(self, row: int) -> None:
        """Return `row` to the free list. Requires that it is currently allocated."""
        assert 0 <= row < self.max_requests, f"row {row} is out of range 0..{self.max_requests - 1}"
        assert not self._is_free[row], f"double free of request row {row}"
        self._is_free[row] = True
        self._free_rows.append(row)

    def free_rows(self) -> list[int]:
        return list(self._free_rows)

    def reserved_rows(self) -> list[int]:
        return list(self._reserved)

    def available_size(self) -> int:
        """Number of free rows."""
        return len(self._free_rows)

    def clear(self) -> None:
        """Mark every row free but the reserved ones (table contents are left as they are:
        stale, never read; a reserved row's are its owner's)."""
        # reversed so that pop() hands out row 0 first, which keeps tests readable
        self._free_rows: list[int] = [r for r in range(self.max_requests - 1, -1, -1) if r not in self._reserved]
        self._is_free: list[bool] = [r not in self._reserved for r in range(self.max_requests)]

"""Token bitmask helpers: allocate, reset, apply (pure torch reference), unpack.

Layout (shared with the Triton kernel in ``kernels/``): int32 ``[batch, ceil(vocab/32)]``;
bit ``t % 32`` of word ``t // 32`` set means token t is allowed. All bits set (-1) allows
every token, so rows of unconstrained requests are simply left at -1.
"""

from __future__ import annotations

import torch

__all__ = ["allocate_token_bitmask", "reset_bitmask_row", "apply_token_bitmask_ref", "bitmask_to_bool"]


def _num_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_token_bitmask(batch: int, vocab_size: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Return a new int32 bitmask ``[batch, ceil(vocab_size/32)]`` with every token allowed."""
    if batch < 0 or vocab_size <= 0:
        raise ValueError(f"need batch >= 0 and vocab_size > 0, got batch={batch}, vocab_size={vocab_size}")
    return torch.full((batch, _num_words(vocab_size)), -1, dtype=torch.int32, device=device)


def reset_bitmask_row(bitmask: torch.Tensor, row: int | None = None) -> None:
    """Set ``bitmask[row]`` (or every row when ``row`` is None) back to allow-all."""
    if row is None:
        bitmask.fill_(-1)
    else:
        bitmask[row].fill_(-1)


_SHIFTS_CACHE: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    t = _SHIFTS_CACHE.get(device)
    if t is None:
        t = torch.arange(32, dtype=torch.int32, device=device)
        _SHIFTS_CACHE[device] = t
    return t


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack an int32 bitmask ``[B, W]`` into a bool tensor ``[B, vocab_size]``.

    Tokens beyond ``W * 32`` (a bitmask narrower than the vocabulary) are disallowed.
    """
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be a 2-D int32 tensor, got {bitmask.dtype} {tuple(bitmask.shape)}")
    b, w = bitmask.shape
    # [B, W, 1] >> [32] -> [B, W, 32]; arithmetic shift of negative words is fine after & 1.
    bits = (bitmask.unsqueeze(-1) >> _shifts(bitmask.device)) & 1
    allowed = bits.reshape(b, w * 32).bool()
    if w * 32 >= vocab_size:
        return allowed[:, :vocab_size]
    pad = torch.zeros((b, vocab_size - w * 32), dtype=torch.bool, device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set ``logits[b, t] = -inf`` in place wherever bit t of ``bitmask[b]`` is clear.

    Requires ``logits`` ``[B, V]`` (float) and ``bitmask`` int32 ``[B, W]`` on the same
    device; tokens with ids >= W * 32 are masked.
    """
    if logits.dim() != 2 or bitmask.dim() != 2 or logits.shape[0] != bitmask.shape[0]:
        raise ValueError(
            f"need logits [B, V] and bitmask [B, W] with equal B, got {tuple(logits.shape)} and {tuple(bitmask.shape)}"
        )
    allowed = bitmask_to_bool(bitmask, logits.shape[1])
    logits.masked_fill_(~allowed, float("-inf"))

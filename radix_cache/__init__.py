"""treadle.radix_cache: KV slot allocator, request-to-token table, KV pool, radix prefix cache."""

from __future__ import annotations

from .allocator import TokenSlotAllocator
from .kv_pool import MIN_USEFUL_SLOTS, TokenToKVPool
from .radix_tree import MatchResult, RadixCache, TreeNode
from .req_to_token import ReqToTokenPool

__all__ = [
    "MIN_USEFUL_SLOTS",
    "MatchResult",
    "RadixCache",
    "ReqToTokenPool",
    "TokenSlotAllocator",
    "TokenToKVPool",
    "TreeNode",
]

"""Jump-forward retokenization planner (the compressed-FSM half lives in grammar/matcher).

When the grammar forces a string, appending that string's own tokens is usually not what
the tokenizer would have produced (tokens fuse across the boundary: ``"`` + ``,`` vs the
merged ``",``). The planner re-encodes the tail of the *output* plus the forced text,
keeps the common token prefix, and rolls back only what changed. The last forced token is
held back when it could still merge with what comes next, so the model writes that
boundary itself.

Scheduler contract: ``matcher.rollback(plan.num_rollback)``, then ``accept_token`` each of
``plan.new_token_ids`` (if any is rejected, undo and skip the jump); roll the KV cache back
by the same count and run the new ids as one extend step.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

__all__ = ["JumpPlan", "plan_jump_forward", "token_is_mergeable"]


class JumpPlan(NamedTuple):
    """Undo the last ``num_rollback`` output tokens, then append ``new_token_ids``."""

    num_rollback: int
    new_token_ids: list[int]


_NO_JUMP = JumpPlan(0, [])
_MAX_WIDEN = 4  # extra tail tokens tried when a re-encoding doesn't round-trip
# id(table) -> (table kept alive, set of byte strings that are a proper prefix of a token)
_prefix_cache: dict[int, tuple[list, frozenset[bytes]]] = {}
_prefix_lock = threading.Lock()


def _proper_prefixes(token_bytes: list[bytes | None]) -> frozenset[bytes]:
    key = id(token_bytes)
    with _prefix_lock:
        hit = _prefix_cache.get(key)
        if hit is not None and hit[0] is token_bytes:
            return hit[1]
    pre: set[bytes] = set()
    for b in token_bytes:
        if b:
            for k in range(1, len(b)):
                pre.add(b[:k])
    out = frozenset(pre)
    with _prefix_lock:
        if len(_prefix_cache) >= 8:
            _prefix_cache.clear()
        _prefix_cache[key] = (token_bytes, out)
    return out


def token_is_mergeable(token_bytes: list[bytes | None], token_id: int) -> bool:
    """True when some vocabulary token extends this token's bytes (it could fuse with text after it)."""
    b = token_bytes[token_id]
    return bool(b) and b in _proper_prefixes(token_bytes)


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Encode without special tokens (HF tokenizers and raw ``tokenizers.Tokenizer``)."""
    out = tokenizer.encode(text, add_special_tokens=False)
    return list(out.ids) if hasattr(out, "ids") else list(out)


def _bytes_of(token_bytes: list[bytes | None], ids: list[int]) -> bytes | None:
    parts = []
    for t in ids:
        b = token_bytes[t] if 0 <= t < len(token_bytes) else None
        if b is None:
            return None
        parts.append(b)
    return b"".join(parts)


def _canonical(tokenizer: Any, token_bytes: list[bytes | None], text: str) -> list[int] | None:
    """Tokenizer's encoding of ``text`` if it reproduces ``text`` byte for byte, else None."""
    want = text.encode("utf-8")
    ids = _encode(tokenizer, text)
    got = _bytes_of(token_bytes, ids)
    if got == want:
        return ids
    # Sentencepiece-style tokenizers prepend "▁" to the start of every encode; a text that
    # already starts with a space then comes back right when encoded without it.
    if got == b" " + want and text.startswith(" "):
        ids = _encode(tokenizer, text[1:])
        if _bytes_of(token_bytes, ids) == want:
            return ids
    return None


def _aligned_tail(
    token_bytes: list[bytes | None], output_ids: list[int], start: int, floor: int
) -> tuple[int, str | None]:
    """Move ``start`` to a character boundary; return it and the tail text (None if the
    output ends inside a character)."""
    tail = _bytes_of(token_bytes, output_ids[start:])
    assert tail is not None
    # Widen over the token holding the lead byte (a few tokens at most), else narrow the
    # tail past the continuation bytes.
    widened = 0
    while tail and tail[0] & 0xC0 == 0x80 and start > floor and widened < 4:
        start -= 1
        widened += 1
        tail = (token_bytes[output_ids[start]] or b"") + tail
    while tail and tail[0] & 0xC0 == 0x80:
        tail = tail[len(token_bytes[output_ids[start]] or b"") :]
        start += 1
    try:
        return start, tail.decode("utf-8")
    except UnicodeDecodeError:
        return start, None


def plan_jump_forward(
    tokenizer: Any,
    token_bytes: list[bytes | None],
    output_ids: list[int],
    jump_string: str,
    *,
    lookback: int = 3,
    holdback: int = 1,
) -> JumpPlan:
    """Plan how to append the forced ``jump_string`` after ``output_ids`` canonically.

    ``output_ids`` must be output tokens only (never the prompt: re-encoding across the
    prompt boundary fuses tokens the model never produced). Re-encodes the last
    ``lookback`` output tokens (widened to whole UTF-8 characters) plus the jump string,
    keeps the longest common token prefix with the old tail, and drops the final
    ``holdback`` tokens when the last one could merge with following text. Returns
    ``JumpPlan(0, [])`` when no safe progress is possible (empty jump, re-encoding that
    doesn't round-trip the bytes, or a plan that would add no text).
    """
    if lookback < 0 or holdback < 0:
        raise ValueError(f"lookback and holdback must be >= 0, got {lookback}, {holdback}")
    if not jump_string:
        return _NO_JUMP
    n = len(output_ids)
    floor = 0
    # Never re-encode across a special token (it has no text to re-encode).
    for i in range(n - 1, -1, -1):
        t = output_ids[i]
        if not 0 <= t < len(token_bytes) or token_bytes[t] is None:
            floor = i + 1
            break
    start = max(floor, n - lookback)
    # A tail that re-encodes to other bytes (a sentencepiece tokenizer prepending a space
    # to a tail that doesn't start with one) gets a few more tokens of context.
    for attempt in range(_MAX_WIDEN + 1):
        if attempt and start <= floor:
            return _NO_JUMP
        if attempt:
            start -= 1
        start, tail_text = _aligned_tail(token_bytes, output_ids, start, floor)
        if tail_text is None:
            return _NO_JUMP  # the output ends inside a character: nothing canonical to append
        new_ids = _canonical(tokenizer, token_bytes, tail_text + jump_string)
        if new_ids is not None:
            break
    else:
        return _NO_JUMP
    old = output_ids[start:]
    common = 0
    for a, b in zip(old, new_ids):
        if a != b:
            break
        common += 1
    add = new_ids[common:]
    if holdback and add and token_is_mergeable(token_bytes, add[-1]):
        add = add[: max(0, len(add) - holdback)]
    added = _bytes_of(token_bytes, add) or b""
    removed = _bytes_of(token_bytes, old[common:]) or b""
    if len(added) <= len(removed):
        return _NO_JUMP
    return JumpPlan(len(old) - common, add)

"""Unique string items: a JSON grammar's mask leaves out the tokens that would close a string
item equal to an earlier item of its array.

For the schemas unique_strings.py names (an array of unique free strings, ``set[str]``), the
regex writes that array as a plain list of strings, and the matcher (matcher.py) keeps the
items distinct: a small lexer follows the output (json_lexer.py's, which json_keys.py shares;
``ItemState``: the open containers, each object with its last key, each array checked or not
by its slot, the key it stands under or ROOT / ITEM, and a checked one with the strings it has
had as direct items), and the mask
leaves out every token that, run through the lexer, would close an item its array already
has. ``accept_token`` refuses the same tokens. Items and keys compare as decoded JSON strings
(``"a"`` and ``"\\u0061"`` are one value), as a validator compares them.

The checked arrays' string items can always be continued into a new value (unique_strings.py
says when the check is on), so after leaving those tokens out another always remains; were
none to remain, the mask is an error (a ``ValueError``: the request stops, it never writes a
repeated item).

Only tokens holding a quote can close a string (163 of SmolLM2's 49,152): those the row
allows are run through the lexer, where a checked array is open. After a reasoning block
(reasoning_prefix.py) the lexer starts at ``</think>``. Importing this module does not import
torch.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from treadle.constrained.decode.json_lexer import JsonLexer
from treadle.constrained.ebnf.reasoning_prefix import MODES
from treadle.constrained.index.vocabulary import per_table
from treadle.constrained.schema.unique_strings import ANY_KEY, ITEM, ROOT

__all__ = ["ItemIndex", "ItemState", "feed_items", "item_index", "items_start", "unique_items_start"]

# (open containers, innermost last: for an array the decoded strings it has had as direct items
#  where it is checked, False where not; for an object (its last key, decoded; whether a key
#  comes next); 0 outside a string, 1 in one, 2 after its backslash, 3 in a reasoning block
#  before the JSON, 4 before a reasoning block or the JSON; the raw bytes of the item or key
#  being written, None for another string, in a reasoning block its last bytes: json_lexer.py's
#  state; the slots whose arrays are checked: property names, ROOT, ITEM)
ItemState = tuple[tuple[Any, ...], int, "bytes | None", frozenset]

_QUOTE, _OPEN_ARR = ord('"'), ord("[")
_EMPTY: frozenset[str] = frozenset()


def _decoded(raw: bytes) -> str | bytes:
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:  # not a JSON string's inside (no grammar writes one): compared as written
        return raw


class _ItemLexer(JsonLexer):
    """An object's frame holds its last key; an array's is checked (a frozenset of its string
    items) by the slot it stands in; an item closing is a repeat where its array had it."""

    def open_array(self, stack: list, state: ItemState) -> Any:
        slots = state[3]
        if not stack:
            checked = ROOT in slots
        elif isinstance(stack[-1], tuple):  # the value of a key: that name's, or every key's (ANY_KEY)
            checked = stack[-1][0] in slots or ANY_KEY in slots
        else:
            checked = ITEM in slots
        return _EMPTY if checked else False

    def close_string(self, stack: list, raw: bytes) -> bool:
        value = _decoded(raw)
        top = stack[-1]
        if isinstance(top, frozenset):
            stack[-1] = top | {value}
            return value in top
        stack[-1] = (value, False)  # a key
        return False


# feed_items(state, data): the lexer's state after ``data``, and whether ``data`` closed a
# string item its (checked) array had had
feed_items = _ItemLexer().feed


def items_start(slots: frozenset, reasoning: str = "") -> ItemState:
    """The lexer's first state for a grammar checking the arrays at ``slots`` (``reasoning``:
    reasoning_prefix.py's mode, "" for none)."""
    if not reasoning:
        return ((), 0, None, slots)
    return ((), 3, b"", slots) if reasoning == MODES[0] else ((), 4, None, slots)


class ItemIndex:
    """The tokens of one vocabulary that can close a string (they hold a quote), and those that
    could open an array and write two items in it (a bracket and four quotes)."""

    def __init__(self, table: list[bytes | None], num_tokens: int) -> None:
        self.table = table
        self.quoted = np.array([i for i, b in enumerate(table[:num_tokens]) if b and _QUOTE in b], dtype=np.int64)
        self.opening = np.array([i for i in self.quoted.tolist()
                                 if table[i].count(b'"') >= 4 and _OPEN_ARR in table[i]], dtype=np.int64)

    def repeaters(self, state: ItemState, row: np.ndarray) -> list[int]:
        """The tokens ``row`` (an int32 mask row) allows that would repeat a string item."""
        frames, mode, _, _ = state
        if mode >= 3:
            return []
        candidates = self.quoted if any(isinstance(f, frozenset) for f in frames) else self.opening
        if not candidates.size:
            return []
        words = row.view(np.uint32)
        ids = candidates[candidates >> 5 < words.size]
        allowed = ids[(words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1 == 1]
        return [t for t in allowed.tolist() if feed_items(state, self.table[t])[1]]

    def filter(self, state: ItemState, row: np.ndarray) -> np.ndarray:
        """``row`` without the tokens that would repeat an item (a copy; ``row`` itself, a shared
        read-only row, when none would). ``ValueError`` where no token would remain."""
        drop = self.repeaters(state, row)
        if not drop:
            return row
        out = row.copy()
        words = out.view(np.uint32)
        for t in drop:
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        if not words.any():
            raise ValueError("uniqueItems: every token the grammar allows would repeat an array item")
        return out


def item_index(table: list[bytes | None], num_tokens: int) -> ItemIndex:
    """The ``ItemIndex`` of a bytes table (built once per table)."""
    return per_table(ItemIndex, table, num_tokens)


def unique_items_start(grammar: Any) -> ItemState | None:
    """Where a compiled grammar's item check starts, None for no check (``unique_slots`` None:
    the compiler's verdict, unique_strings.py)."""
    slots = getattr(grammar, "unique_slots", None)
    if slots is None:
        return None
    return items_start(slots, grammar.spec.reasoning)

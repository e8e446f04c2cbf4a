"""Unique keys: a JSON grammar's mask leaves out the tokens that would repeat a key of the
object being written.

Neither a regex nor the any-JSON pushdown automaton remembers which keys an open map
(``additionalProperties``, ``patternProperties``, a free-form object) has had, so a model
that loops writes ``{"tags":123,"tags":123,...}`` until ``max_tokens`` (SmolLM2 does, under
a Pydantic ``dict[str, int]``), and a parser keeps only the last of them. Declared
properties cannot repeat: the schema's regex writes each at most once and keeps declared
names out of the free keys. Free keys can, so a matcher of a JSON grammar (matcher.py) also
runs a small lexer over its output (json_lexer.py's, which unique_items.py shares; ``KeyState``:
the open containers, each object with the keys it has had, and the string being written), and
its mask leaves out every token that would close a key its object already has. Two kinds of
token can:

* one that finishes the key being written: the rest of a key already seen, then its closing
  quote (``"tag`` then ``s"``, ``"tags`` then ``":``), found from the token's *stem* (the
  bytes before that quote: ``s``, empty), by the seen keys or by the stems, whichever are
  fewer;
* one that holds a whole key between two of its quotes (``","`` holds the key ``,``), found
  in a map from the text between any two quotes of a token to the tokens.

Each candidate the grammar's row allows is run through the lexer, so the mask leaves out
exactly the tokens that repeat a key, and ``accept_token`` refuses exactly those. Where that
would leave no token at all (``propertyNames`` of two names under ``minProperties: 3``), the
grammar alone decides: unique keys give way to the grammar, never the other way round.

After a reasoning block (reasoning_prefix.py) the lexer starts at ``</think>``. Keys compare
as written (``"a"`` and ``"\\u0061"`` are two keys here). Importing this module does not
import torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from treadle.constrained.decode.json_lexer import JsonLexer
from treadle.constrained.ebnf.reasoning_prefix import MODES
from treadle.constrained.index.vocabulary import per_table

__all__ = ["KeyIndex", "KeyState", "START", "feed", "key_index", "schema_has_free_keys", "unique_keys_start"]

# (open containers, innermost last: (keys the object has had, a key may come next) for an
#  object, False for an array; 0 outside a string, 1 in one, 2 after its backslash,
#  3 in a reasoning block before the JSON, 4 before a reasoning block or the JSON; the key
#  being written, None when the string being written is not a key, in a reasoning block
#  its last bytes): json_lexer.py's state
KeyState = tuple[tuple["tuple[frozenset[bytes], bool] | bool", ...], int, "bytes | None"]
START: KeyState = ((), 0, None)
_THINKING: dict[str, KeyState] = dict(zip(MODES, (((), 3, b""), ((), 4, None))))  # reasoning_prefix.py's modes

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_EMPTY: frozenset[bytes] = frozenset()


class _KeyLexer(JsonLexer):
    """An object's frame holds the keys it has had; a key closing is a repeat where it is one of them."""

    object_frame = (_EMPTY, True)

    def close_string(self, stack: list, raw: bytes) -> bool:
        keys = stack[-1][0]
        stack[-1] = (keys | {raw}, False)
        return raw in keys


# feed(state, data): the lexer's state after ``data``, and whether ``data`` closed a key its
# object had had
feed = _KeyLexer().feed


def _stem(data: bytes, escaped: int) -> bytes | None:
    """The bytes of ``data`` before its first quote that ends a string (inside one, after a
    backslash when ``escaped``); None when no quote does."""
    for j, c in enumerate(data):
        if escaped:
            escaped = 0
        elif c == _BACKSLASH:
            escaped = 1
        elif c == _QUOTE:
            return data[:j]
    return None


class KeyIndex:
    """The tokens of one vocabulary that can close a key: by their *stem* (the bytes before the
    quote that would close a key being written, for a key that is not and one that is after a
    backslash), and by the text between any two of their quotes (a whole key inside)."""

    def __init__(self, table: list[bytes | None], num_tokens: int) -> None:
        self.table = table
        self._stems: tuple[dict[bytes, list[int]], dict[bytes, list[int]]] = ({}, {})
        self._inside: dict[bytes, list[int]] = {}
        self.two_keys: list[int] = []  # four quotes or more: two keys of one new object, maybe
        for i, b in enumerate(table[:num_tokens]):
            if not b or _QUOTE not in b:
                continue
            for escaped, stems in enumerate(self._stems):
                stem = _stem(b, escaped)
                if stem is not None:
                    stems.setdefault(stem, []).append(i)
            at = [j for j, c in enumerate(b) if c == _QUOTE]
            if len(at) >= 4:
                self.two_keys.append(i)
            for n, lo in enumerate(at):
                for hi in at[n + 1:]:
                    self._inside.setdefault(b[lo + 1:hi], []).append(i)
        self._inside_keys = frozenset(self._inside)

    def repeaters(self, state: KeyState, row: np.ndarray) -> list[int]:
        """The tokens ``row`` (an int32 mask row) allows that would repeat a key from ``state``."""
        frames, mode, key = state
        if mode >= 3:
            return []
        closing: list[int] = []  # they finish the key being written as one its object had
        if key is not None and frames[-1][0]:
            keys, n = frames[-1][0], len(key)
            stems = self._stems[mode - 1]
            if len(keys) <= len(stems):
                for k in keys:
                    if k.startswith(key):
                        closing += stems.get(k[n:], ())
            else:
                for stem, ids in stems.items():
                    if key + stem in keys:
                        closing += ids
        inside: list[int] = self.two_keys  # they hold a key whole: run through the lexer
        for frame in frames:
            keys = frame[0] if isinstance(frame, tuple) else None  # an object's keys (an array's frame is False)
            if keys and not keys.isdisjoint(self._inside_keys):
                for k in keys & self._inside_keys:
                    inside = inside + self._inside[k]
        if not closing and not inside:
            return []
        words = row.view(np.uint32)
        size = words.size
        out = [t for t in closing if t >> 5 < size and int(words[t >> 5]) >> (t & 31) & 1]
        out += [t for t in set(inside).difference(out)
                if t >> 5 < size and int(words[t >> 5]) >> (t & 31) & 1 and feed(state, self.table[t])[1]]
        return out

    def filter(self, state: KeyState, row: np.ndarray) -> np.ndarray:
        """``row`` without the tokens that would repeat a key (a copy; ``row`` itself, a shared
        read-only row, when none would or when that would leave no token)."""
        drop = self.repeaters(state, row)
        if not drop:
            return row
        out = row.copy()
        words = out.view(np.uint32)
        for t in drop:
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        return out if words.any() else row

    def refuses(self, state: KeyState, row: np.ndarray, token_id: int) -> bool:
        """Whether the filtered row leaves ``token_id`` out (it repeats a key, and other tokens
        remain)."""
        filtered = self.filter(state, row)
        return filtered is not row and not int(filtered.view(np.uint32)[token_id >> 5]) >> (token_id & 31) & 1


def key_index(table: list[bytes | None], num_tokens: int) -> KeyIndex:
    """The ``KeyIndex`` of a bytes table (built once per table)."""
    return per_table(KeyIndex, table, num_tokens)


_ONE = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "contains",
        "propertyNames", "not", "if", "then", "else")  # keywords whose value is a subschema
_MANY = ("prefixItems", "anyOf", "oneOf", "allOf", "extends")  # a list of them (draft-03's extends: or one)
# (items and additionalItems may be a list too, as draft-04's tuples)
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # a name -> subschema map
_OPEN = ("additionalProperties", "unevaluatedProperties", "patternProperties", "propertyNames")


def schema_has_free_keys(schema: Any) -> bool:
    """Whether a JSON schema's output under strict mode may hold an object key the schema does
    not name (a map, a free-form object, any value): where it cannot, no key can repeat and the
    check is skipped. True wherever unsure: an untyped schema, an open keyword."""
    if schema is True:
        return True
    if not isinstance(schema, dict):
        return False  # False: no output at all
    types = schema.get("type")
    if isinstance(types, list) and not all(isinstance(t, str) for t in types):
        return True  # draft-03: a type list holding schemas
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if types is None and not any(k in schema for k in ("enum", "const", "$ref", "anyOf", "oneOf", "allOf")):
        return True  # any value
    if any(k in schema and schema[k] is not False for k in _OPEN):
        return True
    if types is not None and "object" in types and not (isinstance(schema.get("properties"), dict) and schema["properties"]) \
            and schema.get("additionalProperties", True) is not False:
        return True  # a free-form object
    if types is not None and "array" in types and "items" not in schema and "prefixItems" not in schema:
        return True  # items of any value
    subs = [x for k in _ONE + _MANY if k in schema for x in (schema[k] if isinstance(schema[k], list) else [schema[k]])]
    subs += [x for k in _NAMED if isinstance(schema.get(k), dict) for x in schema[k].values()]
    return any(schema_has_free_keys(x) for x in subs)


def unique_keys_start(grammar: Any) -> KeyState | None:
    """Where a compiled grammar's key check starts, None for no check: a JSON schema's grammar
    (any JSON's too) writes JSON from its first byte, or after a reasoning block; one whose
    objects have declared keys only (``free_keys`` False: the compiler's verdict) cannot
    repeat one; a structural tag's JSON sits in free text, which the lexer cannot tell apart."""
    spec = getattr(grammar, "spec", None)
    if spec is None or spec.kind != "json_schema" or not getattr(grammar, "free_keys", True):
        return None
    return _THINKING[spec.reasoning] if spec.reasoning else START

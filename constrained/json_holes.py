"""Holes: the any-JSON values inside a schema's regex, run on the pushdown automaton.

A schema that allows any value somewhere (a member ``{}``, a free-form ``{"type": "object"}``
tool parameter, the items of an untyped array) used to make the regex backend unroll "any
JSON" two or three levels deep: tens of thousands of regex characters, seconds to tens of
seconds of token-index build, and no value nested deeper than that. With holes the schema
converter writes one placeholder character for each such value instead (``HOLE_CHARS``, by
kind: any value, any object, any array). The token index is built for the small regex over a
vocabulary with one pseudo-token per placeholder (ids after every real one), and the matcher
runs json_any.py's pushdown automaton between entering a hole and leaving it:

* at a token-FSM state with a transition on a placeholder pseudo-token (the "exits" of that
  state), a token may start a value of the hole's kind;
* inside a hole the automaton decides, and once the value could be complete, the regex after
  the placeholder may take over (leaving the hole);
* a value that cannot go on (a closed container, a string, a literal) leaves at once, so
  jump-forward sees the regex's forced text after it.

**Crossing tokens.** A token may cross a boundary mid-token (``":{"`` enters a hole,
``"},"`` leaves one, ``},{`` does both): ``Holes.walk`` runs its bytes, the regex part one
byte at a time through the index's single-byte tokens, trying the regex first and the hole
second wherever both could go on (a depth-first search, so every split is found). In compact
JSON a value follows ``:``, ``[``, ``,`` or starts the text, and is followed by ``,``, ``}``,
``]`` or ends it, so a token can only cross where those bytes are: the mask checks just the
few hundred tokens that hold one (``HoleTables.candidates``) with the walk, and the walk
refuses any other mid-token boundary, so mask and acceptance always agree.

**Soundness.** A string character class of the regex also matches the placeholders, so a
state that takes the *canary* placeholder (never written) is inside such a class and has no
exits. A path of real bytes never spells a placeholder where a hole is: the regex side
refuses the placeholders' shared lead byte (as it refuses it everywhere, index_markers.py;
tokens holding it go through the walk), while inside a hole a string may hold it. Holes
are used only for JSON schemas, without a whitespace pattern (the automaton is compact), and
not when the schema itself contains a placeholder or names that range
(``schema_allows_holes``).

Importing this module does not import torch.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from treadle.constrained.index_markers import RESERVED_LEAD, marker_token_ids
from treadle.constrained.index_markers import is_final as index_is_final
from treadle.constrained.json_any import JsonPushdown

__all__ = ["HOLE_CHARS", "Holes", "placeholder_vocabulary", "regex_has_holes", "schema_allows_holes"]

KINDS = ("value", "object", "array")
# Supplementary Private Use Area-B, next to the noncharacters U+10FFFE/F
HOLE_CHARS = {"value": "\U0010FFFD", "object": "\U0010FFFC", "array": "\U0010FFFB"}
CANARY_CHAR = "\U0010FFFA"  # never written into a regex: taking it means "inside a character class"
PLACEHOLDERS = (*(HOLE_CHARS[k] for k in KINDS), CANARY_CHAR)
_LEAD = RESERVED_LEAD  # the first UTF-8 byte of every placeholder (and of the index markers)
ENTRY_AFTER = frozenset(b":[,")  # a JSON value follows one of these (or starts the text)
EXIT_AT = frozenset(b",}]")  # and is followed by one of these (or ends it)
_ROWS_MAX = 4096  # cached hole-mode rows per grammar (6 KB each for a 49k vocabulary)


def placeholder_token_ids(table_size: int) -> tuple[int, ...]:
    """Pseudo-token ids of the placeholders (the three kinds, then the canary): after every
    id of a tokenizer with ``table_size`` tokens, so no mask ever allows one."""
    return tuple(table_size + i for i in range(len(PLACEHOLDERS)))


def placeholder_vocabulary(table_size: int) -> dict[bytes, list[int]]:
    """The placeholder entries every grammar vocabulary carries (vocabulary.py)."""
    return {c.encode(): [i] for c, i in zip(PLACEHOLDERS, placeholder_token_ids(table_size))}


def schema_allows_holes(schema_text: str) -> bool:
    """False when a schema (its JSON text) could itself produce a placeholder: it holds one,
    or names the code points near them (a pattern escape such as ``\\u{10FFFD}``)."""
    return not any(c in schema_text for c in PLACEHOLDERS) and "10fff" not in schema_text.lower()


def regex_has_holes(regex: str) -> bool:
    return any(c in regex for c in HOLE_CHARS.values())


class HoleTables:
    """What the holes need of one vocabulary, built once per ``JsonPushdown``."""

    def __init__(self, pda: JsonPushdown) -> None:
        table = pda.token_bytes
        eos = set(pda.eos_token_ids)
        ids = pda.tables.ids
        self.starts = (ids["VALUE"], ids["ROOT_OBJ"], ids["ROOT_ARR"])
        self.start_masks = tuple(pda.mask(s, ()) for s in self.starts)  # no EOS: nothing is final yet
        self.byte_token = [-1] * 256  # byte -> a token of exactly that byte
        self.token_of: dict[bytes, int] = {}  # bytes -> a token of exactly those bytes
        cands, lead = [], []
        for i in range(pda.num_tokens):
            b = table[i]
            if not b or i in eos:
                continue
            self.token_of.setdefault(b, i)
            if len(b) == 1 and self.byte_token[b[0]] < 0:
                self.byte_token[b[0]] = i
            if _LEAD in b:
                lead.append(i)
            elif any(b[j - 1] in ENTRY_AFTER or b[j] in EXIT_AT for j in range(1, len(b))):
                cands.append(i)
        self.candidates = tuple(cands)  # may cross a boundary mid-token
        self.lead = frozenset(lead)  # hold the placeholders' lead byte: always walked
        allowed = np.ones(pda.bitmask_words * 32, dtype=np.bool_)
        allowed[[e for e in pda.eos_token_ids if e < allowed.size]] = False
        self.not_eos = np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32)


_tables_lock = threading.Lock()


def hole_tables(pda: JsonPushdown) -> HoleTables:
    with _tables_lock:
        t = getattr(pda, "_hole_tables", None)
        if t is None:
            t = HoleTables(pda)
            pda._hole_tables = t  # type: ignore[attr-defined]
        return t


def _set(row: np.ndarray, token_id: int, on: bool) -> None:
    words = row.view(np.uint32)
    bit = np.uint32(1 << (token_id & 31))
    if on:
        words[token_id >> 5] |= bit
    else:
        words[token_id >> 5] &= ~bit


class Holes:
    """The holes of one compiled grammar: its index (outlines-core, built over a vocabulary
    with the placeholder pseudo-tokens), the shared automaton, and per-grammar caches.

    A configuration is (token-FSM state, hole): ``hole`` is None outside a hole, else the
    automaton's (state, stack); inside a hole the token-FSM state is the one after its
    placeholder, where the regex resumes. Thread-safe (caches fill idempotently)."""

    def __init__(self, pda: JsonPushdown, index: Any, table_size: int) -> None:
        self.pda = pda
        self.index = index
        self.t = hole_tables(pda)
        *self._kind_ids, self._canary = placeholder_token_ids(table_size)
        self._end = marker_token_ids(table_size, len(PLACEHOLDERS))[1]
        self._exits: dict[int, tuple[tuple[int, int], ...]] = {}
        self._continues: dict[int, bool] = {}
        self._rows: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ structure

    def exits(self, state: int) -> tuple[tuple[int, int], ...]:
        """(kind index, token-FSM state after the placeholder) for each hole starting at ``state``."""
        hit = self._exits.get(state)
        if hit is None:
            nxt = self.index.get_next_state
            if nxt(state, self._canary) is not None:
                hit = ()  # inside a character class that also matches placeholders
            else:
                hit = tuple((k, a) for k, tid in enumerate(self._kind_ids) if (a := nxt(state, tid)) is not None)
            self._exits[state] = hit
        return hit

    def settle(self, hole: tuple[int, tuple[int, ...]] | None) -> tuple[int, tuple[int, ...]] | None:
        """``hole``, or None when its value is complete and cannot go on (leave the hole now)."""
        if hole is None or hole[1] or hole[0] not in self.pda.tables.complete:
            return hole
        p = hole[0]
        cont = self._continues.get(p)
        if cont is None:
            cont = bool((self.pda.mask(p, ()) & self.t.not_eos).any())
            self._continues[p] = cont
        return hole if cont else None

    def is_final(self, state: int, hole: tuple[int, tuple[int, ...]] | None) -> bool:
        return (hole is None or self.pda.is_final(*hole)) and index_is_final(self.index, state, self._end)

    # ------------------------------------------------------------------ the walk

    def walk(self, state: int, hole: tuple | None, data: bytes) -> tuple[int, tuple | None] | None:
        """Run one token's bytes from a configuration: (token-FSM state, hole), or None."""
        return self._go(data, 0, state, hole)

    def _go(self, data: bytes, i: int, s: int, hole: tuple | None) -> tuple | None:
        if i == len(data):
            return s, self.settle(hole)
        pda = self.pda
        if hole is not None:
            p, st = hole
            p2, st2 = pda.run(p, st, data[i:i + 1])
            if p2:
                r = self._go(data, i + 1, s, (p2, st2))
                if r is not None:
                    return r
            if pda.is_final(p, st) and (i == 0 or data[i] in EXIT_AT):
                return self._go(data, i, s, None)  # leave the hole; the regex goes on
            return None
        t = self.t
        rest = data[i:]
        if _LEAD not in rest:  # the whole rest in the regex, as the index runs it
            tid = t.token_of.get(rest)
            if tid is not None:
                s2 = self.index.get_next_state(s, tid)
                if s2 is not None:
                    return s2, None
        ex = self.exits(s)
        b = data[i]
        tb = t.byte_token[b]
        if tb >= 0 and b != _LEAD:  # the lead byte could spell a placeholder or an index marker
            s2 = self.index.get_next_state(s, tb)
            if s2 is not None:
                r = self._go(data, i + 1, s2, None)
                if r is not None:
                    return r
        if ex and (i == 0 or data[i - 1] in ENTRY_AFTER):
            for k, after in ex:
                p, st = pda.run(t.starts[k], (), rest[:1])
                if p:
                    r = self._go(data, i + 1, after, (p, st))
                    if r is not None:
                        return r
        return None

    # ------------------------------------------------------------------ masks

    def outer_row(self, state: int, row: np.ndarray) -> np.ndarray:
        """Complete ``row`` (the index's tokens at ``state``, fresh, EOS decided) in place with
        the tokens that start a hole here or cross into one."""
        for k, _ in self.exits(state):
            row |= self.t.start_masks[k]
        self._scan(row, state, None)
        return row

    def hole_row(self, state: int, hole: tuple, outer_row: Any) -> np.ndarray:
        """Tokens allowed inside ``hole`` (``state``: after its placeholder); ``outer_row(s)``
        gives the regex's row at a state. Read-only."""
        p, st = hole
        pda = self.pda
        if len(st) > pda.k:  # no token closes this many containers: nothing can leave
            return pda.mask(p, st) & self.t.not_eos
        key = (p, st, state)
        row = self._rows.get(key)
        if row is None:
            row = pda.mask(p, st) & self.t.not_eos
            if pda.is_final(p, st):
                row |= outer_row(state)
            self._scan(row, state, hole)
            with self._lock:
                if len(self._rows) >= _ROWS_MAX:
                    self._rows.clear()
                row = self._rows.setdefault(key, row)
        return row

    def _scan(self, row: np.ndarray, state: int, hole: tuple | None) -> None:
        table = self.pda.token_bytes
        for tid in self.t.candidates:
            if self.walk(state, hole, table[tid]) is not None:
                _set(row, tid, True)
        for tid in self.t.lead:  # the walk decides these either way
            _set(row, tid, self.walk(state, hole, table[tid]) is not None)

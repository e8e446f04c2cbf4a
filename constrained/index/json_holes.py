"""Holes and calls: the any-JSON values and the recursive ``$ref``s inside a schema's regex
(and the nesting rules of an EBNF grammar).

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

**Calls.** A recursive ``$ref`` (a tree's ``children``, an expression's ``args``) was unrolled
the same way, three levels. Now it is a call placeholder (``CALL_CHARS[i]``) and its
definition is converted once and appended to the regex as a branch no output can take,
``(?:root)|ENTRY CALL_i (?:definition i)`` (``with_definitions``), so one index holds them
all. A call pushes the state after its placeholder and goes, without reading, to where the
index is after ``ENTRY CALL_i``; where the definition is complete (the end marker could
follow, index_markers.py) the call may return, and it returns at once when its value cannot
go on. Recursion is as deep as the output; a definition entered again at the same byte
without reading one is not entered (no endless left recursion); a call whose return state is
complete and cannot go on is a tail call, and pushes nothing. EBNF grammars use calls too
(ebnf.py): their nesting rules are definitions the same way.

**Crossing tokens.** A token may cross a boundary mid-token (``":{"`` enters a hole,
``"},"`` leaves one, ``},{`` does both; ``}]}`` returns from two calls): the walk (``_go``)
runs its bytes, the regex part one byte at a time through the index's single-byte tokens. In
compact JSON a value follows ``:``, ``[``, ``,`` or starts the text, and is followed by ``,``,
``}``, ``]`` or ends it, so a token can only cross where those bytes are: the mask checks just
the few hundred tokens that hold one (``Holes.candidates``) with the walk, and the walk
refuses any other mid-token boundary, so mask and acceptance always agree. Those bytes are
the grammar's ``Bounds``: for an EBNF grammar, the bytes that can come before, begin, end
and follow a called rule (ebnf_calls.py), a candidate holding a (before, first) or (last,
after) pair. A mask row walks only candidates the row lacks whose first byte it allows,
and skips those whose first two or three bytes the walk refuses; candidates that only start
a call (`` foo`` after ``(``: ``HoleTables.simple_entries``) are decided in bulk, their rests
run at once through a byte table of the index (``_scan_entries``). Rows are cached by the
open calls their walks read (``_row``), so deeper nesting reuses them.

**More than one reading.** A prefix may be read two ways: under ``anyOf`` of a free-form
object and a declared one, ``{"x":1`` is inside the hole of the first and the regex of the
second, and only the first allows ``.5`` next. The walk finds every reading (a depth-first
search over the splits), and a matcher keeps the set of configurations (``Config``), most
often one; its mask is the union of theirs and EOS is allowed where any is final.

**Soundness.** A string character class of the regex also matches the placeholders, so a
state that takes the *canary* placeholder (never written) is inside such a class and has no
exits. A path of real bytes never spells a placeholder where a hole is: the regex side
refuses the placeholders' shared lead byte (as it refuses it everywhere, index_markers.py;
tokens holding it go through the walk), while inside a hole a string may hold it. Holes
and calls are used for JSON schemas without a whitespace pattern (the automaton is
compact), and not when the schema itself contains a placeholder or names that range
(``schema_allows_holes``); calls for EBNF grammars that name no code point there, whose
negated classes leave the placeholders out (so no class hides a call).

Importing this module does not import torch.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from treadle.constrained.index.index_markers import RESERVED_LEAD, reserved_token_ids
from treadle.constrained.index.json_any import JsonPushdown

__all__ = ["CALL_CHARS", "HOLE_CHARS", "PLACEHOLDER_RANGE", "Holes", "placeholder_vocabulary", "regex_has_holes", "schema_allows_holes",
           "with_definitions"]

KINDS = ("value", "object", "array")
# Supplementary Private Use Area-B, next to the noncharacters U+10FFFE/F
HOLE_CHARS = {"value": "\U0010FFFD", "object": "\U0010FFFC", "array": "\U0010FFFB"}
CANARY_CHAR = "\U0010FFFA"  # never written into a regex: taking it means "inside a character class"
ENTRY_CHAR = "\U0010FFF7"  # opens a definition's branch: (?:root)|ENTRY CALL_i (?:definition i)|...
MAX_CALLS = 16  # recursive definitions a regex can call; a schema with more unrolls its $refs
CALL_CHARS = tuple(chr(0x10FFE0 + i) for i in range(MAX_CALLS))  # a value of definition i
PLACEHOLDERS = (*(HOLE_CHARS[k] for k in KINDS), CANARY_CHAR, ENTRY_CHAR, *CALL_CHARS)
WRITTEN = frozenset((*HOLE_CHARS.values(), ENTRY_CHAR, *CALL_CHARS))  # what a regex with holes may hold
# U+10FFE0-U+10FFFD, all the placeholders (calls, the entry, the index markers, the canary, the
# holes) as a class range whose ends a regex with holes may name: negated classes that must not
# take a placeholder (a free-text run beside calls) leave it out
PLACEHOLDER_RANGE = f"{CALL_CHARS[0]}-{HOLE_CHARS['value']}"
_LEAD = RESERVED_LEAD  # the first UTF-8 byte of every placeholder (and of the index markers)
ENTRY_AFTER = frozenset(b":[,")  # a JSON value follows one of these (or starts the text)
EXIT_AT = frozenset(b",}]")  # and is followed by one of these (or ends it)
_ROWS_MAX = 4096  # cached configuration rows per grammar (6 KB each for a 49k vocabulary)
_STEPS_MAX = 1 << 16  # cached walks per grammar
_PAIRS_AT = 256  # a scan with more tokens to walk first drops those whose first two bytes the walk refuses

_ANY_BYTE = frozenset(range(256))
# (bytes a value may follow, its first bytes, its last bytes, bytes that may follow it)
Bounds = tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int]]
JSON_BOUNDS: Bounds = (ENTRY_AFTER, _ANY_BYTE, _ANY_BYTE, EXIT_AT)
Hole = tuple[int, tuple[int, ...]]  # the automaton's (state, stack)
Config = tuple[int, "Hole | None", tuple[int, ...]]  # (token-FSM state, open hole, return states of open calls)


def placeholder_token_ids(table_size: int) -> tuple[int, ...]:
    """Pseudo-token ids of ``PLACEHOLDERS`` (the three kinds, the canary, the entry, the
    calls): after every id of a tokenizer with ``table_size`` tokens, so no mask allows one."""
    return tuple(table_size + i for i in range(len(PLACEHOLDERS)))


def placeholder_vocabulary(table_size: int) -> dict[bytes, list[int]]:
    """The placeholder entries every grammar vocabulary carries (vocabulary.py)."""
    return {c.encode(): [i] for c, i in zip(PLACEHOLDERS, placeholder_token_ids(table_size))}


def schema_allows_holes(schema_text: str) -> bool:
    """False when a schema (its JSON text) could itself produce a placeholder: it holds one,
    or names the code points near them (a pattern escape such as ``\\u{10FFFD}``)."""
    low = schema_text.lower()
    return not any(c in schema_text for c in PLACEHOLDERS) and "10fff" not in low and "10ffe" not in low


def regex_has_holes(regex: str) -> bool:
    return any(c in regex for c in WRITTEN)


def with_definitions(root: str, definitions: list[str]) -> str:
    """The regex of a root with the definitions its calls name (``CALL_CHARS[i]`` is a value of
    ``definitions[i]``): each behind the entry placeholder and its call, where no output goes."""
    if not definitions:
        return root
    return f"(?:{root})" + "".join(f"|{ENTRY_CHAR}{CALL_CHARS[i]}(?:{d})" for i, d in enumerate(definitions))


class HoleTables:
    """What the holes need of one vocabulary, built once per ``JsonPushdown``."""

    def __init__(self, pda: JsonPushdown) -> None:
        table = pda.token_bytes
        eos = set(pda.eos_token_ids)
        ids = pda.tables.ids
        self.starts = (ids["VALUE"], ids["ROOT_OBJ"], ids["ROOT_ARR"])
        self.start_masks = tuple(pda.mask(s, ()) for s in self.starts)  # no EOS: nothing is final yet
        self.pda_ids = pda.ids
        self.byte_token = [-1] * 256  # byte -> a token of exactly that byte
        self.token_of: dict[bytes, int] = {}  # bytes -> a token of exactly those bytes
        # hold the placeholders' lead byte (index_markers.py): always walked
        self.lead = frozenset(i for i in reserved_token_ids(table) if i < pda.num_tokens and i not in eos)
        for i in range(pda.num_tokens):
            b = table[i]
            if not b or i in eos:
                continue
            self.token_of.setdefault(b, i)
            if len(b) == 1 and self.byte_token[b[0]] < 0:
                self.byte_token[b[0]] = i
        # (byte, its token) for the bytes the regex side reads one at a time (_go, _bytes_from)
        self.byte_steps = tuple((b, t) for b, t in enumerate(self.byte_token) if t >= 0 and b != _LEAD)
        bt = np.asarray(self.byte_token, dtype=np.int64)
        self.no_byte_token = bt < 0  # a byte with no token of its own: not a filter
        self.byte_token_index = np.where(bt < 0, 0, bt)
        # the automaton's byte matrix (real tokens, longest first): the pairs of adjacent bytes
        m = pda.matrix
        lens = np.asarray([len(table[i]) for i in pda.ids.tolist()], dtype=np.int64)
        self._pairs = (m[:, :-1], m[:, 1:], np.arange(max(m.shape[1] - 1, 0))[None, :] + 1 < lens[:, None])
        self._crossing: dict[Bounds, tuple[tuple[int, ...], frozenset[int]]] = {}
        self._simple: dict[Bounds, tuple] = {}
        self._pairs_by_bounds: dict[Bounds, np.ndarray] = {}
        self.table = table
        allowed = np.ones(pda.bitmask_words * 32, dtype=np.bool_)
        allowed[[e for e in pda.eos_token_ids if e < allowed.size]] = False
        self.not_eos = np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32)

    def crossing(self, bounds: Bounds) -> tuple[tuple[int, ...], frozenset[int]]:
        """(the tokens that may cross a boundary mid-token under ``bounds``: two adjacent
        bytes (before, first) or (last, after) of it; those and the lead-byte tokens, which
        are never read whole on a fast path). Cached per bounds."""
        hit = self._crossing.get(bounds)
        if hit is None:
            left, right, inside = self._pairs
            sets = [np.zeros(256, dtype=np.bool_) for _ in bounds]
            for table, members in zip(sets, bounds):
                table[list(members)] = True
            before, first, last, after = sets
            cross = ((before[left] & first[right]) | (last[left] & after[right])) & inside
            ids = self.pda_ids[cross.any(axis=1)].tolist()
            cands = tuple(sorted(i for i in ids if i not in self.lead))
            hit = self._crossing[bounds] = (cands, frozenset(cands) | self.lead)
        return hit

    def pair_codes(self, bounds: Bounds) -> np.ndarray:
        """By token id: the first two bytes of each crossing token under ``bounds`` as one
        number (``b0 << 8 | b1``), -1 for the others and one-byte tokens. Cached per bounds."""
        hit = self._pairs_by_bounds.get(bounds)
        if hit is None:
            hit = np.full(len(self.table), -1, dtype=np.int64)
            for i in self.crossing(bounds)[0]:
                b = self.table[i]
                if len(b) > 1:
                    hit[i] = b[0] << 8 | b[1]
            hit = self._pairs_by_bounds.setdefault(bounds, hit)
        return hit

    def simple_entries(self, bounds: Bounds) -> tuple[dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]],
                                                       np.ndarray]:
        """The crossing tokens under ``bounds`` (not JSON's) whose one boundary is a call's
        start: a single adjacent pair in them, a (before, first) pair and not a (last,
        after) one, and every byte after it one a token of its own can read. By the bytes
        before the pair (the head): their ids, the bytes after it (a zero-padded matrix) and
        their lengths. And which ids are such. Cached per bounds."""
        hit = self._simple.get(bounds)
        if hit is None:
            before, first, last, after = bounds
            readable = {b for b, _ in self.byte_steps}
            groups: dict[bytes, tuple[list[int], list[bytes]]] = {}
            for tid in self.crossing(bounds)[0]:
                b = self.table[tid]
                pairs = [j for j in range(1, len(b)) if (b[j - 1] in before and b[j] in first)
                         or (b[j - 1] in last and b[j] in after)]
                if len(pairs) != 1 or (b[pairs[0] - 1] in last and b[pairs[0]] in after):
                    continue
                j = pairs[0]
                if not readable.issuperset(b[j:]):
                    continue
                ids, rests = groups.setdefault(b[:j], ([], []))
                ids.append(tid)
                rests.append(b[j:])
            simple = np.zeros(len(self.table), dtype=np.bool_)
            out = {}
            for head, (ids, rests) in groups.items():
                lens = np.asarray([len(r) for r in rests], dtype=np.int64)
                mat = np.zeros((len(rests), int(lens.max())), dtype=np.uint8)
                for k, r in enumerate(rests):
                    mat[k, :len(r)] = np.frombuffer(r, dtype=np.uint8)
                out[head] = (np.asarray(ids, dtype=np.int64), mat, lens)
                simple[ids] = True
            hit = self._simple[bounds] = (out, simple)
        return hit


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
    """The holes and calls of one compiled grammar: its index (outlines-core, built over a
    vocabulary with the placeholder pseudo-tokens), the shared automaton, and per-grammar
    caches.

    A configuration (``Config``) is (token-FSM state, hole, calls): ``hole`` is None outside a
    hole, else the automaton's (state, stack), and the token-FSM state is then the one after
    its placeholder, where the regex resumes; ``calls`` holds the states after the call
    placeholders of the open calls, innermost last. A matcher holds a set of them: where a
    prefix can be read two ways (a free-form object beside a declared one, both after
    ``{"x":1``), both are kept until one dies. Thread-safe (caches fill idempotently)."""

    def __init__(self, pda: JsonPushdown, index: Any, table_size: int, bounds: Bounds = JSON_BOUNDS) -> None:
        self.pda = pda
        self.index = index
        self.t = hole_tables(pda)
        self.entry_after, self.exit_at = bounds[0], bounds[3]
        self.candidates, self.walked = self.t.crossing(bounds)
        cands = np.asarray(self.candidates, dtype=np.int64)
        self._cands = (cands, np.asarray([self.pda.token_bytes[i][0] for i in self.candidates], dtype=np.int64))
        self._pair_code = self.t.pair_codes(bounds)
        self._bounds = bounds
        self._entries_only: tuple = ({}, None)  # set by bind
        ids = placeholder_token_ids(table_size)
        self._kind_ids, self._canary, self._entry, self._call_ids = ids[:3], ids[3], ids[4], ids[5:]
        # set by bind: the CompiledGrammar (its start state, final states and state rows) and
        # where the value of each definition starts (None: the regex has no such definition)
        self._grammar: Any = None
        self.entries: tuple[int | None, ...] = ()
        self._exits: dict[int, tuple] = {}
        self._done: dict[int, bool] = {}
        self._continues: dict[int, bool] = {}
        self._starts: dict[int, np.ndarray] = {}
        self._rows: dict[tuple, np.ndarray] = {}  # (state, hole, top calls, more below) -> row
        self._needs: dict[tuple, tuple[int, ...]] = {}  # (state, hole) -> how many top calls its rows read
        self._steps: dict[tuple, frozenset[Config]] = {}  # walked tokens: (configs, token) -> configs after
        self._byte_index: dict[int, int] = {}  # _bytes_from: state -> row of _byte_table
        self._byte_raw: list[dict[int, int]] = []
        self._byte_table: np.ndarray | None = None
        self._lock = threading.Lock()

    def bind(self, grammar: Any) -> None:
        """Called once by the ``CompiledGrammar`` that owns these holes."""
        self._grammar = grammar
        # Tokens that only start a call are decided in bulk, for a grammar's own bounds (not
        # JSON's) and a regex without holes: the bulk path enters definitions, not holes.
        if self._bounds != JSON_BOUNDS and not any(c in grammar.regex for c in HOLE_CHARS.values()):
            self._entries_only = self.t.simple_entries(self._bounds)
        self._final = grammar.is_final  # the regex (root, or in a call its definition) may end here
        e = self.index.get_next_state(grammar.initial_state, self._entry)
        self.entries = tuple(None if e is None else self.index.get_next_state(e, c) for c in self._call_ids)

    def start(self) -> frozenset[Config]:
        return frozenset(((self._grammar.initial_state, None, ()),))

    # ------------------------------------------------------------------ structure

    def exits(self, state: int) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """At ``state``: (kind index, state after the placeholder) for each hole starting
        there, and (definition, state after the call) for each call."""
        hit = self._exits.get(state)
        if hit is None:
            nxt = self.index.get_next_state
            if nxt(state, self._canary) is not None:
                hit = ((), ())  # inside a character class that also matches placeholders
            else:
                hit = (tuple((k, a) for k, tid in enumerate(self._kind_ids) if (a := nxt(state, tid)) is not None),
                       tuple((r, a) for r, tid in enumerate(self._call_ids)
                             if self.entries[r] is not None and (a := nxt(state, tid)) is not None))
            self._exits[state] = hit
        return hit

    def _ended(self, state: int) -> bool:
        """Final, and nothing can follow (a call's value that is complete and cannot go on)."""
        hit = self._done.get(state)
        if hit is None:
            hit = self._final(state) and self.exits(state) == ((), ()) and \
                not (self._grammar.index_row(state) & self.t.not_eos).any()
            self._done[state] = hit
        return hit

    def settle(self, c: Config) -> Config:
        """``c`` with a hole whose value is complete and cannot go on left, and calls whose
        value is complete and cannot go on returned from, so jump-forward sees what follows."""
        s, hole, calls = c
        if hole is not None:
            if hole[1] or hole[0] not in self.pda.tables.complete:
                return c
            p = hole[0]
            cont = self._continues.get(p)
            if cont is None:
                cont = self._continues[p] = bool((self.pda.mask(p, ()) & self.t.not_eos).any())
            if cont:
                return c
            hole = None
        while calls and self._ended(s):
            s, calls = calls[-1], calls[:-1]
        return s, hole, calls

    def config_final(self, c: Config) -> bool:
        s, hole, calls = c
        return (hole is None or self.pda.is_final(*hole)) and self._final(s) and all(map(self._final, calls))

    def is_final(self, configs: frozenset[Config]) -> bool:
        return any(map(self.config_final, configs))

    # ------------------------------------------------------------------ the walk

    def advance(self, configs: frozenset[Config], token_id: int, data: bytes) -> frozenset[Config]:
        """The configurations after one token (``data``: its bytes); empty: it is refused."""
        if len(configs) == 1 and token_id not in self.walked:
            # the common case: no boundary inside the token, and none at its start
            ((s, hole, calls),) = configs
            if hole is None:
                kinds, defs = self.exits(s)
                if not (kinds or defs or (calls and self._final(s))):
                    s2 = self.index.get_next_state(s, token_id)
                    return _EMPTY if s2 is None else frozenset((self.settle((s2, None, calls)),))
            elif not self.pda.is_final(*hole):
                p, st = self.pda.run(*hole, data)
                return frozenset((self.settle((s, (p, st), calls)),)) if p else _EMPTY
        key = (configs, token_id)
        hit = self._steps.get(key)
        if hit is None:
            w = _Walk(0)
            for s, hole, calls in configs:
                self._go(data, 0, s, hole, calls, w, ())
            hit = frozenset(w.out)
            with self._lock:
                if len(self._steps) >= _STEPS_MAX:
                    self._steps.clear()
                self._steps[key] = hit
        return hit

    def walk(self, c: Config, data: bytes) -> frozenset[Config]:
        w = _Walk(len(c[2]))
        self._go(data, 0, *c, w, ())
        return frozenset(w.out)

    def _walk_low(self, c: Config, data: bytes, w: _Walk) -> bool:
        """Whether the walk from ``c`` accepts ``data``; ``w.low`` takes the fewest calls the
        stack went down to (the entries below were never read)."""
        w.out = set()
        self._go(data, 0, *c, w, ())
        return bool(w.out)

    def _emit(self, w: _Walk, c: Config) -> None:
        if w.settle:
            c = self.settle(c)
        w.out.add(c)
        if len(c[2]) < w.low:
            w.low = len(c[2])

    def _go(self, data: bytes, i: int, s: int, hole: Hole | None, calls: tuple[int, ...], w: _Walk,
            entered: tuple[int, ...]) -> None:
        """Every way to read ``data[i:]`` from a configuration, into ``w.out``: the regex part
        one byte at a time through the index's single-byte tokens, holes on the automaton,
        crossing into a hole or call only after ``ENTRY_AFTER`` (or at the token's start) and
        out of one only at ``EXIT_AT`` (or there). ``entered``: the calls entered at ``i``
        without reading a byte, never entered again there (no endless left recursion)."""
        n = len(data)
        if hole is not None:
            p, st = hole
            j = i if i == 0 else next((k for k in range(i, n) if data[k] in self.exit_at), n)
            if j > i:  # no way out before j: the automaton reads data[i:j] at once
                p, st = self.pda.run(p, st, data[i:j])
                if not p:
                    return
                i = j
            if i == n:
                self._emit(w, (s, (p, st), calls))
                return
            if self.pda.is_final(p, st):
                self._go(data, i, s, None, calls, w, entered)  # leave the hole; the regex goes on
            p2, st2 = self.pda.run(p, st, data[i:i + 1])
            if p2:
                self._go(data, i + 1, s, (p2, st2), calls, w, ())
            return
        if i == n:
            self._emit(w, (s, None, calls))
            return
        t = self.t
        rest = data[i:]
        whole = None
        if _LEAD not in rest:  # the whole rest in the regex, as the index runs it
            whole = t.token_of.get(rest)
            if whole is not None:
                s2 = self.index.get_next_state(s, whole)
                if s2 is not None:
                    self._emit(w, (s2, None, calls))
        if whole is None or self._boundary_ahead(data, i):
            b = data[i]
            tb = t.byte_token[b]
            if tb >= 0 and b != _LEAD:  # the lead byte could spell a placeholder or an index marker
                s2 = self.index.get_next_state(s, tb)
                if s2 is not None:
                    self._go(data, i + 1, s2, None, calls, w, ())
        if i == 0 or data[i - 1] in self.entry_after:
            kinds, defs = self.exits(s)
            for k, after in kinds:
                p, st = self.pda.run(t.starts[k], (), rest[:1])
                if p:
                    self._go(data, i + 1, after, (p, st), calls, w, ())
            for r, after in defs:
                if r not in entered:  # a tail call (nothing can follow it) returns to the caller's caller
                    inner = calls if self._ended(after) else (*calls, after)
                    self._go(data, i, self.entries[r], None, inner, w, (*entered, r))
        if calls and (i == 0 or data[i] in self.exit_at) and self._final(s):
            if len(calls) <= w.low:
                w.low = len(calls) - 1
            self._go(data, i, calls[-1], None, calls[:-1], w, entered)  # return from the call

    # ------------------------------------------------------------------ masks

    def outer_row(self, state: int, row: np.ndarray) -> np.ndarray:
        """Complete ``row`` (the index's tokens at ``state``, fresh, EOS decided) in place with
        the tokens that start a hole or a call here or cross into one."""
        kinds, defs = self.exits(state)
        for k, _ in kinds:
            row |= self.t.start_masks[k]
        for r, _ in defs:
            row |= self._start_row(r)
        self._scan(row, (state, None, ()))
        return row

    def _start_row(self, r: int) -> np.ndarray:
        """The tokens a value of definition ``r`` can start with, read whole in the regex or a
        hole (crossing tokens are the caller's scan): the index rows at its entry and at the
        entries of the calls it can start with."""
        row = self._starts.get(r)
        if row is None:
            todo, seen = [r], {r}
            row = np.zeros_like(self.t.not_eos)
            while todo:
                e = self.entries[todo.pop()]
                row |= self._grammar.index_row(e)
                kinds, defs = self.exits(e)
                for k, _ in kinds:
                    row |= self.t.start_masks[k]
                for r2, _ in defs:
                    if r2 not in seen:
                        seen.add(r2)
                        todo.append(r2)
            row &= self.t.not_eos
            with self._lock:
                row = self._starts.setdefault(r, row)
        return row

    def row(self, configs: frozenset[Config]) -> np.ndarray:
        """Tokens allowed from any of ``configs``. Read-only."""
        if len(configs) == 1:
            for c in configs:
                return self.config_row(c)
        rows = [self.config_row(c) for c in configs]
        out = rows[0].copy()
        for r in rows[1:]:
            out |= r
        return out

    def config_row(self, c: Config) -> np.ndarray:
        """Tokens allowed from one configuration (EOS where it is final). Read-only."""
        return self._row(c)[0]

    def _row(self, c: Config) -> tuple[np.ndarray, int]:
        """(``config_row(c)``, how many of the open calls it depends on: the row holds for
        every configuration with the same state and hole, those top entries, and more calls
        below them exactly when ``c`` has). Cached so: a tree's rows at depth 20 are the
        ones built at depth 2."""
        s, hole, calls = c
        if hole is None and not calls:
            return self._grammar.mask_row(s), 0
        pda = self.pda
        if hole is not None and len(hole[1]) > pda.k:  # no token closes this many containers
            return pda.mask(*hole) & self.t.not_eos, 0
        n = len(calls)
        if not n:
            hit = self._rows.get((s, hole, (), False))
            if hit is not None:
                return hit, 0
        else:
            for k in self._needs.get((s, hole), ()):
                if k <= n:
                    hit = self._rows.get((s, hole, calls[n - k:], n > k))
                    if hit is not None:
                        return hit, k
        if hole is not None:
            row = pda.mask(*hole) & self.t.not_eos
            need = 0
            if pda.is_final(*hole):
                sub, need = self._row((s, None, calls))
                row |= sub
        else:
            row = self._grammar.mask_row(s) & self.t.not_eos
            need = 0
            if self._final(s):
                sub, need = self._row((calls[-1], None, calls[:-1]))
                row |= sub
                need += 1
        need = max(need, self._scan(row, c))
        with self._lock:
            if len(self._rows) >= _ROWS_MAX:
                self._rows.clear()
                self._needs.clear()
            row = self._rows.setdefault((s, hole, calls[n - need:], n > need), row)
            ks = self._needs.get((s, hole), ())
            if need not in ks:
                self._needs[(s, hole)] = (*ks, need)
        return row, need

    def _dead(self, c: Config, prefix: bytes, memo: dict[bytes, bool], w: _Walk) -> bool:
        """Whether the walk from ``c`` refuses ``prefix``; then it refuses every token that
        starts with it (each path through such a token reads the prefix first, under the
        same conditions, as a token of those bytes does)."""
        hit = memo.get(prefix)
        if hit is None:
            hit = memo[prefix] = not self._walk_low(c, prefix, w)
        return hit

    def _scan_entries(self, row: np.ndarray, c: Config, groups: dict, need: np.ndarray, w: _Walk) -> None:
        """Set the bits of the ``need``ed tokens that only start a call (``simple_entries``):
        head + rest, the head read from ``c`` to a state that calls a definition (as the
        head's bytes leave it mid-token: nothing returned from at their end), the rest read
        from that definition's entry (or an entry it calls first) without a boundary, as the
        index reads it byte by byte. Per head, one walk, then every token at once through a
        byte table of the index (``_bytes_from``); what the walk of each token would find."""
        words = row.view(np.uint32)
        for head, (ids, rests, lens) in groups.items():
            m = need[ids]
            if not m.any():
                continue
            hw = _Walk(w.low, settle=False)
            self._go(head, 0, *c, hw, ())
            w.low = min(w.low, hw.low)
            entries: set[int] = set()
            for s2, hole, _ in hw.out:
                if hole is None:
                    todo = [r for r, _ in self.exits(s2)[1]]
                    while todo:  # an entry that calls first: its callee's entry too, at the same byte
                        e = self.entries[todo.pop()]
                        if e not in entries:
                            entries.add(e)
                            todo.extend(r for r, _ in self.exits(e)[1])
            if not entries:
                continue
            index, table = self._bytes_from(entries)
            ids, rests, lens = ids[m], rests[m], lens[m]
            ok = np.zeros(ids.size, dtype=np.bool_)
            for e in entries:
                cur = np.full(ids.size, index[e], dtype=np.int64)
                for col in range(rests.shape[1]):
                    live = (lens > col) & (cur >= 0)
                    if not live.any():
                        break
                    cur[live] = table[cur[live], rests[live, col]]
                ok |= cur >= 0
            hit = ids[ok]
            if hit.size:
                np.bitwise_or.at(words, hit >> 5, np.left_shift(np.uint32(1), (hit & 31).astype(np.uint32)))

    def _bytes_from(self, starts: set[int]) -> tuple[dict[int, int], np.ndarray]:
        """The index one byte at a time, for every state reachable from ``starts`` through
        one-byte tokens (not the placeholders' lead byte): (state -> row, table[row, byte] ->
        row, -1 where the byte is refused). Grown as needed; cached."""
        with self._lock:
            index, raw = self._byte_index, self._byte_raw
            todo = [s for s in starts if s not in index]
            if not todo and self._byte_table is not None:
                return index, self._byte_table
            tokens = self.t.byte_steps
            nxt = self.index.get_next_state
            while todo:
                st = todo.pop()
                if st in index:
                    continue
                index[st] = len(raw)
                out = {}
                for b, t in tokens:
                    s2 = nxt(st, t)
                    if s2 is not None:
                        out[b] = s2
                        if s2 not in index:
                            todo.append(s2)
                raw.append(out)
            table = np.full((len(raw), 256), -1, dtype=np.int64)
            for k, out in enumerate(raw):
                for b, s2 in out.items():
                    table[k, b] = index[s2]
            self._byte_table = table
            return index, table

    def _boundary_ahead(self, data: bytes, i: int) -> bool:
        """Whether a hole or call could begin or end inside ``data[i + 1:]``."""
        before, after = self.entry_after, self.exit_at
        return any(data[j - 1] in before or data[j] in after for j in range(i + 1, len(data)))

    def _scan(self, row: np.ndarray, c: Config) -> int:
        """Complete ``row`` (every token read without crossing a boundary mid-token, exact
        for one-byte tokens) with the crossing tokens the walk accepts. Walked only: those
        not in the row already whose first byte, as a token of its own, is (a token's walk
        reads that byte first, along a path the one-byte token has too). Returns how many of
        ``c``'s open calls the walks read."""
        table = self.pda.token_bytes
        bits = np.unpackbits(row.view(np.uint8), bitorder="little").view(np.bool_)
        firsts = bits[self.t.byte_token_index] | self.t.no_byte_token
        cands, cand_first = self._cands
        todo = cands[firsts[cand_first] & ~bits[cands]]
        w = _Walk(len(c[2]))
        groups, simple = self._entries_only
        if groups and todo.size:
            need = np.zeros(bits.size, dtype=np.bool_)
            need[todo] = True
            todo = todo[~simple[todo]]
            self._scan_entries(row, c, groups, need, w)
        dead: dict[bytes, bool] = {}  # a prefix the walk refuses: so it does every token with it
        if todo.size > _PAIRS_AT:  # many to walk (` foo` where a space may come): by first two bytes first
            codes = self._pair_code[todo]
            pairs = np.unique(codes[codes >= 0])
            refused = [p for p in pairs.tolist() if self._dead(c, bytes((p >> 8, p & 255)), dead, w)]
            if refused:
                todo = todo[~np.isin(codes, refused)]
        for tid in todo.tolist():
            data = table[tid]
            if len(data) > 3:
                if any(self._dead(c, data[:k], dead, w) for k in (2, 3)):
                    continue
            if self._walk_low(c, data, w):
                _set(row, tid, True)
        for tid in self.t.lead:  # the walk decides these either way
            _set(row, tid, self._walk_low(c, table[tid], w))
        return len(c[2]) - w.low


class _Walk:
    """What a walk found: the configurations after it, and the fewest open calls the stack
    went down to on the way (the entries below were never read)."""

    __slots__ = ("out", "low", "settle")

    def __init__(self, low: int, settle: bool = True) -> None:
        self.out: set[Config] = set()
        self.low = low
        self.settle = settle  # False: the configurations where the bytes end, as they are mid-token


_EMPTY: frozenset = frozenset()

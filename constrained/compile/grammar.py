"""Grammar specs (what a request asks for) and compiled grammars (what matchers share).

``GrammarSpec`` is the hashable cache key. ``CompiledGrammar`` is immutable apart from
two lazily filled caches (per-state bitmask rows and per-state jump strings) that are
safe to share between matchers: a row for a token-FSM state is computed once, after which
filling a request's bitmask for that state is a single row copy.

Importing this module does not import torch (the compile worker process imports it).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from treadle.constrained.index.index_markers import initial_state as index_initial_state
from treadle.constrained.index.index_markers import is_final as index_is_final
from treadle.constrained.index.index_markers import marker_token_ids, reserved_token_ids
from treadle.constrained.index.json_holes import PLACEHOLDERS

__all__ = ["GrammarSpec", "CompiledGrammar", "JUMP_MAX_BYTES"]

_tables_lock = threading.Lock()
# the most forced text one jump_string call reads: a draft is at most a matcher's rollback (64
# tokens) and forced text runs about 3-4 bytes a token, so one step rarely wants more
JUMP_MAX_BYTES = 256
_tables: dict[tuple[int, int], tuple] = {}  # (id(table), width) -> (table, first bytes, single-byte tokens)

GrammarKind = Literal["regex", "json_schema", "choices", "ebnf", "structural_tag"]


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A request's output constraint in canonical form (used as the compile-cache key)."""

    kind: GrammarKind
    value: str
    # a reasoning block before the constrained answer (reasoning_prefix): "" none; "open" the
    # reply starts inside <think> (the prompt opened it); "maybe" the reply may start with one
    reasoning: str = ""

    @staticmethod
    def from_params(
        regex: str | None = None,
        json_schema: dict | str | bool | None = None,
        choices: list[str] | None = None,
        ebnf: str | None = None,
        structural_tag: dict | str | None = None,
        reasoning: str | None = None,
    ) -> GrammarSpec | None:
        """Build a spec from request params; ``None`` when no constraint is set.

        Requires at most one of ``regex``, ``json_schema``, ``choices``, ``ebnf``,
        ``structural_tag``. A JSON schema given as a dict or string is re-serialized compactly
        *without* sorting keys, because property order decides the order of fields in the
        generated output (a structural tag's schemas likewise).
        """
        given = [n for n, v in (("regex", regex), ("json_schema", json_schema), ("choices", choices),
                                ("ebnf", ebnf), ("structural_tag", structural_tag)) if v is not None]
        if len(given) > 1:
            raise ValueError("set at most one of regex, json_schema, choices, ebnf, structural_tag "
                             f"(got {', '.join(given)})")
        if not given:
            return None
        if reasoning:
            from treadle.constrained.ebnf.reasoning_prefix import CLOSE, check_mode

            check_mode(reasoning)
            spec = GrammarSpec.from_params(regex=regex, json_schema=json_schema, choices=choices, ebnf=ebnf,
                                           structural_tag=structural_tag)
            # a grammar that names "</think>" writes the block itself: it holds from the start
            return spec if spec is None or CLOSE in spec.value else GrammarSpec(spec.kind, spec.value, reasoning)
        if structural_tag is not None:
            from treadle.constrained.ebnf.structural_tag import StructuralTag

            try:
                return GrammarSpec("structural_tag", StructuralTag.parse(structural_tag).canonical())
            except RecursionError as e:  # (its schemas are read and written by json, which recurses)
                raise ValueError("structural_tag: nests too deeply to read") from e
        if ebnf is not None:
            if not isinstance(ebnf, str) or not ebnf.strip():
                raise ValueError("ebnf must be a non-empty string (a grammar with a 'root' rule)")
            return GrammarSpec("ebnf", ebnf)
        if regex is not None:
            if not isinstance(regex, str):
                raise ValueError(f"regex must be a string, got {type(regex).__name__}")
            return GrammarSpec("regex", regex)
        if choices is not None:
            if not isinstance(choices, (list, tuple)) or not choices:
                raise ValueError("choices must be a non-empty list of strings")
            bad = [c for c in choices if not isinstance(c, str)]
            if bad:
                raise ValueError(f"choices must all be strings, got {bad[0]!r}")
            return GrammarSpec("choices", json.dumps(list(choices), ensure_ascii=False))
        schema = json_schema
        try:
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as e:
                    raise ValueError(f"json_schema is not valid JSON: {e}") from e
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"json_schema must be an object or a boolean, got {type(schema).__name__}")
            return GrammarSpec("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
        except RecursionError as e:  # (json reads and writes nesting by recursion)
            raise ValueError("json_schema: schema nests too deeply to convert") from e

    def to_regex(self, whitespace_pattern: str | None = None, json_schema_mode: str = "strict",
                 holes: bool = False, max_recursion_depth: int = 3, members: bool = False) -> str:
        """Translate the spec to the regex the token FSM is built from.

        ``json_schema_mode`` ("strict" or "spec") applies to JSON schemas (a structural tag's too); see
        ``json_schema_to_regex``. ``holes`` writes placeholders (json_holes.py): a schema's
        any-values and recursive ``$ref``s, an EBNF grammar's nesting recursion as calls.
        ``max_recursion_depth`` bounds the unrolling of ``$ref`` cycles and of nesting EBNF
        rules where they are not calls. ``members`` lets a JSON schema's long property sequences be
        ordered-members nodes (members.py: only the lazy index reads them). Raises ``ValueError`` (``UnsupportedSchemaError`` for schemas, ``EbnfError``
        for grammars) on anything the regex backend cannot represent faithfully.
        """
        if self.reasoning:
            from treadle.constrained.ebnf.reasoning_prefix import after_reasoning

            inner = GrammarSpec(self.kind, self.value).to_regex(whitespace_pattern, json_schema_mode, holes=holes,
                                                                max_recursion_depth=max_recursion_depth, members=members)
            return after_reasoning(inner, self.reasoning)
        # Imported lazily: json_schema.py is a sibling owned separately and pulls more in.
        from treadle.constrained.ebnf.ebnf import ebnf_to_regex
        from treadle.constrained.schema.json_schema import choices_to_regex, json_schema_to_regex
        from treadle.constrained.regex.regex_text import translate_regex

        if self.kind == "regex":
            # linear; interegular's check (validate_regex: a DFA build, a minute on 5,000
            # alternatives) is left to the readers that need it (compiler.spec_automaton)
            return translate_regex(self.value)
        if self.kind == "choices":
            return choices_to_regex(json.loads(self.value))
        if self.kind == "ebnf":
            return ebnf_to_regex(self.value, max_recursion_depth=max_recursion_depth, calls=holes)
        if self.kind == "structural_tag":
            from treadle.constrained.ebnf.structural_tag import structural_tag_to_regex

            return structural_tag_to_regex(self.value, whitespace_pattern=whitespace_pattern, mode=json_schema_mode,
                                           holes=holes, max_recursion_depth=max_recursion_depth)
        if self.kind == "json_schema":
            # (the text, not its parse: json_schema_to_regex reads it, a schema too deep for that
            # refused like any other)
            return json_schema_to_regex(
                self.value, whitespace_pattern=whitespace_pattern, mode=json_schema_mode, holes=holes,
                max_recursion_depth=max_recursion_depth, members=members, unique_check=True)
        raise ValueError(f"unknown grammar kind {self.kind!r}")


def _byte_tables(table: list[bytes | None], width: int) -> tuple[np.ndarray, list[int]]:
    """(first byte of each token id below ``width``, -1 for none; a token of exactly each
    byte, -1 for none) for a bytes table, shared by every grammar of that table."""
    with _tables_lock:
        hit = _tables.get((id(table), width))
        if hit is not None and hit[0] is table:
            return hit[1], hit[2]
    first = np.full(width, -1, dtype=np.int16)
    single = [-1] * 256
    for i, b in enumerate(table[:width]):
        if b:
            first[i] = b[0]
            if len(b) == 1 and single[b[0]] < 0:
                single[b[0]] = i
    with _tables_lock:
        _tables[(id(table), width)] = (table, first, single)
    return first, single


def _whole_chars(data: bytes) -> str:
    """The whole UTF-8 characters ``data`` starts with ("" when it starts mid-character)."""
    if not data or 0x80 <= data[0] < 0xC0:
        return ""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


@dataclass(eq=False)
class CompiledGrammar:
    """A compiled grammar shared by every matcher of the same spec.

    ``index`` is the outlines-core token FSM, built for the marked regex (index_markers.py:
    matchers start at ``initial_state``, ``is_final`` says where the text may end), and
    jump-forward reads its forced text off the mask rows (``jump_string``). ``holes``
    (json_holes.py) runs the any-JSON values of a schema's placeholders on the pushdown
    automaton. ``num_tokens`` is len(tokenizer): ids in [num_tokens, vocab_size) are padding
    and never allowed. Only the first EOS id is known to the index; the matcher treats all
    ``eos_token_ids`` alike. ``token_bytes`` is the tokenizer's bytes table (shared, read-only).
    """

    index: Any
    regex: str
    vocab_size: int
    num_tokens: int
    eos_token_ids: tuple[int, ...]
    token_bytes: list[bytes | None]
    spec: GrammarSpec | None = None
    compile_time_s: float = 0.0
    from_disk: bool = False  # loaded from the disk cache (compile_time_s: the original build's)
    holes: Any = None  # json_holes.Holes when the regex has any-value or call placeholders
    free_keys: bool = True  # its output may hold object keys it does not name (json_keys.py checks them)
    # the slots whose arrays its matcher keeps string items distinct in (unique_items.py), None for none
    unique_slots: frozenset | None = field(init=False)
    _rows: dict[int, Any] = field(default_factory=dict, repr=False)
    _jumps: dict[int, str] = field(default_factory=dict, repr=False)
    _finals: dict[int, bool] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # derived from the index and the table (index_markers.py): where matchers start, the
    # end marker's pseudo-token, and the real tokens the index never allows
    initial_state: int = field(init=False)
    end_token: int = field(init=False, repr=False)
    reserved_tokens: frozenset[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        start, self.end_token = marker_token_ids(len(self.token_bytes), len(PLACEHOLDERS))
        self.initial_state = index_initial_state(self.index, start)
        self.reserved_tokens = reserved_token_ids(self.token_bytes)
        self.unique_slots = None
        if self.spec is not None and self.spec.kind == "json_schema" and "uniqueItems" in self.spec.value:
            from treadle.constrained.schema.unique_strings import unique_string_slots

            # the same verdict the translator took from the same text (GrammarSpec.to_regex)
            self.unique_slots = unique_string_slots(self.spec.value)
        if self.holes is not None:
            self.holes.bind(self)

    @property
    def unique_strings(self) -> bool:
        """Whether its matcher keeps some arrays' string items distinct (unique_items.py)."""
        return self.unique_slots is not None

    @property
    def bitmask_words(self) -> int:
        return (self.vocab_size + 31) // 32

    def matcher(self, max_rollback: int = 64) -> Any:
        """A new ``GrammarMatcher`` (a ``HoleMatcher`` with holes) at the initial state (imports torch)."""
        from treadle.constrained.decode.matcher import GrammarMatcher

        return GrammarMatcher(self, max_rollback)

    def is_final(self, state: int) -> bool:
        """Whether the text that led to token-FSM ``state`` is a full match (EOS allowed)."""
        hit = self._finals.get(state)
        if hit is None:
            hit = index_is_final(self.index, state, self.end_token)
            self._finals[state] = hit
        return hit

    def mask_row(self, state: int) -> Any:
        """int32 numpy row ``[ceil(vocab_size/32)]`` of tokens allowed in token-FSM ``state``.

        EOS ids are allowed exactly when ``state`` is final. Computed once per state and
        cached; callers must treat the returned tensor as read-only.
        """
        row = self._rows.get(state)
        if row is not None:
            return row
        packed = self.index_row(state)
        if self.holes is not None:
            packed = self.holes.outer_row(state, packed)
        with self._lock:
            self._rows.setdefault(state, packed)
        return self._rows[state]

    def index_row(self, state: int) -> Any:
        """A fresh int32 row of the tokens the index itself allows at ``state`` (EOS where it is
        final; no hole or call of json_holes.py)."""
        allowed = np.zeros(self.bitmask_words * 32, dtype=np.bool_)
        got = self.index.get_allowed_tokens(state)
        ids = got.astype(np.int64, copy=False) if isinstance(got, np.ndarray) else np.fromiter(got, dtype=np.int64)
        ids = ids[ids < self.num_tokens]
        allowed[ids] = True
        reserved = self.reserved_tokens  # they could spell a marker
        if reserved:
            allowed[np.fromiter(reserved, dtype=np.int64)] = False
        # EOS is decided here for all ids (the index's own final states are after the marker).
        eos = np.asarray([e for e in self.eos_token_ids if e < allowed.size], dtype=np.int64)
        allowed[eos] = self.is_final(state)
        # Little bit order: bit t%32 of little-endian word t//32 is token t.
        return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32)

    def jump_string(self, state: int) -> str:
        """The text the grammar forces from token-FSM ``state`` on, maybe "": while every token
        allowed starts with one byte (EOS not allowed), that byte, cut to whole characters.
        Read off the mask rows, so a hole's start (whose values open with many bytes) ends
        it. At most JUMP_MAX_BYTES: each byte costs a mask row (about a millisecond on the
        scheduler's thread the first time), and a step drafts at most a matcher's rollback
        worth of tokens anyway; a longer forced text is jumped over in the steps after.
        Cached per state."""
        hit = self._jumps.get(state)
        if hit is not None:
            return hit
        first, single = _byte_tables(self.token_bytes, self.bitmask_words * 32)
        out = bytearray()
        s: int | None = state
        seen: set[int] = set()
        while s is not None and s not in seen and len(out) < JUMP_MAX_BYTES:
            seen.add(s)
            ids = np.flatnonzero(np.unpackbits(self.mask_row(s).view(np.uint8), bitorder="little"))
            firsts = first[ids]
            if not firsts.size or firsts[0] < 0 or (firsts != firsts[0]).any():
                break  # a choice, EOS, or nothing
            b = int(firsts[0])
            out.append(b)
            s = self.index.get_next_state(s, single[b]) if single[b] >= 0 else None
        text = _whole_chars(bytes(out))
        with self._lock:
            self._jumps[state] = text
        return text

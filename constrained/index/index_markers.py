"""The markers every token index is built with, and how a state is known to be final.

outlines-core 0.2.14 drops some transitions of its token index. Its regex DFA reports a
match one byte late, and a token that ends exactly one byte after a point where the text
so far was complete is dropped, unless the text at its end is complete too. So under
``[0-9]+(?:\\.[0-9]+)?`` the token ``.`` after ``12`` is refused, and so is ``" "`` after
a word under ``[a-z]+(?: [a-z]+)*``. Its DFA is also leftmost-first, so ``a|ab`` stops at
``a``. Both come from matches that happen before the end of the output.

Every index is therefore built for ``START_CHAR (?:regex) END_CHAR``, two code points of
Supplementary Private Use Area-B with a pseudo-token each (vocabulary.py):

* no real output reaches a match before the end marker, so no transition is dropped;
* a state is final, and EOS is allowed there, when the end marker's pseudo-token leads to
  a final state. For any text t, t + marker is in ``(?:regex)`` + marker exactly when t is
  in the regex, even where a character class of the regex matches the marker itself;
* the start marker keeps the build fast: outlines-core's DFA also has an unanchored start,
  which with matches only at the end grew 30-fold for a nested grammar (28 s instead of
  0.9 s); a marker that only the first character can be confines it (3.2 s). Matchers start
  after it (``initial_state``).

No mask ever allows a pseudo-token: their ids come after every real one. Real tokens must
not spell the markers either, so under a regex grammar no token holding the byte 0xF4 is
allowed (``reserved_token_ids``): that is the lead byte of U+100000-U+10FFFF, which a regex
grammar therefore never writes, and which a grammar may not ask for (``check_regex``). The
hole placeholders (json_holes.py) live there too, and so do the "ordered members" markers
below (members.py).

Ordered members: the JSON-schema translator writes an object's declared properties (required
always, optional maybe, a separator between) as one node, which the lazy index builds as a
linear automaton (lazy_index.py) instead of today's spelt-out alternatives, whose text grows
with the square of the optional properties. Its syntax, nesting like a group::

    MEMBERS_OPEN sep (MEMBER_REQUIRED entry | MEMBER_OPTIONAL entry)+ MEMBERS_CLOSE

``MEMBERS_OPEN_NONEMPTY`` in place of ``MEMBERS_OPEN`` leaves out the empty sequence. ``sep``
and each ``entry`` are regexes. The markers are U+10FFF0-U+10FFF4, free beside the calls
(U+10FFE0-U+10FFEF), the entry (U+10FFF7), the index markers (U+10FFF8-9) and the holes
(U+10FFFA-D). They never stand for characters: every reader that is not the lazy index gets
the standard regex of ``members.expand_members``, and a grammar holding them literally is
refused (``check_regex``; a schema that names code points near them is translated without
them, ``members.members_safe``).

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["END_CHAR", "MEMBER_CHARS", "MEMBER_OPTIONAL", "MEMBER_REQUIRED", "MEMBERS_CLOSE", "MEMBERS_OPEN",
           "MEMBERS_OPEN_NONEMPTY", "RESERVED_LEAD", "START_CHAR", "check_regex", "initial_state", "is_final", "marked",
           "marker_token_ids", "reserved_token_ids"]

START_CHAR = "\U0010FFF8"
END_CHAR = "\U0010FFF9"  # next to the hole placeholders (json_holes.py), U+10FFFA-D
MARKERS = (START_CHAR, END_CHAR)
MEMBERS_OPEN = "\U0010FFF0"  # ordered members, the empty sequence included
MEMBERS_OPEN_NONEMPTY = "\U0010FFF1"  # ordered members, at least one present
MEMBER_REQUIRED = "\U0010FFF2"  # the next entry is required
MEMBER_OPTIONAL = "\U0010FFF3"  # the next entry is optional
MEMBERS_CLOSE = "\U0010FFF4"
MEMBER_CHARS = frozenset((MEMBERS_OPEN, MEMBERS_OPEN_NONEMPTY, MEMBER_REQUIRED, MEMBER_OPTIONAL, MEMBERS_CLOSE))
RESERVED_LEAD = 0xF4  # the first UTF-8 byte of U+100000-U+10FFFF
_reserved_cache: dict[int, tuple[list, frozenset[int]]] = {}


def marker_token_ids(table_size: int, placeholders: int) -> tuple[int, int]:
    """(start, end) pseudo-token ids: after the real ids and the ``placeholders`` pseudo-tokens."""
    return table_size + placeholders, table_size + placeholders + 1


def marked(regex: str) -> str:
    """The regex an index is built for."""
    return f"{START_CHAR}(?:{regex}){END_CHAR}"


def initial_state(index: Any, start_id: int) -> int:
    """Where a matcher of a marked ``index`` starts: after the start marker."""
    s = index.get_next_state(index.get_initial_state(), start_id)
    if s is None:
        raise ValueError("the token index was not built with the start marker")
    return s


def reserved_token_ids(table: list[bytes | None]) -> frozenset[int]:
    """The real tokens of a bytes table that hold the reserved lead byte (cached per table)."""
    hit = _reserved_cache.get(id(table))
    if hit is None or hit[0] is not table:
        hit = (table, frozenset(i for i, b in enumerate(table) if b and RESERVED_LEAD in b))
        _reserved_cache[id(table)] = hit
    return hit[1]


def check_regex(regex: str, allowed: frozenset[str] = frozenset()) -> None:
    """Raise ``ValueError`` when ``regex`` names a reserved code point (other than ``allowed``), or a
    surrogate (a JSON "\\ud800" decodes to one): no UTF-8 text holds it, so the index could not
    be built (it was refused as "not built with the start marker") or wrote bytes that decode to
    no text."""
    for ch in regex:
        if ord(ch) >= 0x100000 and ch not in allowed:
            raise ValueError(f"grammar: code point U+{ord(ch):06X} is reserved (U+100000-U+10FFFF, "
                             "Supplementary Private Use Area-B, is never generated under a grammar)")
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise ValueError(f"grammar: code point U+{ord(ch):04X} is a lone surrogate, which UTF-8 text (what a "
                             "model writes) cannot hold")


def is_final(index: Any, state: int, end_id: int) -> bool:
    """Whether the text that led a marked ``index`` to ``state`` is a full match."""
    after = index.get_next_state(state, end_id)
    return after is not None and bool(index.is_final_state(after))

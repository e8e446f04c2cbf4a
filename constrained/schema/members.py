"""Ordered members: "entries in order, the required ones always, the optional ones maybe, a
separator between those present", the body of a JSON object of declared properties.

Spelt out as a standard regex (``spell_members``, what the JSON-schema translator has always
written) the text of entry j is repeated once per optional entry before it: N optional
properties give ~N^2 text, 10^8 characters for a real Kubernetes PodSpec. ``members_text``
writes the same language as one node instead (its markers: index_markers.py), which the lazy
index builds as a linear automaton, each entry at most twice (lazy_index.py). Every other
reader of regex text (outlines-core's index, interegular, Python's ``re``) gets
``expand_members``: the node spelt out, refused with ``MembersTooLarge`` past a length cap.

Importing this module does not import torch.
"""
from __future__ import annotations

from treadle.constrained.index.index_markers import (MEMBER_CHARS, MEMBER_OPTIONAL, MEMBER_REQUIRED, MEMBERS_CLOSE,
                                               MEMBERS_OPEN, MEMBERS_OPEN_NONEMPTY)

__all__ = ["MAX_SPELT_CHARS", "MEMBERS_MIN_CHARS", "MembersTooLarge", "expand_members", "has_members", "members_safe", "members_text",
           "spell_members", "spelt_length"]

# The spelt-out length from which the translator writes the node instead: below it the standard
# text is short, readable, and what other tools can read as it is.
MEMBERS_MIN_CHARS = 2_000

Entries = list  # [(regex text, required)], in order


# No spelt-out sequence of a JSON schema's conversion passes this many chars (json_schema.py's
# MAX_REGEX_CHARS, the cap on any subschema's regex): above what the compiler's default cap allows.
MAX_SPELT_CHARS = 64_000_000


class MembersTooLarge(ValueError):
    """Spelling ordered members out would pass the length cap."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"the ordered members spelt out pass {cap:,} characters")
        self.cap = cap


def members_text(entries: Entries, sep: str, allow_empty: bool = True) -> str:
    """The node: ``entries`` (each ``(text, required)``) in order, ``sep`` between."""
    out = [MEMBERS_OPEN if allow_empty else MEMBERS_OPEN_NONEMPTY, sep]
    for text, req in entries:
        out.append(MEMBER_REQUIRED if req else MEMBER_OPTIONAL)
        out.append(text)
    out.append(MEMBERS_CLOSE)
    return "".join(out)


def spelt_length(entries: Entries, sep: str, allow_empty: bool = True) -> int:
    """``len(spell_members(entries, sep, allow_empty))``, without writing it."""
    after = 0
    afters = [0] * (len(entries) + 1)
    for i in range(len(entries) - 1, -1, -1):
        text, req = entries[i]
        after += len(sep) + len(text) + (0 if req else 5)  # (?:...)?
        afters[i] = after
    first, some = 0, False
    for i in range(len(entries) - 1, -1, -1):
        text, req = entries[i]
        if req:
            first = len(text) + afters[i + 1]
        elif some:
            first = 3 + len(text) + afters[i + 1] + 1 + first + 1  # (?:T A|F)
        else:
            first = 3 + len(text) + afters[i + 1] + 1 + (1 if allow_empty else 0)
        some = True
    return first


def spell_members(entries: Entries, sep: str, allow_empty: bool = True, max_chars: int | None = None) -> str:
    """The standard regex of the node: required entries always present, optional ones maybe,
    ``sep`` only between; ``allow_empty=False`` leaves out the empty sequence (it matters when
    all are optional). ``MembersTooLarge`` when it would pass ``max_chars``."""
    if max_chars is not None:
        n = spelt_length(entries, sep, allow_empty)
        if n > max_chars:
            raise MembersTooLarge(max_chars)
    after = [""] * (len(entries) + 1)  # after[i]: entries i.. once something was emitted
    for i in range(len(entries) - 1, -1, -1):
        text, req = entries[i]
        after[i] = (sep + text if req else f"(?:{sep}{text})?") + after[i + 1]
    first = ""  # entries i.. when nothing was emitted yet
    for i in range(len(entries) - 1, -1, -1):
        text, req = entries[i]
        if req:
            first = text + after[i + 1]
        elif first:
            first = f"(?:{text}{after[i + 1]}|{first})"
        else:
            first = f"(?:{text}{after[i + 1]})" + ("?" if allow_empty else "")
    return first


def has_members(regex: str) -> bool:
    return MEMBERS_OPEN in regex or MEMBERS_OPEN_NONEMPTY in regex


def expand_members(regex: str, max_chars: int | None = None) -> str:
    """``regex`` with every ordered-members node spelt out (``spell_members``): the standard
    regex of the same language. ``MembersTooLarge`` when the text would pass ``max_chars``;
    ``ValueError`` for a malformed node. Text without a node is returned as it is."""
    if not has_members(regex):
        return regex
    out, i = _expand(regex, 0, max_chars, top=True)
    return out


def _expand(s: str, i: int, cap: int | None, top: bool = False) -> tuple[str, int]:
    """Expand from ``i`` to the end (``top``) or to the next entry marker or close marker
    outside classes; (the text, where it stopped)."""
    out: list[str] = []
    size = 0
    n = len(s)
    start = i
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a class is copied as it is (the lazy parser reads it alike)
            j = i + 1
            j += j < n and s[j] == "^"
            j += j < n and s[j] == "]"
            while j < n and s[j] != "]":
                j += 2 if s[j] == "\\" else 1
            i = j + 1
            continue
        if c in MEMBER_CHARS:
            if c not in (MEMBERS_OPEN, MEMBERS_OPEN_NONEMPTY):
                if top:
                    raise ValueError(f"ordered members: a stray marker U+{ord(c):06X} at offset {i}")
                break
            out.append(s[start:i])
            size += i - start
            node, i = _node(s, i, cap)
            out.append(node)
            size += len(node)
            if cap is not None and size > cap:
                raise MembersTooLarge(cap)
            start = i
            continue
        i += 1
    i = min(i, n)
    out.append(s[start:i])
    text = "".join(out)
    if cap is not None and len(text) > cap:
        raise MembersTooLarge(cap)
    return text, i


def _node(s: str, i: int, cap: int | None) -> tuple[str, int]:
    allow_empty = s[i] == MEMBERS_OPEN
    sep, i = _expand(s, i + 1, cap)
    entries = []
    while i < len(s) and s[i] in (MEMBER_REQUIRED, MEMBER_OPTIONAL):
        req = s[i] == MEMBER_REQUIRED
        text, i = _expand(s, i + 1, cap)
        entries.append((text, req))
    if i >= len(s) or s[i] != MEMBERS_CLOSE or not entries:
        raise ValueError(f"ordered members: a malformed node ending at offset {i}")
    return spell_members(entries, sep, allow_empty, cap), i + 1


def members_safe(schema_text: str) -> bool:
    """Whether a schema (its JSON text) can be translated with ordered-members nodes: it holds
    none of their markers and names no code point near them (``\\u{10FFF0}``, a surrogate pair
    ``\\uDBFF\\uDFF0``), so every marker in its regex is one the translator wrote."""
    if any(c in schema_text for c in MEMBER_CHARS):
        return False
    low = schema_text.lower()
    return "10fff" not in low and "udbff" not in low

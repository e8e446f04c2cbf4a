"""JSON Schema ``pattern``s that ``regex_text.pattern_to_body`` cannot write, written as a
subset of what they match (sound: every output matches the pattern) or exactly.

``pattern_subset_body(pattern)`` tries ``pattern_to_body`` first; when that refuses, it
reads the pattern again with these rules, each argued where it is applied:

- leading inline flags ``(?s)``, ``(?i)``, ``(?m)`` (Python's, as CloudFormation writes
  them) are dropped: case-sensitive ``.``-without-newline matching is a subset, and a body
  never holds a newline, so multiline anchors mean what plain ones do (narrowing);
- anchors per branch: ``^a|b$`` is "starts with a, or ends with b"; a branch that is one
  group, ``(^x$)`` or ``^(a|b)$``, is unwrapped and its alternatives take the anchors (exact);
- named groups ``(?<n>x)`` / ``(?P<n>x)`` are plain groups (exact);
- lookahead ``(?=x)`` / ``(?!x)`` at the top level of a branch, and lookbehind at its end,
  by automata: the strings after the lookahead's position are intersected with (or have
  subtracted) those that start with a match of ``x`` (exact; interegular's ``&`` and ``-``,
  written back by fsm_regex.py). A negative lookaround's ``x`` is read WIDE (a superset of
  both Python's and ECMA's meaning: ``.`` any but a newline, ``\\s`` and ``\\d`` Unicode-wide),
  since subtracting a smaller set would keep too much;
- characters JSON must escape (a pattern written over ``\\u0000-\\uFFFF``) are left out, the
  pattern's automaton intersected with the raw JSON string characters (narrowing).

Every output stays in the regex dialect regex_text.py describes (no lookaround, no anchors).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

import interegular

from treadle.constrained.fsm_regex import fsm_to_regex
from treadle.constrained.regex_text import (
    MAX_REPEAT,
    has_top_level_alternation,
    class_literal,
    escape_literal,
    SAFE_RAW_CHAR,
    RegexDialectError,
    _ends_with_anchor,
    _scan,
    pattern_to_body,
    reshaped_repetitions,
)

__all__ = ["key_pattern_bodies", "key_pattern_matches", "pattern_subset_body"]

_FLAGS = re.compile(r"\(\?([ims]+)\)")
_NAMED = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_LONG_COUNT = re.compile(r"\{(?:\d*,\d{2,}|\d{2,},?)\}")  # {0,16}, {16,}, {16}: a count of 10 or more
_LOOP_THEN_LONG_COUNT = re.compile(r"(?:[*+]|\{\d+,\}).*\{(?:\d*,\d{2,}|\d{2,},?)\}")
_PROPERTY = re.compile(r"\\[pP]\{[^}]*\}")
_LOOK = ("(?=", "(?!", "(?<=", "(?<!")
# every character Python's str \s or ECMA's \s matches (str.isspace, and U+FEFF for ECMA)
_WIDE_SPACE = "".join(f"\\u{c:04x}" for c in range(0x110000) if chr(c).isspace() and c < 0x10000) + "\\ufeff"


def pattern_subset_body(pattern: str) -> str:
    """A string body (the characters between a JSON string's quotes) every one of whose
    strings matches ``pattern`` (ECMA-262 search semantics, and Python's ``re.search``);
    ``RegexDialectError`` naming what is left that cannot be written."""
    pattern = _annex_b(pattern)
    try:
        return pattern_to_body(pattern, subset=True)
    except RegexDialectError as exc:
        first = exc
    try:
        re.compile(_PROPERTY.sub("p", pattern))  # (Unicode property escapes: regex_text reads them)
    except re.error as exc:  # jsonschema's validator (Python's re) could not check an output
        raise RegexDialectError(f"{first} (and Python's re cannot read the pattern: {exc})") from exc
    try:
        return _subset_body(pattern)
    except RegexDialectError as exc:
        raise RegexDialectError(f"{first}" if str(exc) == str(first) else f"{exc}") from exc


def _subset_body(pattern: str) -> str:
    m = _FLAGS.match(pattern[1:] if pattern.startswith("^") else pattern)
    if m and "i" in m.group(1) and ("(?!" in pattern or "(?<!" in pattern):
        raise RegexDialectError("regex: '(?i)' with a negative lookaround is not supported")
    if m:  # leading flags dropped (narrowing, see the module docstring)
        cut = m.end() + (1 if pattern.startswith("^") else 0)
        pattern = ("^" if pattern.startswith("^") else "") + pattern[cut:]
    pattern = _unnamed(pattern)
    pad = SAFE_RAW_CHAR + "*"
    parts = []
    for s, e, core in _branches(pattern, False, False):
        if any(kind == "group" and core.startswith(_LOOK, a) or kind == "atom" and core[a] == "^"
               for kind, a, _ in _items(core)):
            written = None
            # exact first; where its regex is too long, counted repetitions of the match
            # lowered to at most 16, then 4 (fewer repetitions: a subset)
            for most in (None, 16, 4):
                try:
                    written = _written(_branch_fsm(s, e, core, most))
                    break
                except RegexDialectError as exc:
                    if "exceed" not in str(exc) or most == 4:
                        raise
        else:
            positive = _positive(core) if core else ""
            if _LOOP_THEN_LONG_COUNT.search(re.sub(r"\[(?:\\.|[^\]\\])*\]", "c", positive)):
                # a loop before a long count that may overlap it ([^/]+/?.{3,256}): the automaton
                # tracks every split between them, up to 2^count states; the counts are lowered
                # to at most 32 repetitions (fewer repetitions: a subset)
                positive = _positive(core, 32)
            written = "(?:" + positive + ")" if core else ""
            # an unanchored core with a long counted repetition is written from the string's
            # start (a string that starts with a match contains one: a subset): padding before
            # it makes the automaton track every start at once, exponential in the count
            lead = "" if s or _LONG_COUNT.search(core) else pad
            written = lead + written + ("" if e or not written and not lead else pad)
        if written is not None:  # (a branch no string matches adds nothing)
            parts.append(written)
    if not parts:
        raise RegexDialectError("pattern: matches no string")
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    fsm = interegular.parse_pattern(body).to_fsm()
    safe = _fsm(pad)
    if not (fsm - safe).empty():
        body = _written(fsm & safe)  # raw JSON string characters only (narrowing)
        if body is None:
            raise RegexDialectError("pattern: no string JSON can hold raw matches it")
    return body


_MAX_NESTING = 48  # groups inside groups: interegular's recursive parser stops near 150


def _written(fsm: Any) -> str | None:
    """``fsm`` as a regex of the dialect; None when it accepts nothing. One that nests
    groups too deeply for the parsers that read it next is refused."""
    try:
        out = fsm_to_regex(fsm)
    except ValueError as exc:
        raise RegexDialectError(f"pattern: {exc}") from exc
    depth = top = 0
    i = 0
    while out is not None and i < len(out):
        c = out[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # classes written by fsm_regex.py: escaped ']' only
            while out[i] != "]":
                i += 2 if out[i] == "\\" else 1
        elif c == "(":
            depth += 1
            top = max(top, depth)
        elif c == ")":
            depth -= 1
        i += 1
    if top > _MAX_NESTING:
        raise RegexDialectError(f"pattern: its automaton's regex nests {top} groups deep")
    return out


@lru_cache(maxsize=256)
def _fsm(regex: str) -> Any:
    return interegular.parse_pattern(regex).to_fsm()


# ---------------------------------------------------------------- top-level structure

def _items(text: str) -> list[tuple[str, int, int]]:
    """``text`` cut at the top level: ("group", i, j) spans a whole group with its opener,
    ("alt", i, i+1) a top-level '|', ("atom", i, j) anything else (a class, an escape, a
    character, a quantifier)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            out.append(("atom", i, i + 2))
            i += 2
        elif c == "[":
            j = i + 1
            if j < n and text[j] == "^":
                j += 1
            if j < n and text[j] == "]":
                j += 1
            while j < n and text[j] != "]":
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise RegexDialectError(f"regex: unterminated character class at offset {i}")
            out.append(("atom", i, j + 1))
            i = j + 1
        elif c == "(":
            depth, j = 0, i
            while j < n:
                d = text[j]
                if d == "\\":
                    j += 2
                    continue
                if d == "[":
                    k = j + 1
                    if k < n and text[k] == "^":
                        k += 1
                    if k < n and text[k] == "]":
                        k += 1
                    while k < n and text[k] != "]":
                        k += 2 if text[k] == "\\" else 1
                    j = k + 1
                    continue
                depth += (d == "(") - (d == ")")
                j += 1
                if depth == 0:
                    break
            if depth:
                raise RegexDialectError(f"regex: unbalanced '(' at offset {i}")
            out.append(("group", i, j))
            i = j
        elif c == "|":
            out.append(("alt", i, i + 1))
            i += 1
        else:
            out.append(("atom", i, i + 1))
            i += 1
    return out


def _unnamed(text: str) -> str:
    """Named groups as plain groups (exact), found outside classes and escapes only."""
    out, i = [], 0
    for kind, a, b in _items(text):
        if kind == "group":
            opener = _NAMED.match(text, a)
            inner_from = opener.end() if opener else (a + 3 if text.startswith("(?:", a) else a + 1)
            if text.startswith(_LOOK, a) and not opener:
                inner_from = a + (4 if text.startswith(("(?<=", "(?<!"), a) else 3)
            head = "(" if opener else text[a:inner_from]
            out.append(text[i:a] + head + _unnamed(text[inner_from:b - 1]) + ")")
            i = b
    out.append(text[i:])
    return "".join(out)


def _split_alternatives(text: str) -> list[str]:
    parts, start = [], 0
    for kind, a, b in _items(text):
        if kind == "alt":
            parts.append(text[start:a])
            start = b
    parts.append(text[start:])
    return parts


def _whole_group(text: str) -> str | None:
    """The inside of ``text`` when it is one plain group, ``(x)`` or ``(?:x)``, and nothing
    else (no quantifier after it)."""
    items = _items(text)
    if len(items) != 1 or items[0][0] != "group" or text.startswith("(?", 0) and not text.startswith("(?:"):
        return None
    return text[3:-1] if text.startswith("(?:") else text[1:-1]


def _anchors_out_of_groups(start: bool, end: bool, part: str) -> tuple[bool, bool, str]:
    """A branch's plain groups (no quantifier after them, no '|' at their top) unwrapped, and
    a '^' that then starts the branch or a '$' that ends it taken as its anchor (exact:
    ``^app-([0-9]{10}$)`` is ``^app-[0-9]{10}$``)."""
    for _ in range(8):
        items = _items(part)
        out, changed = [], False
        for idx, (kind, a, b) in enumerate(items):
            piece = part[a:b]
            nxt = part[b:b + 1]
            plain = kind == "group" and (not piece.startswith("(?") or piece.startswith("(?:"))
            if plain and nxt not in ("*", "+", "?", "{"):
                inner = piece[3:-1] if piece.startswith("(?:") else piece[1:-1]
                if not has_top_level_alternation(inner):
                    out.append(inner)
                    changed = True
                    continue
            out.append(piece)
        part = "".join(out)
        while part.startswith("^"):
            start, part, changed = True, part[1:], True
        while _ends_with_anchor(part):
            end, part, changed = True, part[:-1], True
        if not changed:
            break
    return start, end, part


def _branches(text: str, start: bool, end: bool) -> list[tuple[bool, bool, str]]:
    """(anchored at the start, anchored at the end, core) of each branch of ``text``, groups
    that make a whole branch unwrapped (exact: ``^(a|b)$`` is ``^a$|^b$``)."""
    out = []
    for part in _split_alternatives(text):
        s, e = start, end
        while part.startswith("^"):
            s, part = True, part[1:]
        while _ends_with_anchor(part):
            e, part = True, part[:-1]
        s, e, part = _anchors_out_of_groups(s, e, part)
        inner = _whole_group(part)
        if inner is not None:
            out += _branches(inner, s, e)
        else:
            out.append((s, e, part))
    return out


# ---------------------------------------------------------------- one branch

def _branch_fsm(start: bool, end: bool, core: str, most: int | None = None) -> Any:
    """The strings one branch matches (padding included where it is not anchored)."""
    pieces: list[tuple[str, str]] = []  # ("text", regex) or (lookaround opener, inside)
    plain_from = 0
    items = _items(core)
    for idx, (kind, a, b) in enumerate(items):
        if kind == "group" and core.startswith(_LOOK, a):
            pieces.append(("text", core[plain_from:a]))
            opener = core[a:a + (4 if core.startswith(("(?<=", "(?<!"), a) else 3)]
            pieces.append((opener, core[a + len(opener):b - 1]))
            plain_from = b
        elif kind == "atom" and core[a] == "^":
            if any(k != "group" or not core.startswith(_LOOK, x) for k, x, _ in items[:idx]):
                raise RegexDialectError(f"regex: anchor '^' at offset {a} is not supported (only at a branch's start)")
            start = True  # after lookarounds only: the branch starts at the string's start
            pieces.append(("text", core[plain_from:a]))
            plain_from = b
    pieces.append(("text", core[plain_from:]))
    any_char = _fsm(SAFE_RAW_CHAR + "*")
    # right to left: the strings from each position to the string's end
    rest = _fsm(_positive(pieces[-1][1], most)) if pieces[-1][1] else _fsm("")
    if not end:
        rest = rest + any_char
    for kind, inside in reversed(pieces[:-1]):
        if kind == "text":
            if inside:
                rest = _fsm(_positive(inside, most)) + rest
            continue
        if kind in ("(?<=", "(?<!"):
            raise RegexDialectError("regex: lookbehind is not supported (only lookahead)")
        first = all(k != "text" or not t for k, t in pieces[:pieces.index((kind, inside))])
        if kind == "(?=":
            rest = rest & _lookahead_fsm(inside, wide=False, first=first)
            if first and _starts_anchored(inside):
                start = True
        else:
            if first and _starts_anchored(inside):
                start = True  # narrowing: matched from the start, where its '^' holds
            rest = rest - _lookahead_fsm(inside, wide=True, first=first)
    return rest if start else any_char + rest


def _starts_anchored(inside: str) -> bool:
    return any(s for s, _, _ in _branches(inside, False, False))


def _lookahead_fsm(inside: str, wide: bool, first: bool) -> Any:
    """The strings that start with a match of ``inside`` (a lookahead at the start of the
    rest of the string): each branch's match, then anything unless it ends at '$'."""
    out = None
    for s, e, core in _branches(inside, False, False):
        if s and not first:
            raise RegexDialectError("regex: '^' inside a lookahead past the pattern's start is not supported")
        if any(core.startswith(look, a) for kind, a, _ in _items(core) if kind == "group" for look in _LOOK):
            raise RegexDialectError("regex: a lookaround inside a lookaround is not supported")
        f = _fsm(_wide(core) if wide else _positive(core)) if core else _fsm("")
        if not e:
            f = f + _fsm(SAFE_RAW_CHAR + "*") if not wide else f + _fsm("(?:[^\\n]|\\n)*")
        out = f if out is None else out | f
    assert out is not None
    return out


def _positive(text: str, most: int | None = None) -> str:
    """``text`` translated as a part of the pattern's match: a subset reading (regex_text),
    a count past 1000 (``{1,1023}``) lowered to 256 (fewer repetitions: a subset)."""
    out = _scan(_clamped(text), ecma=True, subset=True)
    if most is not None:
        out = reshaped_repetitions(out, 0, most, loops=False)
    try:
        re.compile(out)
    except re.error as exc:
        raise RegexDialectError(f"pattern: {exc}") from exc
    return out


def _clamped(text: str) -> str:
    """``{m,n}`` with ``n`` past 1000 and ``m`` at most 256 as ``{m,256}`` (outside classes)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            out.append(text[i:i + 2])
            i += 2
            continue
        if c == "[":
            j = i + 1
            if j < n and text[j] == "^":
                j += 1
            if j < n and text[j] == "]":
                j += 1
            while j < n and text[j] != "]":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            continue
        m = re.match(r"\{(\d+),(\d+)\}", text[i:]) if c == "{" else None
        if m and int(m.group(2)) > 1000 and int(m.group(1)) <= MAX_REPEAT:
            out.append(f"{{{m.group(1)},{max(int(m.group(1)), MAX_REPEAT)}}}")
            i += m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _wide(text: str) -> str:
    """``text`` translated as a negative lookaround's inside: a superset of what Python's
    and ECMA's readings match. ``_scan``'s plain reading is one, but for ``\\s`` and ``\\d``
    outside a negated class (ASCII there, Unicode-wide in Python): those are written out
    wide; ``\\w`` (all Unicode letters) and flags are refused."""
    out, i = [], 0
    for kind, a, b in _items(text):
        piece = text[a:b]
        if kind == "atom" and piece in ("\\s", "\\d"):
            out.append(text[i:a] + "[" + (_WIDE_SPACE if piece == "\\s" else _wide_digits()) + "]")
            i = b
        elif kind == "atom" and piece.startswith("[") and "\\\\" in piece:
            raise RegexDialectError("regex: an escaped backslash in a class inside a negative lookaround")
        elif kind == "atom" and piece.startswith("[") and not piece.startswith("[^"):
            body = piece[1:-1].replace("\\s", _WIDE_SPACE).replace("\\d", _wide_digits())
            out.append(text[i:a] + "[" + body + "]")
            i = b
        elif kind == "group":
            head = 3 if piece.startswith("(?:") else 1
            if piece.startswith("(?") and head == 1:
                raise RegexDialectError(f"regex: group syntax '{piece[:3]}' inside a negative lookaround")
            out.append(text[i:a] + piece[:head] + _wide(piece[head:-1]) + ")")
            i = b
        elif kind == "atom" and (piece == "\\w" or piece.startswith("[") and "\\w" in piece):
            raise RegexDialectError("regex: '\\w' inside a negative lookaround is not supported")
    body = "".join(out) + text[i:]
    translated = _scan(body, ecma=False)
    try:
        re.compile(translated)
    except re.error as exc:
        raise RegexDialectError(f"pattern: {exc}") from exc
    return translated


@lru_cache(maxsize=1)
def _wide_digits() -> str:
    """Every Unicode decimal digit (Python's \\d on str), as class ranges of \\u escapes."""
    ranges: list[list[int]] = []
    for c in range(0x110000):
        if unicodedata.category(chr(c)) == "Nd":
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    def esc(c: int) -> str:
        return f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"

    return "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges)


# ---------------------------------------------------------------- ECMA Annex B leniencies

_CLASS_ESCAPES = set("dDwWsS")
_SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "b": "\b"}  # \b: backspace in a class
_QUANT = re.compile(r"\{\d+(?:,\d*)?\}")
_AMBIGUOUS_QUANT = re.compile(r"\{,\d*\}")  # Python reads {,n} as {0,n}, ECMA as a literal
_SURROGATES = (0xD800, 0xDFFF)
_HUGE_CLASS = 20_000  # a class of more code points is written as its (exact) complement
_CLASS_WINDOW = 0x2FFF  # or, where that too is large, as its members up to here


def _annex_b(pattern: str) -> str:
    """``pattern`` with the Annex-B leniencies of ECMA-262 written out so Python's ``re`` and
    this module read them as ECMA does (exact, but where noted):

    - a ``]`` or ``}`` outside a class, and a ``{`` that starts no counted repetition, are
      literals (escaped); ``{,n}`` is left for the dialect check to refuse (Python reads a
      repetition there);
    - in a class, a ``[`` is a literal, and a ``-`` next to a class escape (``[\\w-.]``) is a
      literal '-' (ECMA unions both ends with it; Python's ``re`` refuses the range);
    - a positive class drops its lone surrogates (a subset: JSON text never holds one), and
      one listing more than ``_HUGE_CLASS`` code points is written as the complement's
      negation (exact), or where the complement is large too, as its members up to
      ``_CLASS_WINDOW`` (a subset): automata list a class's characters one by one."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            m = _PROPERTY.match(pattern, i)
            out.append(m.group(0) if m else pattern[i:i + 2])
            i = m.end() if m else i + 2
        elif c == "[":
            j, text = _annex_b_class(pattern, i)
            out.append(text)
            i = j
        elif c == "{":
            if _QUANT.match(pattern, i) or _AMBIGUOUS_QUANT.match(pattern, i):
                m = _QUANT.match(pattern, i) or _AMBIGUOUS_QUANT.match(pattern, i)
                out.append(m.group(0))
                i = m.end()
            else:
                out.append("\\{")
                i += 1
        elif c in "]}":
            out.append("\\" + c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _annex_b_class(pattern: str, i: int) -> tuple[int, str]:
    """The class at ``i`` (its end, and its text as ``_annex_b`` writes it)."""
    n = len(pattern)
    j = i + 1
    negated = j < n and pattern[j] == "^"
    if negated:
        j += 1
    if j < n and pattern[j] == "]":  # '[]' / '[^]': left for the dialect check
        return j + 1, pattern[i:j + 1]
    items: list[tuple[str, Any]] = []  # ("cp", code point) / ("esc", text) / ("dash", None)
    while j < n and pattern[j] != "]":
        c = pattern[j]
        if c == "\\" and j + 1 < n:
            e = pattern[j + 1]
            if e in "uU":
                size = 6 if e == "u" else 10
                digits = pattern[j + 2:j + size]
                if len(digits) == size - 2 and re.fullmatch(r"[0-9a-fA-F]+", digits) and int(digits, 16) <= 0x10FFFF:
                    items.append(("cp", int(digits, 16)))
                    j += size
                    continue
            if e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", pattern[j + 2:j + 4]):
                items.append(("cp", int(pattern[j + 2:j + 4], 16)))
                j += 4
                continue
            if e in "pP" and pattern[j + 2:j + 3] == "{" and "}" in pattern[j:]:
                end = pattern.index("}", j) + 1
                items.append(("class", pattern[j:end]))
                j = end
                continue
            if e in _SIMPLE_ESCAPES or not (e.isascii() and e.isalnum()):
                items.append(("cp", ord(_SIMPLE_ESCAPES.get(e, e))))
            else:
                items.append(("class" if e in _CLASS_ESCAPES else "esc", pattern[j:j + 2]))
            j += 2
        elif c == "-":
            items.append(("dash", None))
            j += 1
        else:
            items.append(("cp", ord(c)))
            j += 1
    if j >= n:  # unterminated: left for the dialect check
        return n, pattern[i:]
    # ranges: cp '-' cp; a '-' beside anything else is a literal
    ranges: list[tuple[int, int]] = []
    others: list[str] = []
    k = 0
    while k < len(items):
        kind, value = items[k]
        if (kind == "cp" and k + 2 < len(items) and items[k + 1][0] == "dash" and items[k + 2][0] == "cp"):
            ranges.append((value, items[k + 2][1]))
            k += 3
            continue
        if kind == "cp":
            ranges.append((value, value))
        elif kind == "dash":
            others.append("\\-")
        else:
            others.append(value)
        k += 1
    if any(a > b for a, b in ranges):  # out of order: left for the dialect check
        return j + 1, pattern[i:j + 1]
    if not negated:
        ranges = _without_surrogates(ranges)
        if not others and sum(b - a + 1 for a, b in ranges) > _HUGE_CLASS:
            # the complement, but its surrogates: the negation then also matches lone
            # surrogates, which no JSON text holds raw (as SAFE_RAW_CHAR)
            complement = _without_surrogates(_complement(ranges))
            if sum(b - a + 1 for a, b in complement) <= _HUGE_CLASS:
                if complement:
                    negated, ranges = True, complement
            else:  # both large: the members up to _CLASS_WINDOW (a subset)
                ranges = [(a, min(b, _CLASS_WINDOW)) for a, b in ranges if a <= _CLASS_WINDOW]
    body = "".join(_cp(a) if a == b else _cp(a) + "-" + _cp(b) for a, b in ranges) + "".join(others)
    if not body:  # every member a surrogate: left for the dialect check
        return j + 1, pattern[i:j + 1]
    return j + 1, "[" + ("^" if negated else "") + body + "]"


def _without_surrogates(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in ranges:
        if a < _SURROGATES[0]:
            out.append((a, min(b, _SURROGATES[0] - 1)))
        if b > _SURROGATES[1]:
            out.append((max(a, _SURROGATES[1] + 1), b))
    return out


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, at = [], 0
    for a, b in sorted(ranges):
        if a > at:
            out.append((at, a - 1))
        at = max(at, b + 1)
    if at <= 0x10FFFF:
        out.append((at, 0x10FFFF))
    return out


def _cp(c: int) -> str:
    return f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


# ---------------------------------------------------------------- key patterns (patternProperties)

KEY_REPEAT = 32


def key_pattern_bodies(pattern: str) -> tuple[str | None, str]:
    """Two readings of a ``patternProperties`` pattern over keys of raw JSON string characters:
    ``inner``, a body every one of whose strings matches (``pattern_subset_body``; None where
    that cannot be written: such keys are then never written), and ``outer``, a body holding
    every raw string that matches under Python's ``re`` or ECMA-262 (a superset). A key set
    built as inner sets minus outer sets holds only keys that match exactly the patterns
    chosen, under either reading. ``RegexDialectError`` when no outer reading is found."""
    try:
        inner: str | None = pattern_subset_body(pattern)
    except RegexDialectError:
        inner = None
    if inner is not None:
        # counted repetitions lowered to at most KEY_REPEAT (a subset): a key set's automaton
        # is written back by fsm_regex.py, one nested group per counted step
        inner = reshaped_repetitions(inner, 0, KEY_REPEAT, loops=False)
    return inner, _outer_body(pattern)


def key_pattern_matches(bodies: tuple[str | None, str], name: str) -> bool | None:
    """Whether ``name`` matches the pattern whose ``key_pattern_bodies`` are ``bodies``: True
    when the inner reading holds it, False when the outer one does not, else None."""
    if not re.fullmatch(SAFE_RAW_CHAR + "*", name):
        return None  # (both readings are of raw characters only)
    inner, outer = bodies
    if inner is not None and re.fullmatch(inner, name):
        return True
    return False if not re.fullmatch(outer, name) else None


def _outer_body(pattern: str) -> str:
    """A superset of the raw strings ``pattern`` matches: each branch keeps its leading ``^``
    and trailing ``$``; every other zero-width assertion (lookaround, ``\\b``, inner anchors)
    is dropped (fewer conditions: more matches), each class, shorthand, property or ``.``
    reads as every character but the printable ASCII ones it leaves out (on those Python and
    ECMA agree), lazy and possessive marks are dropped, and a count past ``MAX_REPEAT`` is
    unbounded (more repetitions: more matches)."""
    m = _FLAGS.match(pattern[1:] if pattern.startswith("^") else pattern)
    if m and "i" in m.group(1):
        raise RegexDialectError("regex: '(?i)' in a key pattern is not supported")
    if m:  # (?s) / (?m): a raw key holds no newline, so these change nothing
        cut = m.end() + (1 if pattern.startswith("^") else 0)
        pattern = ("^" if pattern.startswith("^") else "") + pattern[cut:]
    pattern = _annex_b(pattern)
    pad = SAFE_RAW_CHAR + "*"
    parts = []
    for s, e, core in _branches(pattern, False, False):
        parts.append(("" if s else pad) + "(?:" + _outer(core) + ")" + ("" if e else pad))
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    try:
        re.compile(body)
        _fsm(body)
    except Exception as exc:  # interegular raises several unrelated exception types
        raise RegexDialectError(f"pattern: {exc}") from exc
    return body


def _outer(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    can_quantify = False
    while i < n:
        c = text[i]
        if c == "\\":
            e = text[i + 1:i + 2]
            if not e:
                raise RegexDialectError("regex: trailing backslash")
            m = _PROPERTY.match(text, i)
            if m:
                out.append(_outer_class(m.group(0)))
                i = m.end()
            elif e in "bB":  # a word boundary: dropped
                i += 2
                can_quantify = False
                continue
            elif e in "AZ":  # Python's anchors, ECMA's letters: the letter or nothing
                out.append(f"(?:{e})?")
                i += 2
            elif e in _CLASS_ESCAPES:
                out.append(_outer_class(text[i:i + 2]))
                i += 2
            elif e in "uU":
                ch, size = _code_point_or_none(text, i)
                if ch is None:
                    raise RegexDialectError(f"regex: escape '{text[i:i + size]}' is not a Unicode scalar value")
                out.append(escape_literal(ch))
                i += size
            elif e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 2:i + 4]):
                out.append(escape_literal(chr(int(text[i + 2:i + 4], 16))))
                i += 4
            elif e in _SIMPLE_ESCAPES and e != "b" or not (e.isascii() and e.isalnum()):
                out.append(escape_literal(_SIMPLE_ESCAPES.get(e, e)))
                i += 2
            else:
                raise RegexDialectError(f"regex: escape '\\{e}' in a key pattern is not supported")
            can_quantify = True
        elif c == "[":
            end = _class_end(text, i)
            out.append(_outer_class(text[i:end]))
            i = end
            can_quantify = True
        elif c == "(":
            end = next(b for kind, a, b in _items(text[i:]) if a == 0)
            group = text[i:i + end]
            if group.startswith(_LOOK):  # a lookaround: dropped, with any quantifier after it
                i += end
                q = re.match(r"(?:[*+?]|\{\d+(?:,\d*)?\})[?+]?", text[i:])
                i += q.end() if q else 0
                can_quantify = False
                continue
            named = _NAMED.match(group)
            head = named.end() if named else 3 if group.startswith("(?:") else 1
            if group.startswith("(?") and not named and head == 1:
                raise RegexDialectError(f"regex: group syntax '{group[:3]}' in a key pattern is not supported")
            out.append("(?:" + _outer(group[head:-1]) + ")")
            i += end
            can_quantify = True
        elif c in "^$":  # an anchor inside the pattern: dropped
            i += 1
            can_quantify = False
            continue
        elif c in "*+?{":
            q = re.match(r"(?:[*+?]|\{(\d+)(?:(,)(\d*))?\})", text[i:])
            if not q or not can_quantify:
                raise RegexDialectError(f"regex: quantifier at offset {i} in a key pattern is not supported")
            tok = q.group(0)
            if tok.startswith("{"):
                lo = min(int(q.group(1)), MAX_REPEAT)
                hi = q.group(3) if q.group(2) else q.group(1)
                tok = f"{{{lo},}}" if not hi or int(hi) > MAX_REPEAT else f"{{{lo},{hi}}}"
            out.append(tok)
            i += q.end()
            if i < n and text[i] in "?+":  # lazy or possessive: the same strings, or fewer
                i += 1
            can_quantify = False
        elif c == ".":
            out.append(SAFE_RAW_CHAR)
            i += 1
            can_quantify = True
        elif c in "|)":
            out.append(c)
            i += 1
            can_quantify = False
        else:
            out.append(escape_literal(c))
            i += 1
            can_quantify = True
    return "".join(out)


def _class_end(text: str, i: int) -> int:
    j = i + 1
    if j < len(text) and text[j] == "^":
        j += 1
    if j < len(text) and text[j] == "]":
        j += 1
    while j < len(text) and text[j] != "]":
        j += 2 if text[j] == "\\" else 1
    if j >= len(text):
        raise RegexDialectError(f"regex: unterminated character class at offset {i}")
    return j + 1


_PRINTABLE = [chr(c) for c in range(0x20, 0x7F) if chr(c) not in '"\\']


def _outer_class(atom: str) -> str:
    """A class (or shorthand, or property escape) as every raw character but the printable
    ASCII ones it leaves out: Python's ``re`` decides those (properties by their general
    category, as regex_text reads them); non-ASCII ones are all kept (a superset)."""
    left_out = [c for c in _PRINTABLE if not _ascii_member(atom, c)]
    return "[^" + "".join(class_literal(c) for c in left_out) + '"\\\\\\x00-\\x1f]'


def _ascii_member(atom: str, ch: str) -> bool:
    """Whether printable ASCII ``ch`` matches ``atom`` (True where unsure)."""
    props = _PROPERTY.findall(atom)
    if not props:
        try:
            return re.fullmatch(atom, ch) is not None
        except re.error:
            return True
    if not atom.startswith("["):  # \p{..} / \P{..} alone
        member = _property_member(atom, ch)
        return True if member is None else member
    negated = atom.startswith("[^")
    members = [_property_member(p, ch) for p in props]
    if None in members:
        return True
    inside = any(members)
    rest = _PROPERTY.sub("", atom)[2 if negated else 1:-1]
    if not inside and rest:
        try:
            inside = re.fullmatch("[" + rest + "]", ch) is not None
        except re.error:
            return True
    return inside != negated


def _property_member(escape: str, ch: str) -> bool | None:
    """Whether ``ch`` has the property (None for a property regex_text does not know)."""
    from treadle.constrained.regex_text import _property_test

    try:
        test = _property_test(escape, 0)
    except RegexDialectError:
        return None
    return test(ord(ch), unicodedata.category(ch)) != (escape[1] == "P")


def _code_point_or_none(text: str, i: int) -> tuple[str | None, int]:
    size = 6 if text[i + 1] == "u" else 10
    digits = text[i + 2:i + size]
    if len(digits) != size - 2 or not re.fullmatch(r"[0-9a-fA-F]+", digits):
        raise RegexDialectError(f"regex: escape '\\{text[i + 1]}' at offset {i} needs {size - 2} hex digits")
    code = int(digits, 16)
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return None, size
    return chr(code), size

"""JSON Schema ``pattern``s that ``regex_text.pattern_to_body`` cannot write, written as a
subset of what they match (sound: every output matches the pattern) or exactly.

``pattern_subset_body(pattern)`` tries ``pattern_to_body`` first; when that refuses, it
reads the pattern again with these rules, each argued where it is applied:

- the syntax is checked by Python's ``re`` with ECMA-2018's named groups, lookbehinds of
  any width and inline flags put its way (``_syntax_view``): those validators read with the
  ``regex`` module, and a pattern no reader takes is refused;
- inline flags ``(?s)``, ``(?i)``, ``(?m)`` (Java's and Python's, as CloudFormation writes
  them, ``^(?s)`` or ``(?!(?i)aws)``) are dropped wherever they stand: case-sensitive
  ``.``-without-newline matching is a subset, and a body never holds a newline, so multiline
  anchors mean what plain ones do (narrowing); under ``i`` the negative lookarounds are read
  case-insensitively, each letter widened to its whole case class (``_folded``);
- anchors per branch: ``^a|b$`` is "starts with a, or ends with b"; a branch that is one
  group, ``(^x$)`` or ``^(a|b)$``, is unwrapped and its alternatives take the anchors (exact);
- named groups ``(?<n>x)`` / ``(?P<n>x)`` are plain groups (exact);
- assertions of a branch (lookahead, lookbehind, ``^`` / ``$`` / ``\\A`` / ``\\Z`` anywhere,
  ``\\b`` / ``\\B``) by automata (``_branch_fsm``: its segments run beside every lookbehind
  from the string's start and every lookahead from where it stands; exact, written back by
  fsm_regex.py), after groups holding one are written out per alternative (``_distributed``;
  a repeated one its fewest times: a subset). A negative lookaround's ``x`` is read WIDE (a
  superset of both Python's and ECMA's meaning: ``.`` any but a newline, ``\\s`` and ``\\d``
  Unicode-wide), since subtracting a smaller set would keep too much; ``\\b`` reads its
  neighbours as ASCII word / non-word characters (a subset); ``\\A`` / ``\\Z`` as Python's
  ``re`` does (jsonschema's validator); a leading lookahead of lengths only as lengths
  (the rest's repetitions reshaped: a subset); a lookbehind branch anchored at '^' reads the
  whole prefix; a positive lookaround whose counts overlap (``(.{1,63}/)?.{1,63}``) has them
  lowered to 4 (a subset), a negative one is refused; an automaton too large to write is tried again
  as whole matches, then with counts lowered to 16 and 4 (subsets);
- characters JSON must escape (a pattern written over ``\\u0000-\\uFFFF``) are left out, the
  pattern's automaton intersected with the raw JSON string characters (narrowing); a branch
  of a class of such characters only (``^([\\n\\t])|(,)$``) adds nothing.

Every output stays in the regex dialect regex_text.py describes (no lookaround, no anchors).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

import interegular

from treadle.constrained.regex import fsm_crawl
from treadle.constrained.regex.fsm_regex import fsm_to_regex
from treadle.constrained.regex.required_first import needs_first
from treadle.constrained.regex.regex_text import (
    MAX_REPEAT,
    json_safe_atoms,
    has_top_level_alternation,
    class_literal,
    escape_literal,
    SAFE_RAW_CHAR,
    RegexDialectError,
    _RAW_UNSAFE_POINTS,
    _ends_with_anchor,
    _scan,
    pattern_to_body,
    reshaped_repetitions,
    _sre_constants,
    _sre_parse,
)

__all__ = ["key_pattern_bodies", "key_pattern_matches", "pattern_json_body", "pattern_subset_body"]

_FLAGS = re.compile(r"\(\?([ims]+)\)")
_NAMED = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_LONG_COUNT = re.compile(r"\{(?:\d*,\d{2,}|\d{2,},?)\}")  # {0,16}, {16,}, {16}: a count of 10 or more
_LOOP_THEN_LONG_COUNT = re.compile(r"(?:[*+]|\{\d+,\}).*\{(?:\d*,\d{2,}|\d{2,},?)\}")
_PROPERTY = re.compile(r"\\[pP]\{[^}]*\}")
_LOOK = ("(?=", "(?!", "(?<=", "(?<!")
# every character Python's str \s or ECMA's \s matches (str.isspace, and U+FEFF for ECMA); none
# lies past the BMP, so the BMP alone is read (the whole range cost 0.2 s of every import)
_WIDE_SPACE = "".join(f"\\u{c:04x}" for c in range(0x10000) if chr(c).isspace()) + "\\ufeff"


def pattern_subset_body(pattern: str) -> str:
    """A string body (the characters between a JSON string's quotes) every one of whose
    strings matches ``pattern`` (ECMA-262 search semantics, and Python's ``re.search``);
    ``RegexDialectError`` naming what is left that cannot be written. Remembered per pattern
    (a schema repeats a few patterns, CloudFormation's '^[a-zA-Z0-9]+$' 1,930 times, and
    each costs interegular's FSMs, ~2 ms)."""
    body, error = _subset_body_or_error(pattern)
    if error is not None:
        raise type(error)(*error.args) from error.__cause__
    return body


@fsm_crawl.memo(maxsize=4096)  # (charged its work on every call: fsm_crawl.memo)
def _subset_body_or_error(pattern: str) -> tuple[str | None, RegexDialectError | None]:
    try:
        return _absorbed_counts(_pattern_subset_body(pattern)), None
    except RegexDialectError as exc:
        return None, exc


def pattern_json_body(pattern: str) -> str:
    """``pattern_subset_body``, or, where that finds no string JSON writes raw (BizTalk's
    ``\\w+[\\\\](\\w+\\.)*\\w+\\.dll``, a PEM certificate's line breaks), a body that writes the
    characters JSON must escape as their escapes (``\\n``, ``\\t``, ``\\"``, ``\\\\``, ``\\u00XX``:
    sound, the string JSON decodes holds the character). Its strings are JSON text, not the
    decoded strings: an escape is several characters of the body and one of the string, so it
    is for a pattern with no length bounds (those count the body's characters), and not for
    key patterns (their key sets are raw). Patterns with assertions but anchors stay refused."""
    try:
        return pattern_subset_body(pattern)
    except RegexDialectError as exc:
        if not any(w in str(exc) for w in ("JSON must escape", "no string JSON can hold raw")):
            raise
        first = exc
    try:
        return _escaped_body(pattern)
    except RegexDialectError as exc:
        raise RegexDialectError(f"{first} (and with JSON escapes: {exc})") from exc


def _escaped_body(pattern: str) -> str:
    """The strings ``pattern`` matches (anchors per branch, raw padding where unanchored: a
    subset), over every character, written as JSON text (``_json_text``)."""
    pattern, _ = _case_sensitive(_annex_b(pattern))
    pattern = _python_anchors(_unnamed(pattern))
    parts = []
    for s, e, core in [b for s0, e0, c0 in _branches(pattern, False, False) for flat in _distributed(c0)
                       for b in _branches(flat, s0, e0)]:
        if _zero_width(core):
            raise RegexDialectError("pattern: its assertions are not written with characters JSON escapes")
        translated = _scan(core, ecma=True) if core else ""
        parts.append(("" if s else _PAD) + "(?:" + translated + ")" + ("" if e else _PAD))
    fsm = _minimal(_fsm("(?:" + "|".join(parts) + ")"))
    written = _written(fsm)
    if written is None:
        raise RegexDialectError("pattern: matches no string")
    return _json_text(written)


# each character JSON must escape that has a short escape, as a regex of that escape's text
_SHORT_ESCAPES = {0x22: '\\\\"', 0x5C: "\\\\\\\\", 0x08: "\\\\b", 0x09: "\\\\t", 0x0A: "\\\\n", 0x0C: "\\\\f",
                  0x0D: "\\\\r"}


def _json_text(regex: str) -> str:
    """``regex`` (written by fsm_regex.py: each character a class) with each class that holds
    characters JSON must escape as its raw members or those characters' escapes."""
    out, i = [], 0
    while i < len(regex):
        if regex[i] == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if regex[i] != "[":
            out.append(regex[i])
            i += 1
            continue
        j = i + 1
        while regex[j] != "]":
            j += 2 if regex[j] == "\\" else 1
        out.append(_escaped_class(regex[i:j + 1]))
        i = j + 1
    return "".join(out)


def _escaped_class(cls: str) -> str:
    rx = re.compile(cls)
    unsafe = [c for c in (*range(0x20), 0x22, 0x5C) if rx.fullmatch(chr(c))]
    if not unsafe:
        return cls
    if cls.startswith("[^"):
        raw = cls[:-1] + '\\x00-\\x1f"\\\\]'
    else:
        members = "".join(ch for ch in _class_members(cls) if ord(ch) not in unsafe)
        raw = "[" + "".join(class_literal(ch) for ch in members) + "]" if members else None
    escapes = [_SHORT_ESCAPES.get(c, f"\\\\u{c:04x}") for c in unsafe]
    return "(?:" + "|".join(([raw] if raw else []) + escapes) + ")"


def _class_members(cls: str) -> str:
    """The members of a positive class fsm_regex.py wrote (``class_literal``s, its ranges listed)."""
    tokens = _CLASS_TOKEN.findall(cls[1:-1])
    chars = [chr(int(t[2:], 16)) if t.startswith("\\x") else t[-1] for t in tokens]
    out, k = [], 0
    while k < len(tokens):
        if k + 2 < len(tokens) and tokens[k + 1] == "-":
            out.extend(chr(c) for c in range(ord(chars[k]), ord(chars[k + 2]) + 1))
            k += 3
        else:
            out.append(chars[k])
            k += 1
    return "".join(out)


_CLASS_TOKEN = re.compile(r"\\x[0-9a-f]{2}|\\.|.", re.S)


_PAD = SAFE_RAW_CHAR + "*"
_COUNT = re.compile(r"\{(\d+)(,(\d*))?\}")
_COUNT_AT_END = re.compile(r"\{(\d+)(,(\d*))?\}\Z")


def _absorbed_counts(body: str) -> str:
    """``body`` (``pad* (?:T) pad*``, a pad on either side or both) with a counted repetition
    ``X{m,n}`` (or ``X{m,}``) that starts T after a leading pad, or ends it before a trailing
    one, written ``X{m}``: the same strings, since the copies past m are themselves raw JSON
    characters (T's strings all are) that the pad takes. The automaton of the pattern, which
    json_schema builds next, no longer tracks every count at once: '[A-Za-z0-9][A-Za-z0-9\\-_]{3,31}'
    unanchored (CloudFormation's AppRunner names) had ~2^28 states."""
    left = body.startswith(_PAD + "(?:")
    right = body.endswith(")" + _PAD)
    if not (left or right):
        return body
    a, b = (len(_PAD) if left else 0), len(body) - (len(_PAD) if right else 0)
    try:
        items = _items(body[a:b])
    except RegexDialectError:
        return body
    if len(items) != 1 or items[0][0] != "group" or not body.startswith("(?:", a):
        return body
    core = body[a + 3:b - 1]
    if right:
        m = _COUNT_AT_END.search(core)
        if m is not None and m.start() > 0 and m.group(2) and _unescaped(core, m.start()):
            core = core[:m.start()] + "{" + m.group(1) + "}"
    if left:
        try:
            first = _items(core)[0] if core else None
        except RegexDialectError:
            first = None
        if first is not None and first[0] in ("atom", "group") and core[first[1]:first[2]] not in ("^", "$"):
            m = _COUNT.match(core, first[2])
            if m is not None and m.group(2) and core[m.end():m.end() + 1] not in ("?", "+"):
                core = core[:m.start()] + "{" + m.group(1) + "}" + core[m.end():]
    return body[:a] + "(?:" + core + ")" + body[b:]


def _unescaped(text: str, i: int) -> bool:
    """Whether ``text[i]`` is not escaped (an even run of backslashes before it)."""
    n = 0
    while i - n - 1 >= 0 and text[i - n - 1] == "\\":
        n += 1
    return n % 2 == 0


def _pattern_subset_body(pattern: str) -> str:
    pattern = _annex_b(pattern)
    try:
        return pattern_to_body(pattern, subset=True)
    except RegexDialectError as exc:
        first = exc
    try:
        re.compile(_syntax_view(_PROPERTY.sub("p", pattern)))  # (Unicode property escapes: regex_text reads them)
    except (re.error, RegexDialectError) as exc:  # no validator could check an output
        raise RegexDialectError(f"{first} (and Python's re cannot read the pattern: {exc})") from exc
    try:
        return _subset_body(pattern)
    except RegexDialectError as exc:
        raise RegexDialectError(f"{first}" if str(exc) == str(first) else f"{exc}") from exc


def _subset_body(pattern: str) -> str:
    pattern, flags = _case_sensitive(pattern)  # (narrowing, see the module docstring)
    pattern = _python_anchors(_unnamed(pattern))
    if "i" in flags:
        pattern = _folded_negatives(pattern)
    pad = SAFE_RAW_CHAR + "*"
    parts = []
    branches = [(s, e, flat) for s, e, core in _branches(pattern, False, False) for flat in _distributed(core)]
    if len(branches) > _MAX_BRANCHES:
        raise RegexDialectError(f"pattern: its assertions inside groups make more than {_MAX_BRANCHES} branches")
    unwritable: RegexDialectError | None = None
    passed: set = set()
    for s, e, core in branches:
        try:
            written = _branch_body(s, e, core, passed)
        except RegexDialectError as exc:
            if "JSON must escape" not in str(exc):
                raise
            # a branch of a class of characters JSON escapes only ('^([\\n\\t])|(\\r\\n)|(,)$'):
            # no raw string matches it, so it adds nothing (the others still match: a subset)
            unwritable, written = exc, None
        if written is not None:  # (a branch no string matches adds nothing)
            parts.append(written)
    if not parts:
        raise unwritable or RegexDialectError("pattern: matches no string")
    body = parts[0] if len(parts) == 1 else _padded_union(parts)
    if json_safe_atoms(body):  # raw JSON characters only, read off its atoms (no automaton)
        return body
    raw = _raw_only(body)
    if raw is None:
        raise RegexDialectError("pattern: no string JSON can hold raw matches it")
    if json_safe_atoms(raw):  # (its escaped-only parts left out, no automaton: exact)
        return raw
    fsm = interegular.parse_pattern(body).to_fsm()
    safe = _fsm(pad)
    if not (fsm - safe).empty():
        body = _written(fsm & safe)  # raw JSON string characters only (narrowing)
        if body is None:
            raise RegexDialectError("pattern: no string JSON can hold raw matches it")
    return body


def _raw_only(text: str) -> str | None:
    """``text`` (a written body) with each part that matches only characters JSON escapes (a
    literal '"', '\\' or control character, or a class of those alone) taken out: an
    alternative that needs one is dropped, an optional one (``?``, ``*``, ``{0,n}``) left out;
    None when no alternative is left. Exact over raw strings (no raw string holds such a part),
    and no automaton is built: an unanchored one with a loop ('.+\\.yml') can write a regex
    past every cap once intersected with the raw characters."""
    kept = [s for s in map(_raw_sequence, _split_alternatives(text)) if s is not None]
    return "|".join(kept) if kept else None


def _raw_sequence(text: str) -> str | None:
    """One alternative of ``_raw_only``: None when it needs an escaped-only part."""
    out, done = [], 0
    for kind, a, b in _items(text):
        if a < done:
            continue  # (a quantifier's characters, taken with what it repeats)
        q = _QUANTIFIER.match(text, b)
        end = q.end() if q else b
        if kind == "group":
            head = _group_head(text, a)
            inner = _raw_only(text[head:b - 1])
            piece = None if inner is None else text[a:head] + inner + ")"
        else:
            piece = None if _escaped_only(text[a:b]) else text[a:b]
        if piece is None and _least(q) > 0:
            return None
        if piece is not None:
            out.append(piece + text[b:end])
        done = end
    return "".join(out)


def _least(q: re.Match | None) -> int:
    """The fewest repetitions of the ``_QUANTIFIER`` match ``q`` (None: once)."""
    if q is None:
        return 1
    return {"?": 0, "*": 0, "+": 1}[q.group(1)] if q.group(1) else int(q.group(2))


def _escaped_only(atom: str) -> bool:
    """Whether the atom ``atom`` (a character, an escape or a class) matches only characters
    JSON escapes (``_RAW_UNSAFE_POINTS``); False where Python's parse cannot tell."""
    try:
        (op, arg), = _sre_parse.parse(atom)
    except (re.error, ValueError):
        return False
    if op is _sre_constants.LITERAL:
        return arg in _RAW_UNSAFE_POINTS
    if op is not _sre_constants.IN:
        return False
    for kind, value in arg:
        if kind is _sre_constants.LITERAL and value in _RAW_UNSAFE_POINTS:
            continue
        if kind is _sre_constants.RANGE and all(p in _RAW_UNSAFE_POINTS for p in range(value[0], value[1] + 1)):
            continue
        return False
    return True


_FLAG_GROUP = re.compile(r"\(\?[aimsux]+\)")


def _syntax_view(text: str) -> str:
    """``text`` as Python's ``re`` can check its syntax: ECMA-2018's named groups ``(?<n>x)``
    as plain ones, lookbehinds (ECMA's may have any width, Python's only one) as lookaheads,
    inline flags dropped (Python 3.11 takes them only at the pattern's start; CloudFormation
    writes ``^(?s)`` and ``(?!(?i)aws)``, which the ``regex`` module, jsonschema users' ECMA
    reader, takes). Only for the check: nothing is matched with it."""
    out, i = [], 0
    for kind, a, b in _items(text):
        if kind != "group":
            continue
        if _FLAG_GROUP.fullmatch(text, a, b):
            out.append(text[i:a])
        else:
            named = _NAMED.match(text, a)
            head = named.end() if named else _group_head(text, a)
            opener = "(?:" if named else text[a:head].replace("(?<", "(?")
            out.append(text[i:a] + opener + _syntax_view(text[head:b - 1]) + ")")
        i = b
    out.append(text[i:])
    return "".join(out)


_NEGATED = re.compile(r"\[\^|\\[WP]")  # a negated class, \W, \P{..}: what case-folding widens what they exclude


def _case_sensitive(text: str) -> tuple[str, str]:
    """``text`` read without its flags (``_flags_dropped``), refused where an 'i' flag held a
    negated class, ``\\W`` or ``\\P{..}``: read case-sensitively those take letters the
    case-insensitive reading excludes (``(?i)[^a]`` takes 'A'), so that reading is no subset."""
    text, flags = _flags_dropped(text)
    if "i" in flags and _NEGATED.search(text):
        raise RegexDialectError("regex: a negated class (or \\W, \\P{..}) under the flag 'i' is not supported")
    return text, flags


def _flags_dropped(text: str) -> tuple[str, str]:
    """``text`` without its inline flag groups ``(?i)``, ``(?s)``, ``(?m)`` (wherever they
    stand: Python's ``re`` takes them at the start, the ``regex`` module anywhere, scoped or
    for the whole pattern), and the flags they held. Read without them, each part of the
    match is case-sensitive and its '.' leaves out newlines (a subset under either scope);
    a string body holds no raw newline, so '^' / '$' mean what they do without 'm'. The
    negative lookarounds are then read case-insensitively where 'i' was set
    (``_folded_negatives``)."""
    out, flags, i = [], "", 0
    for kind, a, b in _items(text):
        if kind != "group":
            continue
        m = _FLAGS.fullmatch(text, a, b)
        if m:
            flags += m.group(1)
            out.append(text[i:a])
        else:
            head = _group_head(text, a)
            inner, more = _flags_dropped(text[head:b - 1])
            flags += more
            out.append(text[i:head] + inner + ")")
        i = b
    out.append(text[i:])
    return "".join(out), flags


def _folded_negatives(text: str) -> str:
    """``text`` with the inside of each negative lookaround ``_folded`` (a pattern under
    '(?i)': what such a lookaround excludes is read as wide as any engine's case-insensitive
    reading, so no string it excludes is written)."""
    out, i = [], 0
    for kind, a, b in _items(text):
        if kind != "group":
            continue
        head = _group_head(text, a)
        negative = text.startswith(("(?!", "(?<!"), a)
        inner = _folded(text[head:b - 1]) if negative else _folded_negatives(text[head:b - 1])
        out.append(text[i:head] + inner + ")")
        i = b
    out.append(text[i:])
    return "".join(out)


def _folded(text: str) -> str:
    """``text`` with each letter, alone or in a positive class, widened to its case class
    (``_case_partners``); a negated class is kept (its case-sensitive reading already holds
    every member of the insensitive one). A code-point escape of a letter is refused."""
    out, i = [], 0
    for kind, a, b in _items(text):
        piece = text[a:b]
        if kind == "group":
            head = _group_head(text, a)
            out.append(text[i:head] + _folded(text[head:b - 1]) + ")")
        elif kind == "atom" and piece.startswith("[") and not piece.startswith("[^"):
            added = _case_partners(_wide(piece))
            out.append(text[i:a] + piece[:-1] + "".join(_cp(c) for c in added) + "]")
        elif kind == "atom" and piece.startswith("\\") and piece[1:2] in ("u", "x", "U", "c", "p", "P"):
            raise RegexDialectError(f"regex: escape '{piece}' inside a negative lookaround under '(?i)'")
        elif kind == "atom" and len(piece) == 1 and _case_partners(re.escape(piece)):
            out.append(text[i:a] + "[" + class_literal(piece) + "".join(_cp(c) for c in _case_partners(re.escape(piece))) + "]")
        else:
            continue
        i = b
    out.append(text[i:])
    return "".join(out)


def _case_partners(regex: str) -> list[int]:
    """The code points (no lone surrogate) that ``regex`` (one character class) does not match but
    that share a case class with one it matches."""
    rx = re.compile(regex)
    roots = _case_roots()
    matched = {r for c, r in roots.items() if rx.fullmatch(chr(c))}
    return [c for c, r in roots.items() if r in matched and not rx.fullmatch(chr(c))]


@lru_cache(maxsize=1)
def _case_roots() -> dict[int, int]:
    """Each cased code point (all lie below U+1E960) to a representative of its case class:
    the classes joined by one-character lower / upper / casefold mappings, which hold every
    pair Python's ``re``, the ``regex`` module or ECMA-262's ``/i`` take as equal ('s' with
    U+017F, 'k' with the Kelvin sign U+212A)."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for c in range(0x1E960):
        ch = chr(c)
        for m in (ch.lower(), ch.upper(), ch.casefold()):
            if len(m) == 1 and m != ch:
                parent[root(c)] = root(ord(m))
    return {c: root(c) for c in parent}


def _padded_union(parts: list[str]) -> str:
    """The union of ``parts``; where each is one group with free characters on both sides,
    ``pad (?:g1|g2) pad`` (the same strings), which json_schema writes under lengths as a
    padded match."""
    cores = [p[len(_PAD):-len(_PAD)] for p in parts if p.startswith(_PAD) and p.endswith(_PAD)]
    if len(cores) == len(parts) and all(len(_items(c)) == 1 and _items(c)[0][0] == "group" for c in cores):
        return _PAD + "(?:" + "|".join(cores) + ")" + _PAD
    return "(?:" + "|".join(parts) + ")"


# (then maybe an optional dot, as host name patterns write it: ``(?=.{1,253}\.?$)``, whose
# strings of lo..hi characters all pass it: a subset)
_LENGTH_LOOKAHEAD = re.compile(r"(?:\.|\[\\s\\S\]|\[\\S\\s\])(?:\{(\d+)(?:(,)(\d*))?\}|([*+]))(?:\\\.\?)?")


def _leading_length(start: bool, core: str) -> tuple[int, int | None, str] | None:
    """``(lo, hi, rest)`` when ``core`` starts with a lookahead that only counts the string's
    characters (``(?=.{2,256}$)``, ``(?=^.{1,63})``, ``(?=.{1,253}\\.?$)``) where it stands at the
    string's start: the string has ``lo..hi`` characters (``hi`` None: no bound; '.' matches every
    character an output holds, no raw newline; a string of ``hi + 1`` ending in the optional
    dot is left out), and ``rest`` is the core after it."""
    items = _items(core)
    if not items or items[0][0] != "group" or not core.startswith("(?=", 0):
        return None
    inner = _branches(core[3:items[0][2] - 1], False, False)
    if len(inner) != 1:
        return None
    s, e, count = inner[0]
    m = _LENGTH_LOOKAHEAD.fullmatch(count)
    if m is None or not (start or s):
        return None
    if m.group(4):
        lo, hi = (0 if m.group(4) == "*" else 1), None
    else:
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
    return lo, hi if e else None, core[items[0][2]:]


def _branch_body(s: bool, e: bool, core: str, passed: set | None = None) -> str | None:
    """One branch (anchored at its start ``s`` / end ``e``, ``core`` between) as a body, or
    None where no string matches it. ``passed``: the tries of ``_assertion_branch_body`` whose
    automaton passed its cap in an earlier branch of the same pattern."""
    pad = SAFE_RAW_CHAR + "*"
    length = _leading_length(s, core)
    if length is not None:
        # a leading lookahead of lengths only: the rest's body, its repetitions reshaped so its
        # strings have those lengths (json_schema's minLength / maxLength reading: a subset)
        from treadle.constrained.schema.json_schema import _reshaped_to_lengths

        lo, hi, rest = length
        body = _branch_body(True, e, rest, passed)
        if body is None:
            return None
        reshaped = _reshaped_to_lengths(body, lo, hi)
        if reshaped is None:
            raise RegexDialectError(f"pattern: no strings of {lo}..{'' if hi is None else hi} characters are found "
                                    "in the rest of the pattern after its length lookahead")
        return reshaped
    if _zero_width(core, top=True) and (s and e or not _boundaries_inside(core)):
        written = _assertion_branch_body(s, e, core, passed if passed is not None else set())
    elif _zero_width(core, top=True):
        # word boundaries whose neighbours are both the match's own characters: the match
        # whole, with free characters beside it (exact: padding changes no boundary; its
        # automaton does not follow every place a match may start)
        fsm = _minimal(_branch_fsm(True, True, core))
        written = _written(fsm) if len(fsm.states) <= _WRITE_STATES else None
        if written is None:
            return None if not len(fsm.states) else _branch_body(True, True, core)
        written = ("" if s else pad) + "(?:" + written + ")" + ("" if e else pad)
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
        written = lead + written + ("" if e or not written and lead else pad)
    return written


def _assertion_branch_body(s: bool, e: bool, core: str, passed: set) -> str | None:
    """A branch whose assertions stand at its top level, written from its automaton: exact
    first; where its regex is too long, the strings that are a match whole (no padding around
    it), then also with the counted repetitions of the match lowered to at most 16, then 4
    (fewer strings each time: a subset), then that last automaton over fewer characters
    (``_written_over_fewer_symbols``), then, for the password rule's shape, a character of each
    class a lookahead asks for first (``required_first.needs_first``). (An unanchored core with a long counted repetition is
    written from the string's start at once: padding before it is exponential in the count.)
    A try whose assertions' automaton passed its cap is added to ``passed`` and not tried
    again for the pattern's later branches (the branches of one group share its assertions:
    each such try costs seconds), the last one excepted."""
    s = s or bool(_LONG_COUNT.search(core))
    tries = [(s, e, None), (True, True, None), (True, True, 16), (True, True, 4)]
    failure: RegexDialectError | None = None
    for n, (s_, e_, most) in enumerate(tries):
        if n and (s_, e_, most) == tries[n - 1] or (s_, e_, most) in passed and n < len(tries) - 1:
            continue
        fsm = None
        try:
            fsm = _minimal(_branch_fsm(s_, e_, core, most))
            if len(fsm.states) > _WRITE_STATES:
                raise RegexDialectError(f"pattern: its automaton of {len(fsm.states)} states would exceed "
                                        f"{_WRITE_STATES} to write")
            return _written(fsm)
        except RegexDialectError as exc:
            if not any(w in str(exc) for w in ("exceed", "nest")):
                raise
            if "assertions' automaton" in str(exc):
                passed.add((s_, e_, most))
            failure = exc
    assert failure is not None
    try:
        if fsm is None or len(fsm.states) > _WRITE_STATES:
            raise failure
        return _written_over_fewer_symbols(fsm, failure)
    except RegexDialectError as exc:
        if not any(w in str(exc) for w in ("exceed", "nest")):
            raise
        # lookaheads each asking for a character of a class, then one repeated class (the
        # password rule): one of each first, then the rest (required_first.py: a subset)
        first = needs_first(core, _positive, _fsm)
        if first is None:
            raise
        return first


# the regex of an automaton written over fewer characters (``_written_over_fewer_symbols``):
# kept short, since the branches of a pattern are joined and then counted under lengths
_FEWER_SYMBOLS_LIMIT = 2_000


def _written_over_fewer_symbols(fsm: Any, exc: RegexDialectError) -> str:
    """``fsm`` (too large to write) written without the edges of some of its symbols (each a
    set of characters its edges share): a sub-automaton, so its strings are a subset of
    ``fsm``'s (for an assertion's automaton, every one still meets every assertion). Symbols
    are taken out one at a time, each time the one whose removal leaves the fewest states
    while some string is left ('.' and '-' of an ARN's segment checks: what stays is letters,
    digits and the literal parts), until the regex is at most ``_FEWER_SYMBOLS_LIMIT``
    characters; ``exc`` is raised again when none is found."""
    symbols = sorted({sym for row in fsm.map.values() for sym in row})
    while symbols:
        smallest = None
        for sym in symbols:
            candidate = _minimal(_without_symbol(fsm, sym))
            if not candidate.empty() and (smallest is None or len(candidate.states) < len(smallest[1].states)):
                smallest = (sym, candidate)
        if smallest is None:
            break
        symbols.remove(smallest[0])
        fsm = smallest[1]
        try:
            return _written(fsm, _FEWER_SYMBOLS_LIMIT)
        except RegexDialectError as again:
            if not any(w in str(again) for w in ("exceed", "nest")):
                raise
    raise exc


def _without_symbol(fsm: Any, symbol: Any) -> Any:
    """``fsm`` with no edge on ``symbol`` (a sub-automaton: a subset of its strings)."""
    from interegular.fsm import FSM

    rows = {p: {sym: q for sym, q in row.items() if sym != symbol} for p, row in fsm.map.items()}
    return FSM(alphabet=fsm.alphabet, states=fsm.states, initial=fsm.initial, finals=fsm.finals, map=rows)


def _boundaries_inside(core: str) -> bool:
    """Whether ``core``'s assertions are all ``\\b`` / ``\\B`` and it starts and ends with a
    character it always consumes (one not quantified to be optional): every boundary then has
    a character of the match on each side (``cron\\((\\b[0-5]?[0-9]\\b) ...\\)``)."""
    items = _items(core)
    if len(items) < 2 or any(k == "group" and core.startswith(_LOOK, a) or k == "alt" for k, a, _ in items):
        return False
    if any(k == "atom" and core[a:b] in ("^", "$", "\\A", "\\Z") for k, a, b in items):
        return False
    first, last = core[items[0][1]:items[0][2]], core[items[-1][1]:items[-1][2]]
    after_first = core[items[1][1]:items[1][1] + 2]
    return (items[0][0] == "atom" and first not in _ZERO_WIDTH_ATOMS and not after_first.startswith(("?", "*", "{0"))
            and items[-1][0] == "atom" and last not in _ZERO_WIDTH_ATOMS and last[0] not in "*+?{")


_ZERO_WIDTH_ATOMS = ("^", "$", "\\b", "\\B", "\\A", "\\Z")
_MAX_BRANCHES = 64
_QUANTIFIER = re.compile(r"(?:([*+?])|\{(\d+)(?:(,)(\d*))?\})(\?)?")


def _python_anchors(text: str) -> str:
    """``\\A`` and ``\\Z`` (outside classes) as ``^`` and ``$``: Python's ``re`` and the
    ``regex`` module, which validators read patterns with, take them for the string's start and
    end (ECMA-262 has no such escapes: its Annex B reads the letters 'A' and 'Z'). The outputs
    hold no raw newline, so ``$`` (which also matches before a final newline) means ``\\Z``."""
    out, i = [], 0
    for kind, a, b in _items(text):
        if kind == "atom" and text[a:b] in ("\\A", "\\Z"):
            out.append(text[i:a] + ("^" if text[a:b] == "\\A" else "$"))
            i = b
        elif kind == "group" and "\\" in text[a:b]:
            head = _group_head(text, a)
            out.append(text[i:a] + text[a:head] + _python_anchors(text[head:b - 1]) + ")")
            i = b
    out.append(text[i:])
    return "".join(out)


def _group_head(text: str, a: int) -> int:
    """Where the inside of the group opening at ``a`` starts."""
    for opener in ("(?<=", "(?<!", "(?=", "(?!", "(?:"):
        if text.startswith(opener, a):
            return a + len(opener)
    return a + 1


def _zero_width(text: str, top: bool = False) -> bool:
    """Whether ``text`` holds an assertion (lookaround, anchor, word boundary); with ``top``,
    at its top level only."""
    for kind, a, b in _items(text):
        if kind == "group" and text.startswith(_LOOK, a) or kind == "atom" and text[a:b] in _ZERO_WIDTH_ATOMS:
            return True
        if kind == "group" and not top and _zero_width(text[_group_head(text, a):b - 1]):
            return True
    return False


def _distributed(core: str) -> list[str]:
    """``core`` as branches whose assertions all stand at their top level: a group holding one
    is replaced by each of its alternatives (``a(?:^|x)b`` is ``a^b`` or ``axb``: exact), once
    for ``?`` / ``{0,n}`` both with and without it (exact), and repeated ``*`` / ``+`` /
    ``{m,n}`` its fewest times, ``*`` and ``{0,n}`` also once (a subset: fewer repetitions)."""
    todo, out = [core], []
    while todo:
        text = todo.pop()
        items = _items(text)
        for idx, (kind, a, b) in enumerate(items):
            if kind != "group" or text.startswith(_LOOK, a) or not _zero_width(text[_group_head(text, a):b - 1]):
                continue
            if text.startswith("(?", a) and not text.startswith("(?:", a):
                raise RegexDialectError(f"regex: group syntax '{text[a:a + 3]}' holding an assertion is not supported")
            q = _QUANTIFIER.match(text, b)
            if q is None:
                counts, end = [1], b
            else:
                end = q.end()
                if q.group(1):
                    counts = {"?": [0, 1], "*": [0, 1], "+": [1]}[q.group(1)]
                else:
                    least = int(q.group(2))
                    counts = [0, 1] if least == 0 and (q.group(3) is None or q.group(4) != "0") else [least]
                    if least > 4:
                        raise RegexDialectError(f"regex: a group holding an assertion repeated {least} times")
            alternatives = _split_alternatives(text[_group_head(text, a):b - 1])
            for count in counts:
                fills = [""]
                for _ in range(count):
                    fills = [f + alt for f in fills for alt in alternatives]
                    if len(fills) > _MAX_BRANCHES:
                        raise RegexDialectError(f"pattern: its assertions inside groups make more than "
                                                f"{_MAX_BRANCHES} branches")
                todo += [text[:a] + fill + text[end:] for fill in fills]
            break
        else:
            out.append(text)
        if len(out) + len(todo) > _MAX_BRANCHES:
            raise RegexDialectError(f"pattern: its assertions inside groups make more than {_MAX_BRANCHES} branches")
    return out


_MAX_NESTING = 48  # groups inside groups: interegular's recursive parser stops near 150


def _written(fsm: Any, limit: int = 20_000) -> str | None:
    """``fsm`` as a regex of the dialect (of at most ``limit`` characters); None when it accepts
    nothing. One that nests groups too deeply for the parsers that read it next is refused."""
    try:
        out = fsm_to_regex(fsm, limit)
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


@fsm_crawl.memo(maxsize=256)
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
    """The strings one branch matches (padding included where it is not anchored), its
    zero-width assertions decided by automata (exact, but where the readings below narrow).

    The core is cut at its assertions into text segments T0 .. Tk; the strings are the
    concatenations t0 .. tk (ti in Ti) such that at each cut the assertion there holds:

    - a lookahead ``(?=y)`` / ``(?!y)``: the rest of the string starts (does not start) with a
      match of ``y`` (followed by anything, unless the match ends at ``$``);
    - a lookbehind ``(?<=y)`` / ``(?<!y)``: the string so far ends (does not end) with a match
      of ``y`` (exact: the prefix, padding included, is known there);
    - ``^`` / ``\\A``: nothing is written before the cut; ``$`` / ``\\Z``: nothing after it
      (``\\A`` and ``\\Z`` read as Python's ``re`` reads them, jsonschema's validator);
    - ``\\b``: a word character before the cut and a non-word one (or the end) after it, or a
      non-word one (or the start) before and a word one after; ``\\B`` the other two cases.
      Word characters are read as ``[A-Za-z0-9_]`` and non-word ones as the printable ASCII
      others (a subset: both ECMA's ASCII ``\\w`` and Python's Unicode one agree on these).

    A positive lookaround's ``y`` is read as a subset (``_positive``), a negative one's wide
    (``_wide``: a superset of both readings). The automaton is a subset construction over
    (segment, its state, every lookbehind's state from the string's start, every started
    lookahead's state), with one bit for "nothing written yet"."""
    items = _items(core)
    segments: list[str] = []
    cuts: list[list[list[tuple]]] = []  # per cut: disjuncts, each a conjunction of assertions
    machines: list[Any] = []  # lookbehind and lookahead automata, indexed by the assertions
    behind: list[int] = []  # machine indexes of the lookbehinds, run from the string's start
    ahead = 0  # lookahead occurrences (each has a slot in the meta-state)
    pad = SAFE_RAW_CHAR + "*"
    anything = _ANYTHING  # (in the assertions' automata: the segments write only raw JSON characters)

    def machine(fsm: Any) -> int:
        machines.append(_minimal(fsm))
        return len(machines) - 1

    def lookbehind(fsm: Any) -> tuple:
        m = machine(fsm)
        behind.append(m)
        return ("behind", len(behind) - 1, m)

    def lookahead(any_fsm: Any, start_fsm: Any) -> tuple:
        nonlocal ahead
        ahead += 1
        return ("ahead", ahead - 1, machine(any_fsm), machine(start_fsm))

    word, other = "[A-Za-z0-9_]", "[" + "".join(class_literal(c) for c in _PRINTABLE if not re.match(r"\w", c)) + "]"
    plain_from = 0
    for idx, (kind, a, b) in enumerate(items):
        piece = core[a:b]
        if kind == "group" and core.startswith(_LOOK, a):
            opener = core[a:a + (4 if core.startswith(("(?<=", "(?<!"), a) else 3)]
            inside = core[a + len(opener):b - 1]
            positive = opener in ("(?=", "(?<=")
            if opener.startswith("(?<"):
                conj = [(*lookbehind(_lookbehind_fsm(inside, not positive)), positive)]
            else:
                conj = [(*lookahead(_lookahead_fsm(inside, not positive, False),
                                    _lookahead_fsm(inside, not positive, True)), positive)]
        elif kind == "atom" and (piece in ("^", "\\A")):
            conj = [("start",)]
        elif kind == "atom" and (piece in ("$", "\\Z")):
            conj = [(*lookahead(_fsm(""), _fsm("")), True)]
        elif kind == "atom" and piece in ("\\b", "\\B"):
            # before the cut: the string so far ends with a word character, or is empty or ends
            # with a non-word one (read from the string's start: "empty" is the start only)
            w_before = lookbehind(_fsm(anything) + _fsm(word))
            n_before = lookbehind(_fsm("") | _fsm(anything) + _fsm(other))
            w_after = lookahead(_fsm(word + anything), _fsm(word + anything))
            n_after = lookahead(_fsm("(?:" + other + anything + ")?"), _fsm("(?:" + other + anything + ")?"))
            if piece == "\\b":
                cuts_here = [[(*w_before, True), (*n_after, True)], [(*n_before, True), (*w_after, True)]]
            else:
                cuts_here = [[(*w_before, True), (*w_after, True)], [(*n_before, True), (*n_after, True)]]
            segments.append(core[plain_from:a])
            cuts.append(cuts_here)
            plain_from = b
            continue
        else:
            continue
        segments.append(core[plain_from:a])
        cuts.append([conj])
        plain_from = b
        if idx + 1 < len(items) and items[idx + 1][0] == "atom" and core[items[idx + 1][1]] in "*+?{":
            raise RegexDialectError(f"regex: a quantifier after the assertion at offset {a} is not supported")
    segments.append(core[plain_from:])
    # (each segment of raw JSON string characters only: a subset, as the body is written)
    fsms = [_minimal(_fsm(_positive(t, most)) & _fsm(pad)) if t else _fsm("") for t in segments]
    if not start:
        fsms[0] = _fsm(pad) + fsms[0]
    if not end:
        fsms[-1] = fsms[-1] + _fsm(pad)
    return _assertion_product(fsms, cuts, machines, behind, ahead)


# (state, symbol) pairs _minimal has refined its partitions against in this process (each
# splitter's states times the symbols): n k log n a merge, where Moore's rounds were n^2 k on a
# counted chain. For debugging and tests; a count, not a bound on anything.
minimal_work = 0


def _minimal(fsm: Any) -> Any:
    """``fsm`` with equivalent states merged (the same strings): fewer states make a shorter
    regex, written sooner. Its live states are split by Hopcroft's partition refinement (n k
    log n for n states and k symbols; Moore's rounds, one per state of a counted chain, took
    seconds on a URL pattern's ``{1,256}``); a missing or dead transition goes to a sink. The
    merged states are numbered by where each first stands among the live states sorted by
    ``str``."""
    from interegular.fsm import FSM

    global minimal_work
    back: dict = {}
    for p, row in fsm.map.items():
        for q in row.values():
            back.setdefault(q, set()).add(p)
    live, todo = set(fsm.finals), list(fsm.finals)
    while todo:
        for p in back.get(todo.pop(), ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    if fsm.initial not in live:
        return fsm
    symbols = list(fsm.alphabet.by_transition)
    states = sorted(live, key=str)
    index = {q: i for i, q in enumerate(states)}
    sink = len(states)
    # per symbol: target -> the states going there on it (the sink goes to itself)
    sources: list[dict[int, list[int]]] = [{sink: [sink]} for _ in symbols]
    for i, q in enumerate(states):
        row = fsm.map.get(q, {})
        for k, sym in enumerate(symbols):
            sources[k].setdefault(index.get(row.get(sym), sink), []).append(i)
    finals = {i for i, q in enumerate(states) if q in fsm.finals}
    blocks = [b for b in (finals, set(range(sink + 1)) - finals) if b]
    block_of = [0] * (sink + 1)
    for b, members in enumerate(blocks):
        for i in members:
            block_of[i] = b
    waiting = [min(range(len(blocks)), key=lambda b: len(blocks[b]))]
    queued = set(waiting)
    while waiting:
        a = waiting.pop()
        queued.discard(a)
        splitter = list(blocks[a])  # as it stands now: splits below do not change it
        minimal_work += len(splitter) * len(sources)
        for into in sources:
            hit: dict[int, list[int]] = {}
            for t in splitter:
                for i in into.get(t, ()):
                    hit.setdefault(block_of[i], []).append(i)
            for b, members in hit.items():
                if len(members) == len(blocks[b]):
                    continue
                part = set(members)
                blocks[b] -= part
                blocks.append(part)
                new = len(blocks) - 1
                for i in part:
                    block_of[i] = new
                if b in queued:
                    queued.add(new)
                    waiting.append(new)
                else:
                    smaller = new if len(part) <= len(blocks[b]) else b
                    queued.add(smaller)
                    waiting.append(smaller)
    ids: dict[int, int] = {}
    block = {q: ids.setdefault(block_of[i], len(ids)) for i, q in enumerate(states)}
    fmap: dict = {}
    for q in states:
        row = fmap.setdefault(block[q], {})
        for sym, r in fsm.map.get(q, {}).items():
            if r in live:
                row[sym] = block[r]
    return FSM(alphabet=fsm.alphabet, states=set(block.values()), initial=block[fsm.initial],
               finals={block[q] for q in states if q in fsm.finals}, map=fmap)


def _universal(fsm: Any) -> set:
    """The states of ``fsm`` from which every string is accepted (none where its alphabet
    leaves some character without a transition)."""
    from interegular.fsm import anything_else

    if anything_else not in fsm.alphabet:
        return set()
    symbols = list(fsm.alphabet.by_transition)
    out = set(fsm.finals)
    changed = True
    while changed:
        changed = False
        for q in list(out):
            row = fsm.map.get(q, {})
            if any(row.get(sym) not in out for sym in symbols):
                out.discard(q)
                changed = True
    return out


_DEAD = -1
_ANYTHING = "(?:[^\\n]|\\n)*"  # every string
_WRITE_STATES = 400  # an automaton written back as a regex: past this, state elimination takes seconds
_PRODUCT_STATES = 3_000


def _assertion_product(fsms: list[Any], cuts: list[list[list[tuple]]], machines: list[Any],
                       behind: list[int], n_ahead: int) -> Any:
    """The automaton of ``_branch_fsm``: segments ``fsms`` joined at ``cuts``."""
    from interegular.fsm import FSM, Alphabet

    every = fsms + machines
    alphabet, new_to_old = Alphabet.union(*[f.alphabet for f in every])
    k = len(fsms) - 1
    spawned_by: dict[int, tuple[int, bool]] = {}  # lookahead slot -> (machine, positive)

    def step(f_index: int, state: Any, sym: Any) -> Any:
        if state == _DEAD:
            return _DEAD
        f = every[f_index]
        old = new_to_old[f_index][sym]
        row = f.map.get(state, {})
        return row[old] if old is not None and old in row else _DEAD

    def final(f_index: int, state: Any) -> bool:
        return state != _DEAD and state in every[f_index].finals

    def closure(t: tuple, at_start: bool, out: set) -> None:
        if t in out:
            return
        out.add(t)
        i, q, lbs, las = t
        if i == k or q not in fsms[i].finals:
            return
        for conj in cuts[i]:
            new_las = list(las)
            ok = True
            for a in conj:
                if a[0] == "start":
                    ok = ok and at_start
                elif a[0] == "behind":
                    _, slot, m, positive = a
                    ok = ok and final(len(fsms) + m, lbs[slot]) == positive
                else:
                    _, slot, m_any, m_start, positive = a
                    m = m_start if at_start else m_any
                    spawned_by[slot] = (m, positive)
                    new_las[slot] = (m, every[len(fsms) + m].initial)
                if not ok:
                    break
            if ok:
                closure((i + 1, fsms[i + 1].initial, lbs, tuple(new_las)), at_start, out)

    universal = [_universal(f) for f in every]

    def alive(t: tuple) -> bool:
        for slot, entry in enumerate(t[3]):
            if entry is not None and entry[1] == _DEAD and spawned_by[slot][1]:
                return False  # a positive lookahead that can no longer match
            if entry is not None and entry[1] in universal[len(fsms) + entry[0]] and not spawned_by[slot][1]:
                return False  # a negative one that matches whatever follows
        return True

    def settled(t: tuple) -> tuple:
        """``t`` with each lookahead decided for good dropped (as if never started): a
        negative one that can no longer match, a positive one that matches whatever follows."""
        las = t[3]
        if not any(e is not None and (e[1] == _DEAD or e[1] in universal[len(fsms) + e[0]]) for e in las):
            return t
        return (t[0], t[1], t[2], tuple(None if e is None or e[1] == _DEAD or e[1] in universal[len(fsms) + e[0]]
                                        else e for e in las))

    init: set = set()
    closure((0, fsms[0].initial, tuple(machines[m].initial for m in behind), (None,) * n_ahead), True, init)

    def follow(current: frozenset, sym: Any) -> frozenset:
        out: set = set()
        for i, q, lbs, las in current:
            nq = step(i, q, sym)
            if nq == _DEAD:
                continue
            nlbs = tuple(step(len(fsms) + m, s, sym) for m, s in zip(behind, lbs))
            nlas = tuple(None if e is None else (e[0], step(len(fsms) + e[0], e[1], sym)) for e in las)
            t = (i, nq, nlbs, nlas)
            if alive(t):
                closure(t, False, out)
        return frozenset(settled(t) for t in out if alive(t))

    def is_final(current: frozenset) -> bool:
        for i, q, lbs, las in current:
            if i == k and q in fsms[k].finals and all(
                    e is None or final(len(fsms) + e[0], e[1]) == spawned_by[slot][1] for slot, e in enumerate(las)):
                return True
        return False

    first = frozenset(settled(t) for t in init if alive(t))
    if not first:
        return _fsm("") - _fsm("")  # (no string)
    index = {first: 0}
    order = [first]
    finals, fmap = set(), {}
    symbols = list(alphabet.by_transition)
    while len(order) > len(fmap):
        n = len(fmap)
        current = order[n]
        if is_final(current):
            finals.add(n)
        row = fmap[n] = {}
        for sym in symbols:
            nxt = follow(current, sym)
            if not nxt:
                continue
            j = index.get(nxt)
            if j is None:
                if len(order) >= _PRODUCT_STATES:
                    raise RegexDialectError(f"pattern: its assertions' automaton would exceed {_PRODUCT_STATES} states")
                j = index[nxt] = len(order)
                order.append(nxt)
            row[sym] = j
    return FSM(alphabet=alphabet, states=range(len(order)), initial=0, finals=finals, map=fmap)


def _lookbehind_fsm(inside: str, wide: bool) -> Any:
    """The strings (from the string's start) that end with a match of ``inside`` (a
    lookbehind): each branch's match after anything, or, where the branch is anchored at
    '^' (``(?<=^v?|\\sv?)``), after nothing (exact: the whole prefix is known)."""
    out = None
    for s, e, core in _branches(inside, False, False):
        if e:
            raise RegexDialectError("regex: a '$' inside a lookbehind is not supported")
        if any(k == "group" and core.startswith(_LOOK, x) for k, x, _ in _items(core)):
            raise RegexDialectError("regex: a lookaround inside a lookaround is not supported")
        f = _fsm(_around(core, wide)) if core else _fsm("")
        f = f if s else _fsm(_ANYTHING) + f
        out = f if out is None else out | f
    return out if out is not None else _fsm("") - _fsm("")


def _lookahead_fsm(inside: str, wide: bool, first: bool) -> Any:
    """The strings that start with a match of ``inside`` (a lookahead at the start of the
    rest of the string): each branch's match, then anything unless it ends at '$'. A branch
    anchored at '^' is kept where the lookahead stands at the string's start (``first``),
    left out elsewhere (it cannot match there)."""
    out = None
    for s, e, core in _branches(inside, False, False):
        if s and not first:
            continue
        if any(core.startswith(look, a) for kind, a, _ in _items(core) if kind == "group" for look in _LOOK):
            raise RegexDialectError("regex: a lookaround inside a lookaround is not supported")
        f = _fsm(_around(core, wide)) if core else _fsm("")
        if not e:
            f = f + _fsm(_ANYTHING)
        out = f if out is None else out | f
    return out if out is not None else _fsm("") - _fsm("")


_QUANTIFIERS = re.compile(r"[*+]|\{(\d+)(?:(,)(\d*))?\}")
_AROUND_MOST = 4


def _around(core: str, wide: bool) -> str:
    """A lookaround's ``core`` read wide (``_wide``, a negative one) or as a subset
    (``_positive``). Where a repetition comes before a count of 8 or more (``(.{1,63}/)?.{1,63}``),
    the automaton tracks every place the count may have started, 2^count states: a positive
    one's counts are lowered to ``_AROUND_MOST`` (fewer strings: a subset), a negative one is
    refused (its reading may not shrink)."""
    if not _overlapping_counts(core):
        return _wide(core) if wide else _positive(core)
    if wide:
        raise RegexDialectError("pattern: a negative lookaround with a long count after a repetition "
                                "(its automaton is too large)")
    return _positive(core, _AROUND_MOST)


def _overlapping_counts(text: str) -> bool:
    """Whether ``text`` (outside classes) has a repetition followed by a count up to 8 or more."""
    seen = False
    for m in _QUANTIFIERS.finditer(re.sub(r"\\.|\[(?:\\.|[^\]\\])*\]", "c", text)):
        top = None if m.group(1) is None else int(m.group(3) or 0) if m.group(2) else int(m.group(1))
        if seen and top is not None and top >= 8 and (m.group(2) is None or m.group(3)):
            return True
        seen = True
    return False


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
    _refuse_surrogate_pairs(items, i)
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
    if negated:
        # a negated class's lone surrogates left out: no JSON text holds one, so over the
        # strings a body writes the class means the same (exact)
        ranges = _without_surrogates(ranges)
        if not ranges and not others:
            return j + 1, "[\\s\\S]"  # (it excluded nothing a body writes)
    else:
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


def _refuse_surrogate_pairs(items: list[tuple[str, Any]], offset: int) -> None:
    """Refuses a class that pairs a high surrogate with a low one (``[\\uD800\\uDC00-\\uDBFF\\uDFFF]``,
    AWS::Glue's "valid XML characters"): under ECMA's ``u`` flag the pairs are U+10000-U+10FFFF,
    in every other reading (ECMA without it, Python's ``re``, the ``regex`` module) a range out
    of order, so no validator here reads the pattern to check an output against it."""
    for (kind, value), (next_kind, next_value) in zip(items, items[1:]):
        if kind == next_kind == "cp" and 0xD800 <= value <= 0xDBFF and 0xDC00 <= next_value <= 0xDFFF:
            raise RegexDialectError(f"regex: the class at offset {offset} pairs surrogate escapes "
                                    f"(\\u{value:04X}\\u{next_value:04X}): a character past U+FFFF only under "
                                    "ECMA's u flag, a range out of order for Python's re and the regex module, "
                                    "which could not check an output")


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
    cores: dict[tuple[bool, bool], list[str]] = {}  # branches of the same anchors share their padding:
    for s, e, core in _branches(pattern, False, False):  # P(a|b)P, not PaP|PbP (a product of DFAs)
        cores.setdefault((s, e), []).append(_outer(core))
    parts = [("" if s else pad) + "(?:" + "|".join(group) + ")" + ("" if e else pad) for (s, e), group in cores.items()]
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
    from treadle.constrained.regex.regex_text import _property_test

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

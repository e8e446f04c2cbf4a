"""A user's whole-output ``regex`` with assertions (lookaheads, lookbehinds, ``\\b`` / ``\\B``)
written without them, exactly: the strings ``re.fullmatch`` takes, read in the dialect of
regex_text.py (``\\d \\w \\s`` ASCII, as everywhere in a ``regex``).

A JSON Schema ``pattern`` takes these too (regex_ecma.py), read as a subset where that is
simpler; a ``regex`` must mean what it says, so this module uses that file's automaton
construction (``_assertion_product``: segments between the assertions, lookbehinds run from
the string's start, lookaheads from where they stand) with exact readings only, and refuses
by name whatever it cannot read exactly:

- each segment, and each lookaround's inside, is read as the rest of the regex is
  (``_scan`` with the regex's flags): no narrowing to JSON's raw characters, no lowered counts;
- a group holding an assertion is written out per alternative (``_distributed``) where that is
  exact: unrepeated, ``?`` or a fixed count ``{n}`` (``((25[0-5]|...)\\.?\\b){4}``); under
  ``*``, ``+`` or ``{m,n}`` it is refused;
- ``\\b`` reads its neighbours as Python does, word characters Unicode-wide: the automaton is
  built twice, a non-ASCII neighbour once failing the boundary and once passing it; where the
  two differ (a non-ASCII character can stand next to it) it is refused, else either is exact
  (under the flag 'a', ASCII only, once);
- anchors inside (``a^``, ``$`` mid-pattern) stay refused, as without assertions;
- the automaton is capped (``_PRODUCT_STATES`` while built, ``MAX_STATES`` minimal) and written
  back as a regex of at most ``MAX_CHARS`` (the password rule ``^(?=.*[A-Z])(?=.*\\d)[A-Za-z\\d]{8,16}$``:
  60 states, 46k characters, which the lazy index builds in milliseconds).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from treadle.constrained.index.grammar_size import regex_size
from treadle.constrained.regex import fsm_crawl
from treadle.constrained.regex import regex_ecma as ecma
from treadle.constrained.regex.regex_text import RegexDialectError, _scan

MAX_STATES = 400
MAX_CRAWL_STATES = 20_000
MAX_STEPS = 5_000_000
MAX_PART_SIZE = 30_000  # grammar_size.regex_size of a segment or a lookaround's inside ('[a-z]{1,1000}': 26,000)
MAX_CHARS = 200_000

_WORD = "[A-Za-z0-9_]"
_ASCII_OTHER = "[\\x00-/:-@\\[-\\^`{-\\x7f]"
_NON_ASCII = "[^\\x00-\\x7f]"


def has_assertions(pattern: str) -> bool:
    """Whether ``pattern`` (a user's regex, its ends' anchors stripped) holds a lookaround or a
    word boundary outside classes: one linear scan (a pattern may nest 100,000 groups)."""
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if not in_class and pattern[i + 1:i + 2] in ("b", "B"):
                return True
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 2 if pattern.startswith("[^", i) else 1
            if pattern.startswith("]", i):  # ('[]]' / '[^]]': a literal ']' first)
                i += 1
            continue
        elif c == "(" and pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            return True
        i += 1
    return False


@lru_cache(maxsize=256)
def whole_regex(pattern: str, flags: str) -> str:
    """``pattern`` (top-level anchors stripped, flags read off) without its assertions, exactly;
    ``RegexDialectError`` naming what cannot be. Its automata are bounded in work, not time
    (fsm_crawl.limit: ``MAX_STEPS``, about 2 s of CPU; '(?=a)(?:a{1,30}|b{1,30}){1,30}' took
    interegular 27 s), so whether a regex is served never depends on the load."""
    try:
        with fsm_crawl.limit(states=MAX_CRAWL_STATES, steps=MAX_STEPS):
            return _whole_regex(pattern, flags)
    except fsm_crawl.TooLarge as exc:
        raise RegexDialectError(f"regex: the automaton of its assertions is too large to build ({exc}); "
                                "use fewer or smaller counted repetitions beside them") from None


def _whole_regex(pattern: str, flags: str) -> str:
    try:
        re.compile((f"(?{flags})" if flags else "") + pattern)
    except re.error as exc:
        raise RegexDialectError(f"regex: does not compile with Python re: {exc}") from exc
    except RecursionError as exc:  # (re's parser recurses per group)
        raise RegexDialectError("regex: its groups nest too deeply to parse") from exc
    pattern = ecma._unnamed(pattern)
    _check_exact_groups(pattern)
    narrow = _whole_fsm(pattern, flags, False)
    if "a" not in flags and ("\\b" in pattern or "\\B" in pattern):
        wide = _whole_fsm(pattern, flags, True)
        if not (wide - narrow).empty():
            which = " or ".join(f"'{w}'" for w in ("\\b", "\\B") if w in pattern)
            raise RegexDialectError(
                f"regex: a word boundary {which} can stand next to a character outside ASCII, whose word-ness "
                "Python reads Unicode-wide; write the characters around it, or set the flag '(?a)'")
    fsm = ecma._minimal(narrow)
    if not fsm.finals or fsm.empty():
        raise RegexDialectError("regex: its assertions (lookahead, lookbehind, word boundary) leave no string "
                                "that matches it (not supported: a constraint must allow some output)")
    if len(fsm.states) > MAX_STATES:
        raise RegexDialectError(f"regex: its assertions make an automaton of {len(fsm.states)} states, "
                                f"over the {MAX_STATES} that can be written as a regex")
    try:
        out = ecma._written(fsm, MAX_CHARS)
    except RegexDialectError as exc:
        raise RegexDialectError(f"regex: its assertions' automaton cannot be written as a regex "
                                f"({str(exc).removeprefix('pattern: ')})") from exc
    if out is None:
        raise RegexDialectError("regex: its assertions' automaton is too large to write as a regex "
                                f"(over {MAX_CHARS:,} characters)")
    return out


def _check_exact_groups(text: str) -> None:
    """Refuse a group holding an assertion under a quantifier ``_distributed`` reads as a subset
    (``*``, ``+``, ``{m,n}``), and an assertion quantified itself."""
    items = ecma._items(text)
    for idx, (kind, a, b) in enumerate(items):
        if kind != "group":
            continue
        look = text.startswith(ecma._LOOK, a)
        inner = text[ecma._group_head(text, a):b - 1]
        q = ecma._QUANTIFIER.match(text, b)
        if look:
            if q is not None:
                raise RegexDialectError(f"regex: a quantifier after the assertion at offset {a} is not supported")
            if has_assertions(inner):
                raise RegexDialectError(f"regex: an assertion inside the lookaround at offset {a} is not supported")
            continue
        if not has_assertions(inner):
            continue
        if q is not None and not (q.group(1) == "?" or q.group(2) and (q.group(3) is None and int(q.group(2)) > 0
                                                                       or q.group(2) == "0" and q.group(4) == "1")):
            raise RegexDialectError(
                f"regex: the group at offset {a} holds an assertion and is repeated '{q.group(0)}', which is not "
                "supported (only a group repeated a fixed number of times, {n}, or optional, '?', can hold one)")
        _check_exact_groups(inner)
    for kind, a, b in items:
        if kind == "atom" and text[a:b] in ("\\b", "\\B") and ecma._QUANTIFIER.match(text, b):
            raise RegexDialectError(f"regex: a quantifier after the assertion at offset {a} is not supported")


def _whole_fsm(pattern: str, flags: str, wide_boundaries: bool) -> Any:
    """The union of the automata of ``pattern``'s branches, each group holding an assertion
    written out (``_distributed``: exact, ``_check_exact_groups``)."""
    out = None
    for branch in ecma._split_alternatives(pattern):
        for flat in ecma._distributed(branch):
            f = _branch_fsm(flat, flags, wide_boundaries)
            if any(k == "atom" and flat[a:b] == "\\B" for k, a, b in ecma._items(flat)):
                f = f - ecma._fsm("")  # (Python's '\\B' holds nowhere in the empty string)
            out = f if out is None else out | f
    return out


def _branch_fsm(core: str, flags: str, wide_boundaries: bool) -> Any:
    """One branch, whole-string: its segments read as the regex is, cut at its assertions (the
    cuts as regex_ecma._branch_fsm writes them, with exact readings)."""
    items = ecma._items(core)
    segments: list[str] = []
    cuts: list[list[list[tuple]]] = []
    machines: list[Any] = []
    behind: list[int] = []
    ahead = 0
    anything = ecma._ANYTHING

    def read(text: str, wide: bool = False) -> Any:
        # wide: the inside of a negative lookaround, where \\d \\s \\w are read Unicode-wide as
        # Python reads them (their ASCII reading there would let non-ASCII digits, spaces and
        # letters through that Python's assertion refuses)
        if not text:
            return ecma._fsm("")
        translated = _scan(text, ecma=False, flags=flags, wide_shorthands=wide)
        size = regex_size(translated)  # (interegular's automaton: '(?:[a-z]{1,100}){1,100}' took 45 s)
        if size > MAX_PART_SIZE:
            raise RegexDialectError(f"regex: the part '{text[:40]}' beside its assertions is too large for their "
                                    f"automaton (size {size:,} over {MAX_PART_SIZE:,}: fewer or smaller counts)")
        return ecma._fsm(translated)

    def machine(fsm: Any) -> int:
        machines.append(ecma._minimal(fsm))
        return len(machines) - 1

    def lookbehind(fsm: Any) -> tuple:
        m = machine(fsm)
        behind.append(m)
        return ("behind", len(behind) - 1, m)

    def lookahead(fsm: Any) -> tuple:
        nonlocal ahead
        ahead += 1
        m = machine(fsm)
        return ("ahead", ahead - 1, m, m)

    ascii_only = "a" in flags
    word = _WORD if ascii_only or not wide_boundaries else f"(?:{_WORD}|{_NON_ASCII})"
    other = ("[^A-Za-z0-9_]" if ascii_only else _ASCII_OTHER if not wide_boundaries
             else f"(?:{_ASCII_OTHER}|{_NON_ASCII})")
    plain_from = 0
    for kind, a, b in items:
        piece = core[a:b]
        if kind == "group" and core.startswith(ecma._LOOK, a):
            opener = core[a:a + (4 if core.startswith(("(?<=", "(?<!"), a) else 3)]
            positive = opener in ("(?=", "(?<=")
            inner = core[a + len(opener):b - 1]
            if opener.startswith("(?<"):
                conj = [(*lookbehind(ecma._fsm(anything) + read(inner, not positive)), positive)]
            else:
                conj = [(*lookahead(_lookahead(inner, lambda t, wide=not positive: read(t, wide))), positive)]
            cuts_here = [conj]
        elif kind == "atom" and piece in ("\\b", "\\B"):
            w_before = lookbehind(ecma._fsm(anything + word))
            n_before = lookbehind(ecma._fsm("") | ecma._fsm(anything + other))
            w_after = lookahead(ecma._fsm(word + anything))
            n_after = lookahead(ecma._fsm("(?:" + other + anything + ")?"))
            if piece == "\\b":
                cuts_here = [[(*w_before, True), (*n_after, True)], [(*n_before, True), (*w_after, True)]]
            else:
                cuts_here = [[(*w_before, True), (*w_after, True)], [(*n_before, True), (*n_after, True)]]
        else:
            continue
        segments.append(core[plain_from:a])
        cuts.append(cuts_here)
        plain_from = b
    segments.append(core[plain_from:])
    fsms = [ecma._minimal(read(t)) if t else ecma._fsm("") for t in segments]
    try:
        return ecma._assertion_product(fsms, cuts, machines, behind, ahead)
    except RegexDialectError as exc:
        raise RegexDialectError(f"regex: {str(exc).removeprefix('pattern: ')}") from exc


def _lookahead(inside: str, read: Any) -> Any:
    """The rests of the string a lookahead ``(?=inside)`` holds at: a match of a branch of
    ``inside``, then anything, or, where the branch ends in ``$`` (``(?=.{8,16}$)``), nothing
    or a last newline (Python's ``$`` also holds before a final one)."""
    out = None
    for start, end, core in ecma._branches(inside, False, False):
        if start:
            raise RegexDialectError("regex: a '^' inside a lookahead is not supported")
        f = read(core) + ecma._fsm("(?:\\n)?" if end else ecma._ANYTHING)
        out = f if out is None else out | f
    return out

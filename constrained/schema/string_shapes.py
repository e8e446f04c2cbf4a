"""Strings of a pattern or a format fitted to minLength / maxLength: the string stage of the
JSON-schema translation (json_schema.py's ``_Converter`` calls these where a string schema
holds a ``pattern`` or a ``format`` beside length bounds, or both).

A pattern body (regex_ecma's reading of an ECMA ``pattern``) or a format's regex
(regex_text.FORMATS) has strings of many lengths; the schema allows only ``lo..hi``
characters. The exact answer, the product of the body's automaton with the lengths', is often
too large to build or its regex too long to write, so each helper here finds a *subset* that
fits instead (every string it writes has a length in range and matches the pattern / format):
raising or bounding repetitions (``_reshaped_to_lengths``, ``_one_repetition_to_length``,
``_capped_to_length``), counting the free padding of an unanchored pattern
(``_padded_to_lengths``), narrowing classes and counts until an automaton builds
(``_narrowed_bodies``, ``_bounded_subset_body``), or a format's narrower subsets
(``_format_with_length``, ``_short_format``, ``_web_urls_matching``, ``_format_branches_inside``).
Every automaton is built under ``fsm_crawl.limit`` budgets of work (the ``_*_STATES`` /
``_*_STEPS`` constants), so a hostile pattern gets a smaller subset or a refusal, never a hang.

Importing this module does not import json_schema.py (which re-exports these names).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

try:  # Python's parse of a regex (3.11+), sre_parse before
    import re._parser as _sre_parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parser  # type: ignore[no-redef]

import interegular

from treadle.constrained.regex import fsm_crawl
from treadle.constrained.regex import regex_text as text
from treadle.constrained.regex.fsm_regex import fsm_to_regex, length_range
from treadle.constrained.regex.regex_ecma import pattern_subset_body
from treadle.constrained.schema.json_schema_parts import NoOutput, Unsatisfiable, UnsupportedSchemaError


# anchors, word boundaries and lookarounds: what may keep an empty match from every position
# (and '{,', which Python reads as a count and ECMA as characters)
_ASSERTIONS = re.compile(r"[\^$]|\\[bBAZzG]|\(\?[=!<]|\{,")


def _found_in_every_string(pattern: str) -> bool:
    """Whether a search finds ``pattern`` in every string: it matches the empty string and
    asserts nothing about where (RDS::DBProxyEndpoint's ``(\\w|\\d|\\s|\\\\|-|\\.:=+-)*``). With
    no anchor, boundary or lookaround, the way it matches "" consumes nothing and looks at
    nothing, so it matches at the start of any string (ECMA and Python alike)."""
    if _ASSERTIONS.search(pattern):
        return False
    try:
        return re.compile(pattern).fullmatch("") is not None
    except (re.error, RecursionError, OverflowError):
        return False


def _top_branches(body: str) -> list[str]:
    """The branches of ``body`` where it is one group ``(?:A|B|...)`` with a top-level ``|``
    inside (as regex_ecma writes a pattern of anchored branches), else []."""
    inner = body[3:-1] if body.startswith("(?:") and body.endswith(")") else ""
    cuts = text.top_level_cuts(inner) if inner else None
    if not cuts:  # (None too: the first group ends before the body does)
        return []
    edges = [-1, *cuts, len(inner)]
    return [inner[a + 1:b] for a, b in zip(edges, edges[1:])]


def _length_top(lo: int, hi: int | None) -> int:
    """The most characters a string of ``lo..hi`` is written with: ``hi``, cut at MAX_REPEAT,
    or at MAX_REPEAT past ``lo`` where ``lo`` is above it (as ``text.string_regex``: fewer
    characters, still valid)."""
    top = text.MAX_REPEAT if lo <= text.MAX_REPEAT else lo + text.MAX_REPEAT
    return top if hi is None else min(hi, top)


def _small_fsm(build: Any) -> Any:
    """``build()``, an automaton, or None where it passes ``_LENGTH_STATES`` states (or its
    build, under ``fsm_crawl.limit``, stops)."""
    try:
        with fsm_crawl.limit(states=_PATTERN_STATES):
            fsm = build()
    except fsm_crawl.TooLarge:
        return None
    return fsm if len(fsm.states) <= _LENGTH_STATES else None


def _builds(regex: str) -> bool:
    """Whether ``regex``'s automaton builds within ``_PATTERN_STATES`` states a crawl and
    ``_NARROW_STEPS`` steps of work."""
    try:
        with fsm_crawl.limit(states=_PATTERN_STATES, steps=_NARROW_STEPS):
            interegular.parse_pattern(regex).to_fsm()
    except fsm_crawl.TooLarge:
        return False
    return True


def _narrowed_bodies(body: str) -> Any:
    """Subsets of the pattern body ``body`` whose automata build (``_builds``), most strings
    first, its free padding kept: its core with each class cut to its printable ASCII
    (``_ascii_classes``; interegular lists a wide range character by character), then that
    with every repetition bounded to at most ``most`` rounds (``text.reshaped_repetitions``:
    ``+`` is ``{1,most}``, ``{3,1016}`` is ``{3,most}``), ``most`` the powers of 2 up to 64,
    tried upwards until one does not build."""
    pad = text.SAFE_RAW_CHAR + "*"
    left, right = body.startswith(pad), body.endswith(pad)
    core = _ascii_classes(body[len(pad) if left else 0:len(body) - (len(pad) if right else 0)])
    whole = (pad if left else "") + core + (pad if right else "")
    if whole != body and _builds(whole):
        yield whole
        return
    built = []
    for most in (1, 2, 4, 8, 16, 32, 64):
        cand = (pad if left else "") + text.reshaped_repetitions(core, 0, most) + (pad if right else "")
        if cand == whole or not _builds(cand):
            break
        built.append(cand)
    yield from reversed(built)


# an escape, or a class of the dialect (a ']' first in it is a member)
_ESCAPE_OR_CLASS = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]", re.S)


def _ascii_classes(body: str) -> str:
    """``body`` with every class cut to the printable ASCII characters it has that JSON
    writes raw (a subset of its strings); unchanged where a class has none."""
    def cut(m: re.Match) -> str:
        if m.group(0).startswith("\\"):
            return m.group(0)
        return text._ascii_class(m.group(0), m.start())

    try:
        return _ESCAPE_OR_CLASS.sub(cut, body)
    except text.RegexDialectError:
        return body


def _bounded_subset_body(pattern: str) -> str:
    """``pattern_subset_body(pattern)``, under ``fsm_crawl.limit``; where its automata are too
    large (``^https://[A-Za-z0-9]((.|-+)?[A-Za-z0-9]){0,252}/...$``, DataSync's Azure blob
    URLs), that of the pattern with its counted repetitions ``{m,n}`` lowered to at most 64,
    16, 4 or 1 (``_narrowed_counts``); where none builds, the pattern's, unbounded."""
    for cand in itertools.chain([pattern], (_narrowed_counts(pattern, most) for most in (64, 16, 4, 1))):
        if cand is None:
            continue
        try:
            with fsm_crawl.limit(states=_PATTERN_STATES, steps=_LENGTH_STEPS):
                return pattern_subset_body(cand)
        except fsm_crawl.TooLarge:
            continue
    return pattern_subset_body(pattern)  # (no narrower pattern: the whole, unbounded, as before)


# what makes lowering a pattern's counts no subset (a count inside a negative lookaround or
# a group's name), or its counts hard to find (ECMA's \u{...}, [] and [^], backreferences)
_NOT_NARROWED = re.compile(r"\(\?(?!:)|\\u\{|\[\^?\]|\\[1-9k]")


def _narrowed_counts(pattern: str, most: int) -> str | None:
    """``pattern`` (ECMA source) with each counted repetition ``{m,n}`` at most ``max(m, most)``
    rounds, or None where that changes nothing or the pattern has a lookaround, a named or
    flagged group, a backreference or ECMA's ``\\u{...}``. Fewer rounds of a part match fewer
    strings and the rest of a regex is monotone in its parts, so every string a search finds
    the result in, it finds the pattern in (ECMA and Python alike)."""
    if _NOT_NARROWED.search(pattern):
        return None
    out = text.reshaped_repetitions(pattern, 0, most, loops=False)
    return None if out == pattern else out


def _padded_to_lengths(body: str, lo: int, hi: int | None) -> str | None:
    """A subset of the pattern body ``body``, open on one side or both (free characters
    before or after the pattern's core: ``.*\\S.*``, ``^arn:.*``), whose strings all have
    ``lo..hi`` characters, or None: the core with its unbounded repetitions bounded (taken
    once, or up to 2, 4 ... 64 times while its automaton stays small) and a counted run of
    free characters on one open side that makes up the length. A string holding a match of
    the core matches the pattern (ECMA and Python search alike), and the core's strings and
    the run's lengths add up to ``lo..hi`` (SecurityHub's ``.*\\S.*`` under 20..2048 is one
    non-space character and 19..2047 free ones). The run is counted, so the automaton stays
    the core's (the product with the lengths' automaton writes no regex short enough)."""
    pad = text.SAFE_RAW_CHAR + "*"
    left, right = body.startswith(pad), body.endswith(pad)
    if not (left or right) or hi is None and lo == 0:
        return None
    core = body[len(pad) if left else 0:len(body) - (len(pad) if right else 0)]
    top = _length_top(lo, hi)
    best = None
    for cap_counted in (False, True):  # counted ranges ({1,1011}) kept first, lowered where they must
        for most in (0, 1, 2, 4, 8, 16, 32, 64):
            bounded = text.reshaped_repetitions(core, 0, most, cap_counted=cap_counted) if core else ""
            fsm = _small_fsm(interegular.parse_pattern(bounded).to_fsm)
            if fsm is None:
                break
            span = length_range(fsm)
            if span is None or span[1] is None:
                continue
            shortest, longest = span
            free_lo, free_hi = max(0, lo - shortest), top - longest
            if free_hi < free_lo:
                break
            best = (bounded, free_lo, free_hi)
        if best is not None:
            break
    if best is None:
        return None
    bounded, free_lo, free_hi = best
    free = text.SAFE_RAW_CHAR + (f"{{{free_lo}}}" if free_lo == free_hi else f"{{{free_lo},{free_hi}}}")
    return f"(?:{bounded}){free}" if right else f"{free}(?:{bounded})"


def _reshaped_to_lengths(body: str, lo: int, hi: int | None) -> str | None:
    """A subset of the pattern body ``body`` whose strings all have ``lo..hi`` characters,
    found by reshaping its repetitions (``text.reshaped_repetitions``), or None.

    An unanchored pattern is first anchored at both ends (its padding dropped): a string the
    pattern's core matches whole contains a match, so that is a subset too, and one whose
    lengths the repetitions decide. Then the least number of repetitions is raised until
    the shortest string has ``lo`` characters, and the most lowered (the largest of
    1, 2, 4 ... 64 that fits) until the longest has at most ``hi``. Cheaper than the product
    with the lengths' automaton, whose regex is often too long to write (CloudFormation's
    ``[\\w+=,.@-]+`` under maxLength 128)."""
    pad = text.SAFE_RAW_CHAR + "*"
    core = body.removeprefix(pad).removesuffix(pad)
    # (the padded body is not reshaped: its padding and core overlap, and bounded copies of
    # both make an automaton of thousands of states)
    start = fsm_crawl.spent()  # (a translation runs under a limit, which counts the work)
    # the core, then (where it cannot fit) the core less its optional parts: HealthImaging's
    # ARN, whose '(/imageset/[0-9a-z]{32})?' alone passes maxLength 127
    dropped = text.reshaped_repetitions(core, 0, None, optional=False)
    for cand in dict.fromkeys([core, dropped] if core else []):
        fsm = interegular.parse_pattern(cand).to_fsm()
        shortest, longest = length_range(fsm) or (0, 0)
        least = 0
        for step in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            if shortest >= lo:
                break
            least = step
            raised = _small_fsm(interegular.parse_pattern(text.reshaped_repetitions(cand, least, None)).to_fsm)
            if raised is None:
                break
            shortest, longest = length_range(raised) or (0, 0)
        if shortest < lo:
            continue
        if hi is None or longest is not None and longest <= hi:
            return text.reshaped_repetitions(cand, least, None) if least else cand
        best = None
        # counted ranges ({17,40}) kept first, lowered too only where that cannot fit
        for most, cap_counted in itertools.product((1, 2, 4, 8, 16, 32, 64, 128, 256), (False, True)):
            if most < least or best is not None and cap_counted:
                continue
            bounded = text.reshaped_repetitions(cand, least, most, cap_counted=cap_counted)
            b_fsm = _small_fsm(interegular.parse_pattern(bounded).to_fsm)
            b_range = None if b_fsm is None else length_range(b_fsm)
            if b_range is None or b_range[1] is None or b_range[1] > hi:
                if cap_counted or best is not None:
                    break
                continue
            if b_range[0] >= lo:
                best = bounded
            if fsm_crawl.spent() - start > _RESHAPE_STEPS:  # overlapping repetitions: each step costs more
                break
        if best is not None:
            return best
    return None


# URI formats whose strings are written as _URI (a scheme, "://", ...), and the schemes tried
# whole where a pattern fixes the scheme (_format_and_pattern)
_URI_FORMATS = frozenset({"uri", "iri", "uri-reference", "iri-reference"})
_LENGTH_STATES = 400  # a pattern's automaton under a length range: beyond this, fewer lengths
_PATTERN_STATES = 5000  # one crawl of a pattern's automaton under lengths: past this, its repetitions bounded
_LENGTH_STEPS = 4_000_000  # ... and the work of all its crawls past this (about 1.5 s)
# (Budgets of work, fsm_crawl's steps, not seconds: a pattern's verdict must not depend on the
# machine's load, and a refusal is cached. Each is about the time it stood for before on a quiet
# 2-core box, where a crawl does about 2.5 million steps a second of CPU.)
_NARROW_STEPS = 1_250_000  # a narrowed body's automaton: past this much work (about 0.5 s), it is not taken
_RESHAPE_STEPS = 2_500_000  # the repetitions' bounds tried after this much work (about 1 s): no larger ones
_LENGTH_PRODUCT = 3000  # ... and a product of its states and lengths past this is not built
_FORMAT_INTERSECT_STATES = 100  # date, time, date-time, duration, ipv4, ipv6, uuid


def _format_with_length(fmt: str, lo: int, hi: int | None, path: str) -> str:
    """A format's regex under minLength / maxLength (Pydantic's AnyUrl: format uri, minLength 1;
    HttpUrl adds maxLength 2083). A format writes ASCII only, a code point a character, so the
    bounds are plain lengths: bounds all its strings meet are dropped, others intersect its FSM
    with the length range. A format with a plainer subset (text.PLAIN_FORMATS: regexes of literal
    text) writes that one where its own cannot be fitted to the lengths."""
    try:
        return _fitted_format(fmt, text.FORMATS[fmt], lo, hi, path)
    except NoOutput:
        raise
    except UnsupportedSchemaError:
        if fmt not in text.PLAIN_FORMATS:
            raise
        return _fitted_format(fmt, text.PLAIN_FORMATS[fmt], lo, hi, path)


def _fitted_format(fmt: str, rx: str, lo: int, hi: int | None, path: str) -> str:
    """``_format_with_length`` for the format's subset ``rx``."""
    fsm = interegular.parse_pattern(rx).to_fsm()
    shortest, longest = length_range(fsm)
    if longest is None and hi is not None and fmt in text.BOUNDED_FORMATS:
        rx = text.BOUNDED_FORMATS[fmt]  # (a subset: narrower, and its lengths end)
        fsm = interegular.parse_pattern(rx).to_fsm()
        shortest, longest = length_range(fsm)
    if lo <= shortest and (hi is None or longest is not None and hi >= longest):
        return rx
    if hi is not None and hi < shortest or longest is not None and lo > longest:
        least, most = text.FORMAT_LENGTHS.get(fmt, (0, None))
        if hi is not None and hi < least or most is not None and lo > most:
            raise Unsatisfiable(f"json_schema: keyword 'format' at {path}: {fmt!r} strings have {least} to "
                                f"{'any number of' if most is None else most} characters, outside "
                                f"minLength/maxLength {lo}..{hi}")
        if fmt not in text.SHORT_FORMATS or hi is None or hi >= shortest:
            raise UnsupportedSchemaError(
                f"json_schema: keyword 'format' at {path} together with minLength/maxLength {lo}..{hi} is not "
                f"supported: the {fmt!r} strings written (a subset of the format) have {shortest} to {longest} "
                "characters")
        return _short_format(fmt, lo, hi, path)
    capped = _capped_to_length(rx, lo, hi) if len(fsm.states) > _FORMAT_INTERSECT_STATES else None
    if capped is not None:
        return capped
    # uri, email, hostname: the product is too slow to write; Pydantic's base64 is a chain of quads
    # whose product with lengths stays linear (Base64Bytes under maxLength 6: 0 or 4 characters)
    if len(fsm.states) > _FORMAT_INTERSECT_STATES and fmt not in text.PYDANTIC_FORMATS:
        raise UnsupportedSchemaError(f"json_schema: keyword 'format' at {path}: {fmt!r} with minLength/maxLength "
                                     f"{lo}..{hi} is not supported: its strings have {shortest} to {longest} "
                                     "characters, and only bounds that cut none of them off are")
    # a bound every string of the format meets says nothing (a smaller product to write)
    length = _lengths_fsm(0 if lo <= shortest else lo, None if longest is not None and hi is not None and
                          hi >= longest else hi)
    try:
        out = fsm_to_regex(fsm & length)
    except ValueError:  # the intersection's regex is too long: a subset that fits, if any
        fitted = _one_repetition_to_length(rx, lo, hi) or _capped_to_length(rx, lo, hi)
        if fitted is None:
            raise UnsupportedSchemaError(
                f"json_schema: keyword 'format' at {path} together with minLength/maxLength {lo}..{hi} is not "
                f"supported: {fmt!r} strings have {shortest} to {longest} characters, its strings within the "
                "lengths are too many ways apart to write as one regex, and no repetition of it raised or bounded "
                "fits them") from None
        return fitted
    if out is None:  # none of the subset's strings: the format's own may still have these lengths
        raise UnsupportedSchemaError(f"json_schema: keyword 'format' at {path} together with minLength/maxLength "
                                     f"{lo}..{hi} is not supported: no {fmt!r} string written (a subset of the "
                                     "format) has those lengths")
    return out


def _short_format(fmt: str, lo: int, hi: int, path: str) -> str:
    """A format's strings under a maxLength below every string of its usual subset (ipv6 under
    maxLength 10: "::1", "fe80::1"): the first of its wider subsets (text.SHORT_FORMATS) whose
    strings within ``lo..hi`` are some and can be written as one regex."""
    length = _lengths_fsm(lo, hi)
    for rx in text.SHORT_FORMATS[fmt]:
        fsm = interegular.parse_pattern(rx).to_fsm()
        shortest, longest = length_range(fsm)
        if lo <= shortest and longest is not None and longest <= hi:
            return rx
        try:
            out = fsm_to_regex(fsm & length)
        except ValueError:  # too many ways to spell these lengths: a narrower subset
            continue
        if out is not None:
            return out
    raise UnsupportedSchemaError(f"json_schema: keyword 'format' at {path} together with minLength/maxLength "
                                 f"{lo}..{hi} is not supported: no {fmt!r} string written (a subset of the "
                                 "format) has those lengths")


# http(s) URLs of plain host names and path segments: a subset of every URI format's strings
# (test_json_schema_lengths checks it), whose product with a pattern stays short to write
_WEB_URLS = r"https?://[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?(?:/[a-zA-Z0-9._~-]*)*"


def _lengths_fsm(lo: int, hi: int | None) -> Any:
    """The automaton of the ASCII strings of ``lo..hi`` characters (the formats' alphabet)."""
    return interegular.parse_pattern(f"[\\x00-\\x7f]{{{lo},{'' if hi is None else hi}}}").to_fsm()


def _web_urls_matching(fmt: str, pattern_fsm: Any) -> str | None:
    """For a URI format whose product with the pattern is too long to write (gitlab-ci's
    ``remote``: uri-reference under ``^https?://.+\\.ya?ml$``), the plain http(s) URLs the
    pattern matches, or None where that is empty or still too long."""
    if fmt not in _URI_FORMATS:
        return None
    fsm = interegular.parse_pattern(_WEB_URLS).to_fsm() & pattern_fsm
    try:
        return fsm_to_regex(fsm)
    except ValueError:
        return None


def _format_branches_inside(fmt: str, pattern_fsm: Any) -> str | None:
    """The branches of the format's regex (``_top_branches``) whose strings all match the
    pattern, each whole or else with its optional parts left out, as one alternation (a
    subset of both), or None where none is: the meta-schemas' ``$id``, a uri-reference under
    ``^[^#]*#?$``, is its absolute URIs and paths less their query and fragment."""
    rx = text.FORMATS[fmt]
    kept = []
    for branch in _top_branches(rx) or [rx]:
        for cand in dict.fromkeys([branch, text.reshaped_repetitions(branch, 0, None, optional=False)]):
            fsm = interegular.parse_pattern(cand).to_fsm()
            if not fsm.empty() and (fsm - pattern_fsm).empty():
                kept.append(cand)
                break
    return "(?:" + "|".join(kept) + ")" if kept else None


def _one_repetition_to_length(rx: str, lo: int, hi: int | None) -> str | None:
    """``rx`` (a format's regex, no assertions) with one repetition given enough rounds that
    every string has at least ``lo`` characters, the others as written (a subset, and the
    format's own strings elsewhere: ``https://`` URLs under minLength 10 have a host of 6
    characters or more), or None. Under a ``hi`` too, the repetitions are then bounded to the
    most rounds (up to 64 more) whose strings all have at most ``hi`` characters; a class
    repeated alone (``format: regex`` under 1..1000) is that class ``lo`` to ``hi`` times
    (exact). The repetitions of a class are tried first (their rounds are plain characters),
    unbounded ones before counted ones, each in the order written. A regex of top-level
    branches (uri-reference: a URI, a path, a fragment) has each branch fitted alone, those
    that fit kept."""
    bare = re.fullmatch(r"(\[(?:\\.|[^\]\\])*\])\*", rx)
    if bare:
        return f"{bare.group(1)}{{{lo},{'' if hi is None else hi}}}"
    whole = _one_repetition_fitted(rx, lo, hi)
    if whole is not None or not _top_branches(rx):
        return whole
    kept = [b for b in (_one_repetition_fitted(br, lo, hi) for br in _top_branches(rx)) if b is not None]
    return "(?:" + "|".join(kept) + ")" if kept else None


def _one_repetition_fitted(rx: str, lo: int, hi: int | None) -> str | None:
    """``_one_repetition_to_length`` for one branch (see there)."""
    width = lambda r: _sre_parser.parse(r).getwidth()  # noqa: E731
    raised: list[str] = [rx] if width(rx)[0] >= lo else []  # (no repetition needs more rounds)
    if not raised:
        sites = []
        for n, at in enumerate(text.quantifier_sites(rx)):
            on_class = at > 0 and rx[at - 1] == "]"  # (a preference only: an escaped "]" may pass for one)
            unbounded = re.match(r"[*+]|\{\d+,\}", rx[at:]) is not None
            sites.append((not on_class, not unbounded, n))
        for _, _, n in sorted(sites):
            if width(text.reshaped_repetitions(rx, lo, None, only=n))[0] < lo:
                continue  # rounds of it alone never reach lo (a bound, or an optional part around it)
            low, high = 1, lo
            while low < high:  # the fewest rounds that reach lo: the shortest grows with them
                mid = (low + high) // 2
                if width(text.reshaped_repetitions(rx, mid, None, only=n))[0] >= lo:
                    high = mid
                else:
                    low = mid + 1
            raised.append(text.reshaped_repetitions(rx, low, None, only=n))
    for cand in raised:
        if hi is None:
            return cand
        for k in range(64, -1, -1):  # every repetition bounded (its least kept): the most rounds that fit hi
            bounded = text.reshaped_repetitions(cand, 0, k, cap_counted=False)
            if width(bounded)[1] <= hi:
                return bounded
    return None


def _capped_to_length(rx: str, lo: int, hi: int | None) -> str | None:
    """``rx`` (a format's regex, no assertions) with every repetition at most ``k`` rounds
    (``text.reshaped_repetitions``: a subset), ``k`` the largest up to 64 whose strings all
    have ``lo..hi`` characters, or None (band-manifest's email under maxLength 100: each part
    of ``[a-zA-Z0-9_]{1,20}(?:[.+-][a-zA-Z0-9_]{1,20}){0,3}@...`` shortened alike); where a
    minLength passes the shortest strings, every repetition at least some rounds too. Lengths
    read from Python's parse (its widths are the language's: every part matches something)."""
    best = None
    for k in range(1, 65):
        cand = text.reshaped_repetitions(rx, 0, k)
        shortest, longest = _sre_parser.parse(cand).getwidth()
        if shortest < lo or hi is not None and longest > hi:
            break
        best = cand
    if best is not None or _sre_parser.parse(rx).getwidth()[0] >= lo:
        return best
    # a minLength above the format's shortest strings (hostname under minLength 3): each repetition
    # at least ``least`` rounds too, the least that reaches it, and at most the most rounds that
    # stay within the maxLength; the counted ones only first ("a.b" stays "ab.c", its hyphens
    # optional), then every one (an optional part then required)
    for loops in (False, True):
        for least in range(1, 65):
            if _sre_parser.parse(text.reshaped_repetitions(rx, least, None, loops=loops)).getwidth()[0] < lo:
                continue
            if hi is None:
                return text.reshaped_repetitions(rx, least, None, loops=loops)
            for most in range(least, 65):
                cand = text.reshaped_repetitions(rx, least, most, loops=loops)
                if _sre_parser.parse(cand).getwidth()[1] > hi:
                    break
                best = cand
            if best is not None:
                return best
            break
    return None

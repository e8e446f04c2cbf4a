"""Strings in the JSON-schema translation: a mixin of ``_Converter`` (json_schema.py).

``_string`` writes a string schema: ``format`` (enforced where treadle can write it,
``ASSERTED_FORMATS``; an annotation otherwise), ``pattern`` (regex_ecma's reading of the ECMA
source, searched: free characters around an unanchored one), ``minLength`` / ``maxLength`` in
code points, and any two of them together, where the exact product is often too large and a
subset that fits is written instead (``_pattern_with_length`` .. ``_fitted_to_lengths``,
``_format_and_pattern``, on string_shapes.py's helpers). treadle's own keywords from the
rewrites of json_schema_logic.py: ``__not_pattern__`` (``_string_not_matching``: the string's
automaton less the pattern's widest reading) and ``__and_pattern__`` (``_string_matching_all``).

This module does not import json_schema.py.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import re
from typing import Any

import interegular

from treadle.constrained.regex import fsm_crawl
from treadle.constrained.regex import regex_text as text
from treadle.constrained.regex.fsm_regex import forced_prefix, fsm_to_regex, length_range, peeled_fsm_to_regex
from treadle.constrained.regex.regex_ecma import key_pattern_bodies, pattern_json_body, pattern_subset_body
from treadle.constrained.schema.json_schema_parts import NoOutput, Unsatisfiable, UnsupportedSchemaError
from treadle.constrained.schema.string_shapes import (
    _LENGTH_PRODUCT,
    _LENGTH_STEPS,
    _PATTERN_STATES,
    _URI_FORMATS,
    _bounded_subset_body,
    _format_branches_inside,
    _format_with_length,
    _found_in_every_string,
    _length_top,
    _lengths_fsm,
    _narrowed_bodies,
    _padded_to_lengths,
    _reshaped_to_lengths,
    _small_fsm,
    _top_branches,
    _web_urls_matching,
)
from treadle.constrained.schema.uri_shapes import narrow_uris_by_scheme, uris_by_scheme, wider_uri_format, widest_uri_format

# The formats a validator may check (JSON Schema's, drafts 4 to 2020-12): one of these that
# treadle cannot write is refused; any other format is an annotation (OpenAPI's int32, byte, and
# draft-03's color, host-name, ip-address, utc-millisec in a later draft's schema, where
# jsonschema's checkers ignore them). In a draft-03 schema, json_schema_dialects gives its own
# formats their meaning first (host-name as hostname, ip-address as ipv4, color as hex codes).
ASSERTED_FORMATS = frozenset(
    "date-time date time duration email idn-email hostname idn-hostname ipv4 ipv6 uri uri-reference iri "
    "iri-reference uuid uri-template json-pointer relative-json-pointer regex".split())
# OpenAPI string formats that allow any string (Pydantic writes bytes and SecretStr so)
OPENAPI_ANY_STRING = frozenset({"binary", "password"})
# texts where equal values are equal texts (see json_schema.py's _Converter._not_listed)
_ONE_SPELLING = {
    "string": '"' + text.SAFE_RAW_CHAR + '*"',
    "number": r"(?:0|-?[1-9][0-9]{0,8})(?:\.[0-9]{1,6})?",
    "integer": r"(?:0|-?[1-9][0-9]{0,8})(?:\.0{1,6})?",
}


def _shortest_strings(fsm: Any) -> str | None:
    """The strings of a JSON string's automaton ``fsm`` (raw characters) with the fewest
    characters it has up to a few more (16, else 8, 4, 2, 0 more), as the first such regex that
    is short enough to write (a subset: ``^[A-Za-z0-9]{8,64}$`` with ``[A-Z]`` and ``[0-9]``
    writes 8 to 24 characters), or None."""
    shortest, _ = length_range(fsm)
    for more in (16, 8, 4, 2, 0):
        lengths = interegular.parse_pattern(f'"{text.SAFE_RAW_CHAR}{{{max(shortest - 2, 0)},'
                                            f'{max(shortest - 2, 0) + more}}}"').to_fsm()
        try:
            out = fsm_to_regex(fsm & lengths)
        except ValueError:
            continue
        if out is not None:
            return out
    return None


@functools.lru_cache(maxsize=16)
def _format_fsm(written: str) -> Any:
    """The automaton of a format's subset (the same few regexes, one parse each a process: the
    'regex' format's takes interegular 0.4 s). Read only: FSM operations build new ones."""
    return interegular.parse_pattern(written).to_fsm()


class _StringsMixin:
    """How ``_Converter`` writes a string schema (see the module docstring)."""

    def _string_not_matching(self, schema: dict, path: str) -> str:
        """A string of ``schema`` that matches none of its ``__not_pattern__`` patterns (``not:
        {pattern: ..}``, json_schema_logic.complement): the string's automaton, raw characters
        only (a character and its text agree), minus each pattern's widest reading
        (regex_ecma.key_pattern_bodies' outer body: every raw string Python's ``re`` or ECMA-262
        finds a match in), so no string either reading matches is written."""
        part = self._string({k: v for k, v in schema.items() if k != "__not_pattern__"}, path)
        fsm = interegular.parse_pattern(part).to_fsm() & interegular.parse_pattern(_ONE_SPELLING["string"]).to_fsm()
        for pattern in schema["__not_pattern__"]:
            try:
                outer = key_pattern_bodies(pattern)[1] if isinstance(pattern, str) else None
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path}: pattern {pattern!r}: {exc}") from exc
            if outer is None:
                raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path}: pattern {pattern!r} is no string")
            fsm = fsm - interegular.parse_pattern('"' + outer + '"').to_fsm()
        try:
            out = fsm_to_regex(fsm)
        except ValueError as exc:  # the difference's regex is too long
            raise UnsupportedSchemaError(f"json_schema: keyword 'not' at {path} is not supported: {exc}") from exc
        if out is None:
            raise Unsatisfiable(f"json_schema: keyword 'not' at {path}: every string is excluded")
        return out

    def _string_matching_all(self, schema: dict, path: str) -> str:
        """A string of ``schema`` that matches each of its ``__and_pattern__`` patterns too
        (patterns met in allOf: ``pattern`` holds the first): the string's automaton (raw
        characters only) and each pattern's narrow reading (key_pattern_bodies' inner body: raw
        strings that match under Python's ``re`` and ECMA-262, a subset) intersected. Where that is
        empty, the schema is unsatisfiable only if the wide readings (outer bodies) meet nowhere."""
        rest = {k: v for k, v in schema.items() if k != "__and_pattern__"}
        part = self._string_not_matching(rest, path) if "__not_pattern__" in rest else self._string(rest, path)
        fsm = interegular.parse_pattern(part).to_fsm() & interegular.parse_pattern(_ONE_SPELLING["string"]).to_fsm()
        wide = interegular.parse_pattern(_ONE_SPELLING["string"]).to_fsm()
        for pattern in [schema.get("pattern"), *schema["__and_pattern__"]]:
            if pattern is None:
                continue
            try:
                inner, outer = key_pattern_bodies(pattern) if isinstance(pattern, str) else (None, None)
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path}: pattern "
                                             f"{pattern!r}: {exc}") from exc
            if inner is None or outer is None:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path}: pattern "
                                             f"{pattern!r} has no reading that can be written")
            wide = wide & interegular.parse_pattern('"' + outer + '"').to_fsm()
            fsm = fsm & interegular.parse_pattern('"' + inner + '"').to_fsm()
            if len(fsm.states) > _PATTERN_STATES:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path} is not "
                                             f"supported: the patterns' joint automaton passes {_PATTERN_STATES} states")
        try:
            out = fsm_to_regex(fsm)
        except ValueError as exc:  # the intersection's regex is too long: one pattern of them all, or
            out = self._joint_pattern(rest, schema["__and_pattern__"], path) or _shortest_strings(fsm)
            if out is None:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path} is not "
                                             f"supported: {exc}") from exc
        if out is None:
            if wide.empty():
                raise Unsatisfiable(f"json_schema: keyword 'pattern' combined in allOf at {path}: no string matches "
                                    "every pattern")
            raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' combined in allOf at {path} is not "
                                         "supported: no string written matches every pattern")
        return out

    def _joint_pattern(self, rest: dict, others: list, path: str) -> str | None:
        """``rest`` (its ``pattern`` the first of allOf's) matching ``others`` too, as one pattern
        the pattern reader writes: ``^(?=[\\s\\S]*?(?:P2))...[\\s\\S]*?(?:P1)`` finds each pattern
        wherever it is (lookaheads the reader writes exactly where it can: the password rule's
        ``(?=.*[A-Z])`` ... beside ``[A-Za-z0-9]{8,64}``), or None: patterns with group numbers or
        flags (which the joint one would change), or a joint one the reader refuses."""
        patterns = [rest.get("pattern"), *others]
        if not all(isinstance(p, str) and not re.search(r"\\[1-9k]|\(\?[aiLmsux]|\(\?P=", p) for p in patterns):
            return None
        joint = "^" + "".join(f"(?=[\\s\\S]*?(?:{p}))" for p in others) + f"[\\s\\S]*?(?:{patterns[0]})"
        try:
            part = {**rest, "pattern": joint}
            out = self._string_not_matching(part, path) if "__not_pattern__" in part else self._string(part, path)
        except (UnsupportedSchemaError, Unsatisfiable):  # (the automata decide what is unsatisfiable)
            return None
        return out

    def _string(self, schema: dict, path: str) -> str:
        fmt = schema.get("format")
        if fmt in OPENAPI_ANY_STRING or fmt not in text.FORMATS and fmt not in ASSERTED_FORMATS:
            # any string: a format no validator checks is an annotation (int32, byte, ...)
            schema = {k: v for k, v in schema.items() if k != "format"}
        if isinstance(schema.get("pattern"), str) and _found_in_every_string(schema["pattern"]):
            schema = {k: v for k, v in schema.items() if k != "pattern"}  # (it asserts nothing)
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        for key, value in (("minLength", lo), ("maxLength", hi)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} must be a non-negative integer")
        lo = math.ceil(lo)
        hi = None if hi is None else math.floor(hi)
        if hi is not None and hi < lo:
            raise Unsatisfiable(f"json_schema: keyword 'maxLength' at {path} is below minLength")
        if "format" in schema and "pattern" in schema:
            return '"' + self._format_and_pattern(schema, lo, hi, path) + '"'
        special = [k for k in ("pattern", "format") if k in schema]
        if special == ["pattern"] and ("minLength" in schema or "maxLength" in schema):
            try:
                body = text.pattern_with_length(schema["pattern"], lo, hi)
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
            if body is not None:
                return '"' + body + '"'
            return '"' + self._pattern_with_length(schema["pattern"], lo, hi, path) + '"'
        lengths = "minLength" in schema or "maxLength" in schema
        if special == ["format"] and schema["format"] in text.FORMATS and lengths:
            try:
                return '"' + _format_with_length(schema["format"], lo, hi, path) + '"'
            except (UnsupportedSchemaError, Unsatisfiable):
                if schema["format"] not in text.PYDANTIC_FORMATS:
                    raise
                # a format only Pydantic writes, which no validator checks (an annotation, written
                # where it fits): none of its strings has these lengths, so any string of them
                # (Base64Bytes under minLength 5, maxLength 7; pydantic's maxLength counts bytes)
                schema, special = {k: v for k, v in schema.items() if k != "format"}, []
        if special and ("minLength" in schema or "maxLength" in schema):
            raise UnsupportedSchemaError(
                f"json_schema: keyword '{special[0]}' at {path} together with minLength/maxLength is not supported "
                "(except a pattern that repeats one character, as '^[A-Z0-9]+$'); write the length into the "
                "pattern instead"
            )
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in text.FORMATS:
                raise UnsupportedSchemaError(f"json_schema: keyword 'format' at {path}: format {fmt!r} is not supported")
            return '"' + text.FORMATS[fmt] + '"'
        if "pattern" in schema:  # (no lengths: the body may write escapes)
            try:
                return '"' + pattern_json_body(schema["pattern"]) + '"'
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
        try:
            return text.string_regex(lo, hi)
        except ValueError as exc:
            raise UnsupportedSchemaError(f"json_schema: keyword 'minLength' at {path}: {exc}") from exc

    @staticmethod
    def _pattern_with_length(pattern: str, lo: int, hi: int | None, path: str) -> str:
        """A pattern's string body under minLength / maxLength: the pattern's automaton
        intersected with the lengths' (its body writes raw characters, a code point each;
        a maxLength past MAX_REPEAT is cut there, which only narrows)."""
        if lo > text.MAX_MIN_LENGTH:
            raise UnsupportedSchemaError(f"json_schema: keyword 'minLength' at {path}: {lo} exceeds the supported "
                                         f"{text.MAX_MIN_LENGTH}")
        try:
            body = _bounded_subset_body(pattern)
        except ValueError as exc:
            raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
        return _StringsMixin._body_with_length(body, lo, hi, path)

    @staticmethod
    def _body_with_length(body: str, lo: int, hi: int | None, path: str) -> str:
        """``_pattern_with_length`` of the pattern's string body ``body``. Every automaton is
        built under ``fsm_crawl.limit``: where the body's own is too large (a nested counted
        repetition), the body with its repetitions bounded (``_narrowed_bodies``, a subset)
        is fitted instead."""
        if lo == 0 and hi is None:
            return body  # no length to cut
        try:
            return _StringsMixin._fitted_or_narrowed(body, lo, hi, path)
        except Unsatisfiable:
            raise
        except UnsupportedSchemaError:
            # a top-level alternation (RTBFabric's ^DEFAULT|4XX|5XX|\d{3}$ under 3..7, each branch
            # open on a side): its branches fitted one by one, those that fit kept (a subset)
            fitted = []
            for branch in _top_branches(body):
                with contextlib.suppress(UnsupportedSchemaError):
                    fitted.append(_StringsMixin._fitted_or_narrowed(branch, lo, hi, path))
            if not fitted:
                raise
            return "(?:" + "|".join(fitted) + ")"

    @staticmethod
    def _fitted_or_narrowed(body: str, lo: int, hi: int | None, path: str) -> str:
        """``_fitted_to_lengths`` of ``body`` or, where its automaton is too large, of a
        narrower body (``_narrowed_bodies``)."""
        error: UnsupportedSchemaError | None = None
        for cand in itertools.chain([body], _narrowed_bodies(body)):  # (narrowed only where the body fails)
            try:
                with fsm_crawl.limit(states=_PATTERN_STATES, steps=_LENGTH_STEPS):
                    return _StringsMixin._fitted_to_lengths(cand, lo, hi, path)
            except fsm_crawl.TooLarge:
                continue
            except Unsatisfiable:
                if cand is body:
                    raise
            except UnsupportedSchemaError as exc:  # a subset's verdict is not the pattern's
                error = error or exc
        raise error or UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path} together with "
                                              f"minLength/maxLength {lo}..{hi} is not supported: the automaton "
                                              "is too large")

    @staticmethod
    def _fitted_to_lengths(body: str, lo: int, hi: int | None, path: str) -> str:
        """``_body_with_length``'s work on one body."""
        pad = text.SAFE_RAW_CHAR + "*"
        if body.startswith(pad) or body.endswith(pad):
            # an unanchored search: its automaton follows every place a match may start (those
            # of CloudFormation's ARNs, with counted runs, have millions of states); the match
            # with free characters beside it is written first
            if hi is None and lo == 0:
                return body
            padded = _padded_to_lengths(body, lo, hi)
            if padded is not None:
                return padded
        pattern_fsm = interegular.parse_pattern(body).to_fsm()
        shortest, longest = length_range(pattern_fsm)
        if lo <= shortest and (hi is None or longest is not None and longest <= hi):
            return body  # the pattern's strings all have an allowed length
        pad = text.SAFE_RAW_CHAR + "*"
        if hi is not None and lo <= shortest and not body.startswith(pad) and not body.endswith(pad):
            # anchored, only the upper bound cuts: its repetitions bounded as far as its
            # longest string still fits
            reshaped = _reshaped_to_lengths(body, lo, hi)
            if reshaped is not None:
                return reshaped
        top = _length_top(lo, hi)
        error: Exception | None = None
        # a long range counts every length in the automaton (states x lengths, each product
        # built in Python): where that is too big, fewer lengths are written (down to 16 past
        # the shortest allowed), which only narrows
        start = max(lo, shortest)
        for cap in dict.fromkeys(max(lo, c) for c in (top, min(top, start + 64), min(top, start + 16))):
            if len(pattern_fsm.states) * (cap + 1) > _LENGTH_PRODUCT:
                continue
            lengths = interegular.parse_pattern(f"{text.SAFE_RAW_CHAR}{{{lo},{cap}}}").to_fsm()
            fsm = _small_fsm(lambda: pattern_fsm & lengths)  # noqa: B023 (called at once)
            if fsm is None:
                continue
            try:
                out = fsm_to_regex(fsm)
            except ValueError as exc:  # the intersection's regex is too long
                error = exc
                continue
            if out is None and cap == top:
                raise Unsatisfiable(f"json_schema: keyword 'pattern' at {path}: no string of {lo}..{hi} characters "
                                    "matches it")
            if out is not None:
                return out
        # past the product's bounds: a match with free characters beside it, or anchored with its
        # repetitions reshaped (subsets both)
        for written in (_padded_to_lengths(body, lo, hi), _reshaped_to_lengths(body, lo, hi)):
            if written is not None:
                return written
        raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path} together with minLength/maxLength "
                                     f"{lo}..{hi} is not supported: {error or 'the automaton is too large'}")

    def _format_and_pattern(self, schema: dict, lo: int, hi: int | None, path: str) -> str:
        """The module's ``_format_and_pattern`` of ``schema``'s format and pattern, remembered
        (``_remembered_format_and_pattern``)."""
        fmt, pattern = schema["format"], schema["pattern"]
        if fmt not in text.FORMATS:
            raise UnsupportedSchemaError(f"json_schema: keyword 'format' at {path}: format {fmt!r} is not supported")
        lengths = "minLength" in schema or "maxLength" in schema
        if not isinstance(pattern, str):  # (refused by name, unremembered)
            return _format_and_pattern(fmt, pattern, lo, hi, lengths, path)
        out, error = _remembered_format_and_pattern(fmt, pattern, lo, hi, lengths)
        if error is not None:
            raise type(error)(str(error).replace(_AT_PATH, path)) from error.__cause__
        return out


def _format_and_pattern(fmt: str, pattern: Any, lo: int, hi: int | None, lengths: bool, path: str) -> str:
    """A string body that is of the format and matches the pattern (and the length bounds,
    ``lengths`` where the schema has minLength or maxLength): the three automata intersected,
    written back as a regex. A format with a plainer subset (text.PLAIN_FORMATS) writes that
    one where its own cannot be."""
    try:
        return _format_subset_and_pattern(fmt, pattern, text.FORMATS[fmt], lo, hi, lengths, path)
    except NoOutput:
        wide = wider_uri_format(fmt)  # a URN's pattern under a URI format (uri_shapes.py)
        if wide is None:
            raise
        try:
            return _format_subset_and_pattern(fmt, pattern, wide, lo, hi, lengths, path, peel=True)
        except NoOutput:  # (a data: URI's ";base64,": paths with ',' and ';')
            return _format_subset_and_pattern(fmt, pattern, widest_uri_format(fmt), lo, hi, lengths, path, peel=True)
    except UnsupportedSchemaError:
        if fmt not in text.PLAIN_FORMATS:
            raise
        return _format_subset_and_pattern(fmt, pattern, text.PLAIN_FORMATS[fmt], lo, hi, lengths, path)


def _narrow_format_matching(fmt: str, pattern_fsm: Any) -> str | None:
    """For a format whose product with the pattern is too long to write (the web's email
    pattern under format email: a top-level domain of letters), the first of its narrower
    subsets (text.NARROW_FORMATS) that lies inside the pattern, or whose product with it can be
    written and is not empty; else a stem of the format (text.SUFFIX_STEMS) and the text every
    string of the pattern ends with, inside both; None where none is."""
    for rx in text.NARROW_FORMATS.get(fmt, ()):
        fsm = interegular.parse_pattern(rx).to_fsm()
        if (fsm - pattern_fsm).empty():
            return rx
        with contextlib.suppress(ValueError):  # (too long to write: the next one)
            out = fsm_to_regex(fsm & pattern_fsm)
            if out is not None:
                return out
    # the pattern's forced suffix (a domain: \.edu$) after a stem of the format, where both
    # the format's subset and the pattern hold every such string
    suffix = forced_prefix(pattern_fsm.reversed())[::-1]
    if suffix and fmt in text.SUFFIX_STEMS:
        written = interegular.parse_pattern(text.FORMATS[fmt]).to_fsm()
        for stem in text.SUFFIX_STEMS[fmt]:
            rx = stem + re.escape(suffix)
            fsm = interegular.parse_pattern(rx).to_fsm()
            if not fsm.empty() and (fsm - written).empty() and (fsm - pattern_fsm).empty():
                return rx
    return None


# where a remembered refusal's message names the schema's path (_remembered_format_and_pattern)
_AT_PATH = "\x00path\x00"


@fsm_crawl.memo(maxsize=512)  # (charged its work on every call: fsm_crawl.memo)
def _remembered_format_and_pattern(fmt: str, pattern: str, lo: int, hi: int | None,
                                   lengths: bool) -> tuple[str | None, UnsupportedSchemaError | None]:
    """``_format_and_pattern``'s body or refusal (its message at ``_AT_PATH``), remembered per
    format, pattern and lengths: a schema repeats them (gitlab-ci's includes
    '^https?://.+\\.ya?ml$' under uri-reference 4 times, 0.6 s of automata each)."""
    try:
        return _format_and_pattern(fmt, pattern, lo, hi, lengths, _AT_PATH), None
    except UnsupportedSchemaError as exc:
        link: BaseException | None = exc
        while link is not None:  # kept without the frames (and their automata) it was raised through
            link.with_traceback(None)
            link = link.__cause__ or link.__context__
        return None, exc


def _format_subset_and_pattern(fmt: str, pattern: Any, written: str, lo: int, hi: int | None, lengths: bool,
                               path: str, peel: bool = False) -> str:
    """``_format_and_pattern`` for ``written``, the format's subset; ``peel``: their product
    written with its common prefix first (fsm_regex.peeled_fsm_to_regex)."""
    try:
        body = pattern_subset_body(pattern)
    except ValueError as exc:
        raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path}: {exc}") from exc
    format_fsm, pattern_fsm = _format_fsm(written), interegular.parse_pattern(body).to_fsm()
    # One inside the other: that one is the intersection (citation-file-format's ORCID
    # pattern under format uri; a date-time under a pattern of digits and dashes); for an
    # unanchored pattern, also its core alone (strings that match it whole: a subset).
    pad = text.SAFE_RAW_CHAR + "*"
    core = body.removeprefix(pad).removesuffix(pad)
    for cand, cand_fsm in ((body, pattern_fsm), (core, None)):
        if cand_fsm is None:
            if not core or core == body:
                break
            cand_fsm = interegular.parse_pattern(core).to_fsm()
        if (cand_fsm - format_fsm).empty() and not cand_fsm.empty():
            return _StringsMixin._body_with_length(cand, lo, hi, path) if lengths else cand
    if (format_fsm - pattern_fsm).empty():
        return _format_with_length(fmt, lo, hi, path) if lengths else written
    if fmt in _URI_FORMATS:
        # a pattern of the scheme (^https://, ^(https|http|ftp|sftp)://.+, ^mailto:): the URIs
        # of the schemes it takes whole, each checked inside both (their product's regex is long;
        # under lengths, with the lengths its states past 100,000: Pydantic's HttpUrl, 1..2083)
        by_scheme = uris_by_scheme(pattern_fsm, bounded=lengths and hi is not None)
        if by_scheme is not None:
            return _StringsMixin._body_with_length(by_scheme, lo, hi, path) if lengths else by_scheme
    fsm = format_fsm & pattern_fsm
    if lengths:
        fsm = fsm & _lengths_fsm(lo, hi)
    try:
        out = peeled_fsm_to_regex(fsm) if peel else fsm_to_regex(fsm)
    except ValueError as exc:  # the intersection's regex is too long
        # (the format's own branches: none in a format with a plainer subset, which is written next)
        inside = None if fmt in text.PLAIN_FORMATS else _format_branches_inside(fmt, pattern_fsm)
        if inside is not None:
            return _StringsMixin._body_with_length(inside, lo, hi, path) if lengths else inside
        web = _web_urls_matching(fmt, pattern_fsm) or _narrow_format_matching(fmt, pattern_fsm)
        if web is None and fmt in _URI_FORMATS:
            web = narrow_uris_by_scheme(pattern_fsm, fsm_to_regex)
        if web is not None:
            return _StringsMixin._body_with_length(web, lo, hi, path) if lengths else web
        raise UnsupportedSchemaError(f"json_schema: keyword 'pattern' at {path} together with format {fmt!r} "
                                     f"is not supported: {exc}") from exc
    if out is None:
        raise Unsatisfiable(f"json_schema: keyword 'pattern' at {path}: no {fmt!r} string matches it")
    return out

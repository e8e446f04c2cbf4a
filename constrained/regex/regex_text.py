"""Regex building blocks for text: literals, choices, JSON strings, formats, patterns.

Every regex produced here is written in the small dialect that means the same thing in
Python ``re``, Rust ``regex`` (outlines-core's DFA) and interegular: ASCII character
classes only, no ``\\b``, no lookaround, no backreferences, no lazy or possessive
quantifiers, no named groups, no inline flags, no anchors. A user's regex may also write
``\\d \\w \\s``, read with their ASCII meanings as outlines reads them (``[0-9]``,
``[a-zA-Z0-9_]``, ``[ \\t\\n\\r\\f\\v]``), and their negations, which leave out the
characters Python's Unicode-wide reading matches too (``_unicode_extra``: a subset of what
``re`` takes, never more), also inside a class (``[\\s\\S]``, ``[^\\S\\n]``), and any
escaped punctuation, named groups, lazy quantifiers and comments (which match the strings
their plain forms do), Python's inline flags ``(?aimsx)`` at its start and scoped
``(?i:x)`` / ``(?-i:x)`` (case folding as ``re.IGNORECASE`` does it, ``.`` with newlines),
and ``\\A`` / ``\\Z`` at its ends; it is translated into the dialect (``translate_regex``).
"""

from __future__ import annotations

import json
import re
import unicodedata as _unicodedata

try:  # the class parser of Python's re (3.11+), sre_parse before
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]
from functools import lru_cache as _lru_cache
from typing import Any

import interegular

from treadle.constrained.regex import fsm_crawl as _fsm_crawl  # noqa: F401  (interegular's crawl, made linear)

# Characters that are special outside a character class in either dialect. Escaping only
# these keeps the output acceptable to all three engines (Rust rejects some escapes that
# Python's re.escape emits).
_SPECIAL = set("\\.+*?()|[]{}^$")

# One JSON string character that stands for exactly one Unicode code point: a raw
# character that needs no escaping, a short escape, a \uXXXX escape that is not a
# surrogate, or a surrogate pair. Lone surrogates are excluded (not valid Unicode, and
# they would make length counting unsound).
STRING_CHAR = (
    r'(?:[^"\\\x00-\x1f]'
    r'|\\["\\/bfnrt]'
    r"|\\u(?:[0-9a-cA-C][0-9a-fA-F]{3}|[eEfF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
# A raw character that may appear unescaped inside a JSON string.
SAFE_RAW_CHAR = r'[^"\\\x00-\x1f]'
# What ECMA-262 '.' may emit unescaped: also not a line terminator (U+2028/9 kept raw,
# since interegular has no \u escape).
_JSON_UNSAFE_CLASS_BODY = '"\\\\\\x00-\\x1f\u2028\u2029'
DOT_CHAR = "[^" + _JSON_UNSAFE_CLASS_BODY + "]"

# Counted repetitions above this are clamped (when the upper bound may shrink soundly) or
# refused (when a lower bound would need them): large counts blow up the DFA.
MAX_REPEAT = 256
# a plain string's minLength up to this is written (publiccode.json's longDescription asks 500);
# its maxLength is still cut at MAX_REPEAT past the minimum (fewer characters: still valid)
MAX_MIN_LENGTH = 4096


class RegexDialectError(ValueError):
    """A regex uses a construct outside the dialect treadle supports."""


def escape_literal(text: str) -> str:
    """Return a regex matching exactly ``text`` (valid in Python re, Rust regex, interegular)."""
    out = []
    for ch in text:
        if ch in _SPECIAL:
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value: Any) -> str:
    """``value`` as compact JSON text, non-ASCII characters raw, but a lone surrogate (a string
    JSON's "\\ud800" decoded to) as its escape: UTF-8 text cannot hold it raw, and the escape
    parses back to the same string."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))


def choices_to_regex(choices: list[str]) -> str:
    """Return an alternation regex matching exactly one of ``choices``."""
    if not isinstance(choices, list) or not choices:
        raise ValueError("choices: expected a non-empty list of strings")
    for c in choices:
        if not isinstance(c, str):
            raise ValueError(f"choices: every choice must be a string, got {type(c).__name__}")
    # Longest first keeps the alternation readable; fullmatch semantics make order moot.
    uniq = sorted(set(choices), key=lambda s: (-len(s), s))
    return "(?:" + "|".join(escape_literal(c) for c in uniq) + ")"


def string_regex(min_length: int = 0, max_length: int | None = None) -> str:
    """Return a regex for a quoted JSON string of ``min_length..max_length`` code points."""
    if min_length < 0 or (max_length is not None and max_length < min_length):
        raise ValueError(f"string length bounds {min_length}..{max_length} are empty")
    if min_length > MAX_MIN_LENGTH:
        raise ValueError(f"minLength {min_length} exceeds the supported {MAX_MIN_LENGTH}")
    if max_length is None:
        body = f"{STRING_CHAR}*" if min_length == 0 else f"{STRING_CHAR}{{{min_length},}}"
    else:
        # Clamping the upper bound only removes outputs: still sound.
        hi = min(max_length, max(min_length, MAX_REPEAT) if min_length <= MAX_REPEAT else min_length + MAX_REPEAT)
        body = STRING_CHAR + ("{%d}" % hi if hi == min_length else "{%d,%d}" % (min_length, hi))
    return f'"{body}"'


# Characters that are special inside a character class in one of the dialects (Rust reads
# "&&", "--" and "~~" as set operations): escaped wherever a class lists a literal.
_CLASS_SPECIAL = set("\\][^-&~")


def class_literal(ch: str) -> str:
    """``ch`` written for use inside a character class."""
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{ord(ch):02x}"
    return "\\" + ch if ch in _CLASS_SPECIAL else ch


def excluded_key_regex(names: list[str]) -> str:
    """A quoted JSON string with no escape sequences whose value is none of ``names``.

    Used for the extra members of an open object: such a key can never spell a declared
    property name (escapes included: it has none), so a duplicate key can never replace a
    declared member's value. Built from the names' trie: at each node, a string may stop
    (unless a name ends there), go on with a character no name continues with (then
    anything may follow), or follow an edge of the trie. Names with a character that JSON
    must escape can never be written without escapes, so they need no exclusion.
    """
    return '"' + _not_in_trie(raw_names_trie(names)) + '"'


def raw_names_trie(names: list[str]) -> dict:
    """The trie of the ``names`` a JSON string can hold without escapes (the others can never
    be written as raw keys): a node maps each next character to its node, and ``""`` marks
    where a name ends ("" is never an edge character)."""
    trie: dict = {}
    for name in names:
        if any(not re.fullmatch(SAFE_RAW_CHAR, ch) or _SURROGATE.fullmatch(ch) for ch in name):
            continue
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}
    return trie


def _not_in_trie(node: dict) -> str:
    """Bodies s (raw safe characters) such that prefix(node) + s is not a name."""
    edges = sorted(ch for ch in node if ch)
    other = SAFE_RAW_CHAR[:-1] + "".join(class_literal(ch) for ch in edges) + "]"
    alts = [f"{other}{SAFE_RAW_CHAR}*"] + [escape_literal(ch) + _not_in_trie(node[ch]) for ch in edges]
    body = "(?:" + "|".join(alts) + ")"
    return body if "" in node else body + "?"


# ---------------------------------------------------------------- formats
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
    r"|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
    rf"|{_LEAP_YEAR}-02-29)"
)  # every output is a real calendar date: Feb 29 only in a leap year (by 4, centuries by 400), no
# year 0000 (RFC 3339 writes it, but Python's date.fromisoformat, jsonschema's date check,
# rfc3339-validator's date-time check and Pydantic all refuse it)
_TIME = (
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?"
_N = r"[0-9]{1,4}"  # a bound Pydantic (speedate) can read in every part
# RFC 3339 appendix A (ISO 8601 durations, no fractions): P1Y2M3DT4H5M6S, PT1H30M, P2W
_DURATION = (rf"P(?:(?:{_N}D|{_N}M(?:{_N}D)?|{_N}Y(?:{_N}M(?:{_N}D)?)?)(?:T(?:{_N}H(?:{_N}M(?:{_N}S)?)?"
             rf"|{_N}M(?:{_N}S)?|{_N}S))?|T(?:{_N}H(?:{_N}M(?:{_N}S)?)?|{_N}M(?:{_N}S)?|{_N}S)|{_N}W)")
_H16 = r"[0-9a-fA-F]{1,4}"
_HOST_LABEL = r"[a-zA-Z0-9](?:-?[a-zA-Z0-9]){0,20}"
# (no ',' or ';': rare in real URIs, and where a URI ends a ',' more often follows it in the JSON)
_PCHAR = r"(?:[a-zA-Z0-9._~!$&'()*+=:@-]|%[0-9a-fA-F]{2})"
# RFC 3986: scheme "://" reg-name [":" port] path-abempty ["?" query] ["#" fragment], the
# reg-name without sub-delimiters or escapes (hyphenated hosts, IPv4 addresses); repetitions
# unbounded as the grammar's are (bounded counts multiply the automaton's states)
URI_AFTER_SCHEME = (r"://[a-zA-Z0-9][a-zA-Z0-9._~-]*(?::[0-9]{1,5})?"
                    rf"(?:/{_PCHAR}*)*(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?")
_URI = r"[a-zA-Z][a-zA-Z0-9+.-]{0,15}" + URI_AFTER_SCHEME
_SEGMENT = r"[a-zA-Z0-9._~-]+"
# format "regex": a regular subset of the regexes, spelt as JSON text (a backslash of the value is
# written \\). Literals (letters, digits, space and _ , : / @ = -), '.', escapes (\d \w \s and their
# capitals, \n \r \t, an escaped metacharacter or '/'), classes of those literals, '.', the ranges
# a-z A-Z 0-9 a-f A-F and escapes (no bare '-', '[' or '^' inside, never empty), quantifiers * + ?
# {n} {n,} {n,m} (n one digit, m one not below it or two: never out of order), each maybe lazy,
# after an atom only; groups (maybe '(?:'), not nested (each nesting level multiplies the
# automaton interegular builds: 0.4 s, 1.1 s nested two deep), alternatives, '^' first and
# '$' last. Each such string compiles under Python's re (no FutureWarning), the regex module and
# ECMA-262 with and without the u flag (no identity escape of a letter, no lone '{' or ']').
_RX_BACKSLASH = r"\\\\"
_RX_LITERAL = r"[a-zA-Z0-9 _,:/@=-]"
_RX_ESCAPE = _RX_BACKSLASH + r"(?:[dDwWsSnrt]|[.*+?()\[\]{}|^$/]|" + _RX_BACKSLASH + ")"
_RX_CLASS_ITEM = r"(?:[a-zA-Z0-9 _.,:/@=]|a-z|A-Z|0-9|a-f|A-F|" + _RX_BACKSLASH + r"[dDwWsS.\[\]^$/-]|" \
    + _RX_BACKSLASH + _RX_BACKSLASH + ")"
_RX_QUANTIFIER = (r"(?:(?:[*+?]|\{(?:[0-9](?:,(?:[1-9][0-9])?)?|" + "|".join(f"{n},[{n}-9]" for n in range(10))
                  + r")\})\??)")


def _regex_alternatives(group: str | None) -> str:
    """Alternatives of pieces (an atom, maybe quantified); ``group`` the alternatives a group
    holds, None for none."""
    atom = rf"(?:{_RX_LITERAL}|\.|{_RX_ESCAPE}|\[\^?{_RX_CLASS_ITEM}+\]" + \
        (rf"|\((?:\?:)?{group}\)" if group else "") + ")"
    branch = rf"(?:{atom}{_RX_QUANTIFIER}?)*"
    return rf"{branch}(?:\|{branch})*"


_REGEX = r"\^?" + _regex_alternatives(_regex_alternatives(None)) + r"\$?"
_POINTER = r'(?:/(?:[^"\\\x00-\x1f/~]|~[01])*)*'
_BOUNDED_POINTER = r"(?:/(?:[a-zA-Z0-9._-]|~[01]){0,20}){0,6}"
# RFC 6570 varname [modifier]: a prefix of 1 to 3 digits (the RFC allows up to 9999; the
# uri_template package, jsonschema's uri-template checker, takes 3 digits at most)
_VARSPEC = r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*(?::[1-9][0-9]{0,2}|\*)?"
BOUNDED_URI_AFTER_SCHEME = rf"://{_LABEL}(?:\.{_LABEL}){{0,3}}(?::[0-9]{{1,5}})?(?:/[a-zA-Z0-9._~-]{{0,20}}){{0,5}}"
_BOUNDED_URI = "https?" + BOUNDED_URI_AFTER_SCHEME
_BOUNDED_REF = (rf"(?:{_BOUNDED_URI}|/?[a-zA-Z0-9._~-]{{1,20}}(?:/[a-zA-Z0-9._~-]{{1,20}}){{0,5}}"
                r"(?:#[a-zA-Z0-9._~/-]{0,20})?|#[a-zA-Z0-9._~/-]{0,20})")
# formats whose strings have no longest one, as written under a maxLength: a subset that has
BOUNDED_FORMATS: dict[str, str] = {
    # (http and https only, as before: Pydantic's HttpUrl, which writes maxLength 2083, takes no other)
    "uri": _BOUNDED_URI,
    "iri": _BOUNDED_URI,  # every URI is an IRI
    # those URLs, or relative paths of at most 6 plain segments and a fragment (as uri-reference)
    "uri-reference": _BOUNDED_REF,
    "iri-reference": _BOUNDED_REF,
    # up to 6 tokens of at most 20 plain characters or ~0 / ~1
    "json-pointer": _BOUNDED_POINTER,
    "relative-json-pointer": rf"(?:0|[1-9]{{1,4}}0?)(?:#|{_BOUNDED_POINTER[:-5]}{{1,6}})",
}
# RFC 4291 section 2.2 text forms with "::" standing for one or more zero groups (no embedded
# IPv4): every string is an IPv6Address; written where a maxLength cuts off the eight-group form
_IPV6_COMPRESSED = (rf"(?:{_H16}(?::{_H16}){{7}}|(?:{_H16}:){{1,7}}:|(?:{_H16}:){{1,6}}:{_H16}"
                    rf"|(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}|(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}"
                    rf"|(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}|(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}"
                    rf"|{_H16}:(?::{_H16}){{1,6}}|:(?:(?::{_H16}){{1,7}}|:))")
# formats whose subset below misses their shortest strings: wider subsets, written where a
# maxLength cuts off every string of the narrower one, the first whose strings under the lengths
# can be written (fewer groups beside the "::", so fewer ways to spell a length, further down)
SHORT_FORMATS: dict[str, tuple[str, ...]] = {"ipv6": (
    _IPV6_COMPRESSED, rf"(?:{_H16}(?::{_H16})?)?::(?:{_H16}(?::{_H16})?)?", rf"(?:{_H16})?::(?:{_H16})?")}
# the lengths of every valid string of a format (shortest, longest or None), where the RFCs fix
# them: "::" (2) to "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255" (45); an RFC 3339 date-time
# "2020-01-01T00:00:00Z" (20) or time "00:00:00Z" (9), longer with fractions; a duration "P1D";
# a host name of one label to 253 characters; an address "a@b". Only lengths outside these are
# unsatisfiable (a format not listed: any length); the subsets written have narrower ones.
FORMAT_LENGTHS: dict[str, tuple[int, int | None]] = {
    "date": (10, 10), "time": (9, None), "date-time": (20, None), "duration": (3, None),
    "ipv4": (7, 15), "ipv6": (2, 45), "ipvanyaddress": (2, 45), "uuid": (36, 36),
    **{f"uuid{v}": (36, 36) for v in range(1, 9)},
    "hostname": (1, 253), "email": (3, None),
}
FORMATS: dict[str, str] = {
    "date": _DATE,
    "duration": _DURATION,
    # labels of letters and digits joined by single hyphens (so no "xn--" A-label to check)
    "hostname": rf"{_HOST_LABEL}(?:\.{_HOST_LABEL}){{0,3}}",
    # A conservative subset of RFC 4291 addresses: all eight groups, no "::" or embedded IPv4.
    "ipv6": rf"{_H16}(?::{_H16}){{7}}",
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}",
    # Pydantic's IPvAnyAddress: either
    "ipvanyaddress": rf"(?:{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}|{_H16}(?::{_H16}){{7}})",
    # A conservative subset of RFC 5321 addresses: dot-atoms of alphanumerics.
    "email": rf"[a-zA-Z0-9_]{{1,20}}(?:[.+-][a-zA-Z0-9_]{{1,20}}){{0,3}}@{_LABEL}(?:\.{_LABEL}){{1,3}}",
    # A subset of RFC 3986 absolute URIs as real data holds them: scheme://host[:port], path
    # segments, query and fragment of unreserved characters, sub-delimiters and percent-escapes
    "uri": _URI,
    # every URI is an IRI (RFC 3987): the same subset
    "iri": _URI,
    # a URI, or a relative reference of unreserved path segments (none holding ':', which
    # would read as a scheme) and a fragment (RFC 3986 section 4.1): a subset
    "uri-reference": rf"(?:{_URI}|/?{_SEGMENT}(?:/{_SEGMENT})*(?:#[a-zA-Z0-9._~/-]*)?|#[a-zA-Z0-9._~/-]*)",
    "iri-reference": rf"(?:{_URI}|/?{_SEGMENT}(?:/{_SEGMENT})*(?:#[a-zA-Z0-9._~/-]*)?|#[a-zA-Z0-9._~/-]*)",
    # RFC 6570 URI templates: literals of URI characters (unreserved, reserved, percent-escapes)
    # and expressions {op var,var.name:3,list*} (a subset: no ucschar literals)
    "uri-template": rf"(?:[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=-]|%[0-9A-Fa-f]{{2}}|\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}})*",
    # a regular subset of the regexes (_REGEX above): each compiles in Python's re and ECMA-262
    "regex": _REGEX,
    # RFC 6901: "/"-prefixed reference tokens, '~' only as ~0 or ~1, characters written raw
    # (no JSON escapes: a subset)
    "json-pointer": _POINTER,
    # draft-handrews-relative-json-pointer-01: a non-negative integer, then '#' or a JSON pointer
    # (a subset: not the empty one, which jsonschema's checker reads as false, and no digit after
    # a 0, which its leading-zero check refuses in "100" too; no index manipulation)
    "relative-json-pointer": rf"(?:0|[1-9]{{1,4}}0?)(?:#|{_POINTER[:-1]}+)",
    # RFC 5890: an ASCII host name of the hostname subset is an IDNA one (its labels LDH, no "--"
    # at all, so no A-label or hyphens in the 3rd and 4th places for idna to refuse)
    "idn-hostname": rf"{_HOST_LABEL}(?:\.{_HOST_LABEL}){{0,3}}",
    # RFC 6531 extends RFC 5321: every address of the email subset is an internationalized one
    "idn-email": rf"[a-zA-Z0-9_]{{1,20}}(?:[.+-][a-zA-Z0-9_]{{1,20}}){{0,3}}@{_LABEL}(?:\.{_LABEL}){{1,3}}",
}


# narrower subsets of a format's subset above, tried in order where its product with a pattern
# is too long to write: the web's address patterns end in a top-level domain of letters
# (``^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$``, zod's email pattern), a label counting
# its characters keeps the product from being written; real domains' do end so. Then lowercase
# ones with short top-level domains (ajv's pattern, ``\w+...(\.\w{2,3})+``). Each lies inside
# its format's subset (test_constrained_s48_realworld checks it).
_LOWER_LABEL = r"[a-z0-9]{1,10}(?:-[a-z0-9]{1,10})?"
_EMAIL_NARROW = (
    rf"[a-zA-Z0-9_]{{1,20}}(?:[.+-][a-zA-Z0-9_]{{1,20}}){{0,3}}@{_LABEL}(?:\.{_LABEL}){{0,2}}\.[a-zA-Z]{{2,20}}",
    r"[a-z0-9]{1,20}(?:[.-][a-z0-9]{1,20}){0,3}@[a-z0-9]{1,20}(?:\.[a-z0-9]{1,20}){0,2}\.[a-z]{2,3}",
)
_HOSTNAME_NARROW = (rf"{_HOST_LABEL}(?:\.{_HOST_LABEL}){{0,2}}\.[a-zA-Z]{{2,20}}",
                    rf"{_LOWER_LABEL}(?:\.{_LOWER_LABEL}){{0,2}}\.[a-z]{{2,3}}")
NARROW_FORMATS: dict[str, tuple[str, ...]] = {"email": _EMAIL_NARROW, "idn-email": _EMAIL_NARROW,
                                               "hostname": _HOSTNAME_NARROW, "idn-hostname": _HOSTNAME_NARROW}
# stems of those, written before a text every string of the pattern ends with (its forced
# suffix: ``\.edu$``, ``(^|\.)example\.com$``), each tried where the narrower subsets fail
# (a suffix of a dot and labels, one of a domain, maybe under a subdomain it needs, one from '@';
# then the same in lowercase: ``^([a-z0-9-]+\.)*example\.com$``). Only those inside the format's
# subset and the pattern are written (json_schema_strings._narrow_format_matching checks both).
_EMAIL_LOCAL = r"[a-zA-Z0-9_]{1,20}(?:[.+-][a-zA-Z0-9_]{1,20}){0,3}"
_LOWER_LOCAL = r"[a-z0-9]{1,20}(?:[.-][a-z0-9]{1,20}){0,3}"
_EMAIL_STEMS = tuple(rf"{local}@{domain}" for local, label in ((_EMAIL_LOCAL, _LABEL), (_LOWER_LOCAL, _LOWER_LABEL))
                     for domain in (rf"{label}(?:\.{label})?", rf"(?:{label}\.)?", rf"{label}\.")) + (_EMAIL_LOCAL,)
_HOSTNAME_STEMS = tuple(stem for label in (_HOST_LABEL, _LOWER_LABEL)
                        for stem in (rf"{label}(?:\.{label})?", rf"(?:{label}\.)?", rf"{label}\."))
SUFFIX_STEMS: dict[str, tuple[str, ...]] = {"email": _EMAIL_STEMS, "idn-email": _EMAIL_STEMS,
                                            "hostname": _HOSTNAME_STEMS, "idn-hostname": _HOSTNAME_STEMS}


# narrower subsets of formats, written where a format's own subset cannot be fitted to a
# minLength / maxLength (string_shapes._format_with_length): regexes of literal text and '.'
PLAIN_FORMATS: dict[str, str] = {"regex": r"[a-zA-Z0-9 _.,:/@=-]*"}


# Formats only Pydantic writes (its UUID1..UUID8, IPv4Network, IPvAnyInterface, ...): no
# validator checks them, so they would be annotations, but Pydantic parses the field back with
# them; a subset of any string, so writing them is sound and the model reads the output back.
# Base64Str wants the decoded bytes to be UTF-8 (Base64Bytes takes any): padded base64 of ASCII
# bytes, read per quad of characters (3 bytes b1 b2 b3 below 0x80: the first holds b1's top 6 bits,
# so it is one of the first 32 letters; the second b1's low 2 and b2's top 4, which are below 8;
# the third b2's low 4 and b3's top 2, which are 0 or 1; the fourth anything), each class exactly
# the characters those bytes give; base64url the same with '-' and '_' for '+' and '/' (only the
# fourth character of a quad can be either)
_B64_Q = "[A-Za-f][A-HQ-Xg-nw-z0-3][ABEFIJMNQRUVYZcdghklopstwx014589]"
_B64_TAIL = "(?:[A-Za-f][AQgw]==|[A-Za-f][A-HQ-Xg-nw-z0-3][AEIMQUYcgkosw048]=)?"
_IPV4 = rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}"
_IPV6 = rf"{_H16}(?::{_H16}){{7}}"
# networks with no host bits set (ipaddress's strict reading, which Pydantic uses): a /32 address,
# or one whose last 1, 2 or 3 octets are 0 under /24, /16, /8
_IPV4_NETWORK = rf"(?:{_IPV4}/32|{_OCTET}\.{_OCTET}\.{_OCTET}\.0/24|{_OCTET}\.{_OCTET}\.0\.0/16|{_OCTET}\.0\.0\.0/8)"
_IPV6_NETWORK = rf"{_IPV6}/128"
_IPV4_INTERFACE = rf"{_IPV4}(?:/(?:3[0-2]|[12]?[0-9]))?"
_IPV6_INTERFACE = rf"{_IPV6}(?:/(?:12[0-8]|1[01][0-9]|[1-9]?[0-9]))?"
PYDANTIC_FORMATS: dict[str, str] = {
    # RFC 4122 variant (so uuid.UUID.version reads the version digit), that version
    **{f"uuid{v}": rf"[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{v}[0-9a-fA-F]{{3}}-[89abAB][0-9a-fA-F]{{3}}-[0-9a-fA-F]{{12}}"
       for v in range(1, 9)},
    "ipv4network": _IPV4_NETWORK,
    "ipv6network": _IPV6_NETWORK,
    "ipvanynetwork": f"(?:{_IPV4_NETWORK}|{_IPV6_NETWORK})",
    "ipv4interface": _IPV4_INTERFACE,
    "ipv6interface": _IPV6_INTERFACE,
    "ipvanyinterface": f"(?:{_IPV4_INTERFACE}|{_IPV6_INTERFACE})",
    "base64": rf"(?:{_B64_Q}[A-Za-z0-9+/])*{_B64_TAIL}",
    "base64url": rf"(?:{_B64_Q}[A-Za-z0-9_\-])*{_B64_TAIL}",
}
FORMATS.update(PYDANTIC_FORMATS)
BOUNDED_FORMATS["base64"] = rf"(?:{_B64_Q}[A-Za-z0-9+/]){{0,64}}{_B64_TAIL}"
BOUNDED_FORMATS["base64url"] = rf"(?:{_B64_Q}[A-Za-z0-9_\-]){{0,64}}{_B64_TAIL}"


# ---------------------------------------------------------------- dialect checking
_ALLOWED_ESCAPES = set("nrtfv")
# \d \w \s as class bodies, with their ASCII meanings (Python's and Rust's are Unicode-wide,
# interegular's and outlines' ASCII); their capitals are the negations
_SHORTHAND = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r\\f\\v"}


# a named group's head in Python's spelling or ECMA's / .NET's (not a lookbehind "(?<=" / "(?<!")
_NAMED_GROUP = re.compile(r"\(\?P?<(?![=!])[A-Za-z_][A-Za-z0-9_]*>")


def _shorthand_body(letter: str, ecma: bool) -> str:
    """A class body for ``\\<letter>``; in a JSON string body (``ecma``) ``\\s`` narrows to the
    space, the one whitespace character JSON writes raw."""
    return " " if ecma and letter == "s" else _SHORTHAND[letter]


_ANY_CHAR = "(?:[^\\n]|\\n)"
# an inline flag group: global '(?i)', or scoped '(?i:' / '(?-i:' (Python's flags a i L m s u x)
_FLAG_GROUP = re.compile(r"\(\?([aiLmsux]*)(?:-([imsx]*))?([:)])")
_SIMPLE_CLASS = re.compile(r"\[\^?(?:[^\\\]\[]|\\.)+\]")


@_lru_cache(maxsize=1)
def _cased() -> tuple[int, ...]:
    """The code points that have another case (a lower, upper or folded form of their own)."""
    return tuple(c for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF and (
        (ch := chr(c)).lower() != ch or ch.upper() != ch or ch.casefold() != ch))


MAX_FOLDED = 2000  # distinct characters and classes a regex may fold under 'i' (each a pass over _cased)


def _case_folded(piece: str, ascii_only: bool, offset: int) -> str:
    """One atom of a user's regex under the flag 'i', as Python's ``re`` reads it (asked
    directly, over every cased code point): a character or a class with the characters
    ``re.IGNORECASE`` adds (``k`` is ``[kK\u212a]``), a negated class leaving out those it
    adds to what the class names (``[^a]`` leaves out 'A'). ``ascii_only``: the flag 'a'."""
    if piece == _ANY_CHAR:
        return piece
    if piece.startswith("[") and not _SIMPLE_CLASS.fullmatch(piece):
        raise RegexDialectError(f"regex: the class at offset {offset} under the flag 'i' is not supported")
    return _folded_atom(piece, ascii_only)


@_lru_cache(maxsize=4096)
def _folded_atom(piece: str, ascii_only: bool) -> str:
    negated = piece.startswith("[^")
    named = "[" + piece[2:] if negated else piece
    exact, folded = re.compile(named), re.compile(named, re.IGNORECASE | (re.ASCII if ascii_only else 0))
    added = [c for c in _cased() if folded.fullmatch(chr(c)) and not exact.fullmatch(chr(c))]
    if not added:
        return piece
    more = "".join(class_literal(chr(c)) for c in sorted(added))
    return piece[:-1] + more + "]" if piece.startswith("[") else "[" + piece + more + "]"


def _scan(pattern: str, *, ecma: bool, subset: bool = False, flags: str | None = None,
          wide_shorthands: bool = False) -> str:
    """Check ``pattern`` against the dialect and return it (translated when ``ecma``).

    ``\\d \\w \\s`` (and capitals) become their ASCII classes and escaped punctuation its
    literal. With ``ecma`` (JSON Schema ``pattern``), ``.``, ``\\s`` and negated classes are
    narrowed to characters that need no JSON escaping, and the anchors are expected to
    have been stripped by the caller. With ``subset`` (a string value's pattern, where only
    a subset of the matches is needed), ``\\S \\D \\W`` and negated classes holding shorthands
    are narrowed to characters that Python's Unicode-wide reading also matches.

    ``flags`` (a user's regex, ``translate_regex``): the flags its leading ``(?aimsx)`` set;
    scoped flag groups ``(?i:x)`` / ``(?-i:x)`` are then read too. Under 'i' each character
    and class is case-folded (``_case_folded``), under 's' ``.`` is any character; 'm' changes
    nothing (anchors stand only at the ends).
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    prev_quant = False  # the previous token was a quantifier
    can_quantify = False
    user = flags is not None
    fold, dotall, ascii_only = (("i" in flags, "s" in flags, "a" in flags) if user else (False, False, False))
    # a user's regex without the flag 'a': \D \S \W and negated classes leave out every character
    # Python's Unicode-wide \d \s \w match (the ASCII reading's negation would let them in);
    # ``wide_shorthands`` (the inside of a negative lookaround) reads \d \s \w Unicode-wide too
    unicode = user and not ascii_only and not ecma
    scopes: list[tuple[bool, bool]] = []  # (fold, dotall) outside each open group
    folded: set[str] = set()

    def atom(piece: str, at: int) -> str:
        if not fold:
            return piece
        folded.add(piece)
        if len(folded) > MAX_FOLDED:
            raise RegexDialectError(f"regex: over {MAX_FOLDED} distinct characters and classes under the flag 'i' "
                                    f"(at offset {at}); write the cases out, or use fewer classes")
        return _case_folded(piece, ascii_only, at)

    while i < n:
        ch = pattern[i]
        quant = False
        if ch == "\\":
            if i + 1 >= n:
                raise RegexDialectError("regex: trailing backslash")
            nxt = pattern[i + 1]
            if not (nxt.isascii() and nxt.isalnum()):  # escaped punctuation (or any non-letter): itself
                out.append(atom(("\\" + nxt) if nxt in _SPECIAL else escape_literal(nxt), i))
                i += 2
            elif nxt in _ALLOWED_ESCAPES:
                out.append("\\" + nxt)
                i += 2
            elif nxt == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", pattern[i + 2 : i + 4]):
                out.append(atom(pattern[i : i + 4], i))
                i += 4
            elif nxt in "uU":  # \uXXXX / \UXXXXXXXX (Python re and Rust regex alike): the character
                ch_, size = _code_point_escape(pattern, i)
                out.append(atom(escape_literal(ch_), i))
                i += size
            elif nxt in "pP" and ecma:  # \\p{L} outside a class: as the class [\\p{L}]
                size = _property_escape_size(pattern, i)
                out.append(_property_class(pattern[i:i + size], [pattern[i:i + size]], "", False, subset, i))
                i += size
            elif nxt.lower() in _SHORTHAND:
                body = _shorthand_body(nxt.lower(), ecma)
                if nxt.isupper() and ecma and subset:
                    out.append(_ecma_negated_shorthand(nxt.lower()))
                elif nxt.isupper():  # (a user's regex: the Unicode-wide members left out too, as Python does)
                    # (not folded: Python's 'i' leaves \\D \\S \\W as they are; folded, '\\W' lost '\u0345',
                    # which '(?i)(?!\\W).' then took)
                    extra = _unicode_extra_body(nxt.lower()) if unicode else ""
                    negated_class = _generable_class("[^" + body + (_JSON_UNSAFE_CLASS_BODY if ecma else "") + extra
                                                     + "]", i)
                    out.append(negated_class if user else atom(negated_class, i))
                else:
                    extra = _unicode_extra_body(nxt) if unicode and wide_shorthands else ""
                    out.append(atom(_generable_class("[" + body + extra + "]", i), i))
                i += 2
            elif not ecma and (octal := _python_octal(pattern, i, False)) is not None:
                out.append(atom(escape_literal(octal[0]), i))  # '\\0', '\\012', '\\101': as Python's re
                i += octal[1]
            elif nxt in "123456789" or nxt == "k" and pattern.startswith("<", i + 2):
                ref = re.match(r"\\(?:[1-9][0-9]*|k<[^>]*>)", pattern[i:])
                raise RegexDialectError(
                    f"regex: backreference '{ref.group(0) if ref else pattern[i:i + 2]}' at offset {i} is not "
                    "supported (what it matches depends on what a group matched: no automaton can check it)")
            elif nxt in "bB":
                raise RegexDialectError(
                    f"regex: word boundary '\\{nxt}' at offset {i} is not supported (an assertion between "
                    "characters, which the token automaton does not check); write the characters around it")
            elif nxt in "AZzG":
                raise RegexDialectError(
                    f"regex: anchor '\\{nxt}' at offset {i} is not supported there (matching is always "
                    "whole-string: '^' or '\\A' may start the pattern, '$' or '\\Z' end it)")
            elif nxt in "pP":
                raise RegexDialectError(
                    f"regex: Unicode property escape '\\{nxt}' at offset {i} is not supported in a regex "
                    "(Python's re has none); list the characters in a class, such as [A-Za-z\\u00c0-\\u024f]")
            else:
                raise RegexDialectError(
                    f"regex: escape '\\{nxt}' at offset {i} is not supported "
                    "(it differs between Python re and Rust regex); use an explicit class like [0-9]"
                )
            can_quantify = True
        elif ch == "[":
            j = i + 1
            negated = j < n and pattern[j] == "^"
            if negated:
                j += 1
            body_parts: list[str] = []
            negated_shorthands: list[str] = []
            shorthands: set[str] = set()  # \\d \\w \\s in the class
            properties: list[str] = []  # \\p{..} / \\P{..} in the class (ecma)
            raw_rest: list[str] = []  # the class's other items as the pattern writes them
            if j < n and pattern[j] == "]":
                if ecma:  # ECMA reads '[]' as an empty class, Python/Rust as a literal ']'
                    raise RegexDialectError(f"regex: ']' first in a class at offset {j} is ambiguous; escape it")
                body_parts.append("\\]")
                j += 1
            while j < n and pattern[j] != "]":
                if pattern[j] == "\\" and ecma and pattern[j + 1 : j + 2] in ("p", "P"):
                    size = _property_escape_size(pattern, j)
                    properties.append(pattern[j:j + size])
                    j += size
                    continue
                if pattern[j] == "\\":
                    raw_rest.append(pattern[j:j + 2])
                    e = pattern[j + 1 : j + 2]
                    if e in _SHORTHAND:
                        shorthands.add(e)
                        body_parts.append(_shorthand_body(e, ecma))
                    elif e.lower() in _SHORTHAND and e.isupper():  # \S \D \W: resolved below
                        negated_shorthands.append(e.lower())
                    elif e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", pattern[j + 2 : j + 4]):
                        raw_rest[-1] = pattern[j : j + 4]
                        body_parts.append(pattern[j : j + 4])
                        j += 2
                    elif e in ("u", "U"):  # (a surrogate only in a user's regex: _generable_class drops it)
                        ch_, size = _code_point_escape(pattern, j, surrogate=not ecma)
                        raw_rest[-1] = pattern[j:j + size]
                        body_parts.append(class_literal(ch_))
                        j += size
                        continue
                    elif not ecma and (octal := _python_octal(pattern, j, True)) is not None:
                        raw_rest[-1] = pattern[j:j + octal[1]]
                        body_parts.append(class_literal(octal[0]))
                        j += octal[1]
                        continue
                    elif e.isascii() and e.isalnum() and e not in _ALLOWED_ESCAPES or not e:
                        raise RegexDialectError(f"regex: escape '\\{e}' inside a class at offset {j} is not supported")
                    elif e in _ALLOWED_ESCAPES:
                        body_parts.append("\\" + e)
                    else:
                        body_parts.append(class_literal(e))
                    j += 2
                    continue
                if pattern[j] == "[":
                    raise RegexDialectError(f"regex: unescaped '[' inside a class at offset {j} (nested classes differ in Rust)")
                if pattern[j : j + 2] in ("&&", "--", "~~"):
                    raise RegexDialectError(f"regex: '{pattern[j:j+2]}' inside a class at offset {j} is a set operation in Rust")
                body_parts.append(pattern[j])
                raw_rest.append(pattern[j])
                j += 1
            if j >= n:
                raise RegexDialectError(f"regex: unterminated character class at offset {i}")
            body = "".join(body_parts)
            if properties:
                out.append(_property_class(pattern[i:j + 1], properties, body if not negated_shorthands else None,
                                           negated, subset, i, "".join(raw_rest)))
                i = j + 1
                can_quantify = True
                prev_quant = False
                continue
            both = bool(shorthands & set(negated_shorthands))
            if user and fold and not ecma and (shorthands or negated_shorthands):
                # under 'i' a class holding shorthands is Python's own reading, listed whole: written
                # without the flag and folded after, '(?i)[^\\Wk]' took 'K' and '(?i)[^\\W]' '\u0345'
                out.append(_python_folded_class(pattern[i:j + 1], ascii_only, i))
            elif ecma and subset and both and not negated:  # [\\s\\S]: any character JSON writes raw
                out.append(SAFE_RAW_CHAR)
            elif ecma and subset and (negated_shorthands or negated and shorthands):
                # the shorthands' Unicode-wide meanings (Python's \\d holds every decimal digit, its
                # \\w every letter) cannot be listed: the class is written over printable ASCII, as
                # Python's re reads it there (where ECMA agrees), a subset of what it matches
                out.append(_ascii_class(pattern[i:j + 1], i))
            elif negated_shorthands:
                out.append(atom(_class_with_negated_shorthands(
                    body, negated, negated_shorthands, ecma, i, "".join(sorted(shorthands)) if unicode else None), i))
            else:
                if ecma and negated:
                    body += _JSON_UNSAFE_CLASS_BODY
                if unicode and shorthands and (negated or wide_shorthands):  # Python's Unicode-wide members
                    body += _unicode_extra_body("".join(sorted(shorthands)))
                cls = _generable_class("[" + ("^" if negated else "") + body + "]", i)
                out.append(_json_safe_class(cls, i) if ecma and subset and not negated else atom(cls, i))
            i = j + 1
            can_quantify = True
        elif ch == "(":
            named = None if ecma else _NAMED_GROUP.match(pattern, i)
            flag_group = _FLAG_GROUP.match(pattern, i) if user else None
            if flag_group and not (flag_group.group(1) or flag_group.group(2)):
                flag_group = None  # '(?:'
            if flag_group and flag_group.group(3) == ")":
                raise RegexDialectError(
                    f"regex: inline flags '{flag_group.group(0)}' at offset {i} are supported only at the start "
                    "of the pattern (as Python's re requires), or scoped: '(?i:...)'")
            if flag_group and "L" not in flag_group.group(1):  # '(?i:x)': the group (x), its flags set
                scopes.append((fold, dotall))
                on, off = flag_group.group(1), flag_group.group(2) or ""
                fold = ("i" in on or fold) and "i" not in off
                dotall = ("s" in on or dotall) and "s" not in off
                if "x" in on:
                    raise RegexDialectError(f"regex: the verbose flag 'x' at offset {i} is supported only at "
                                            "the start of the pattern: '(?x)'")
                out.append("(?:")
                i = flag_group.end()
                can_quantify = False
                prev_quant = False
                continue
            if user:
                scopes.append((fold, dotall))
            if pattern.startswith("(?:", i):
                out.append("(?:")
                i += 3
            elif named:  # a user's (?P<name>x) / (?<name>x): the group (x), which matches the same
                out.append("(")
                i = named.end()
            elif not ecma and pattern.startswith("(?#", i) and ")" in pattern[i:]:  # a comment: nothing
                i = pattern.index(")", i) + 1
                if user:
                    scopes.pop()
                continue  # (what came before keeps its quantifier state: Python reads "a(?#c)*" as "a*")
            elif pattern.startswith("(?P=", i):
                raise RegexDialectError(
                    f"regex: backreference '{pattern[i:pattern.find(')', i) + 1 or None]}' at offset {i} is not "
                    "supported (what it matches depends on what a group matched: no automaton can check it)")
            elif pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                kind = "lookbehind" if pattern.startswith("(?<", i) else "lookahead"
                raise RegexDialectError(
                    f"regex: group syntax '{pattern[i:i+3]}' at offset {i} is not supported (a {kind} assertion, "
                    "which the token automaton does not check)")
            elif pattern.startswith("(?", i):
                raise RegexDialectError(
                    f"regex: group syntax '{pattern[i:i+3]}' at offset {i} is not supported "
                    "(lookaround, atomic and conditional groups, and inline flags other than at the start or "
                    "scoped '(?i:...)' are not)" if user else
                    f"regex: group syntax '{pattern[i:i+3]}' at offset {i} is not supported "
                    "(no lookaround, named groups or inline flags)"
                )
            else:
                out.append("(")
                i += 1
            can_quantify = False
        elif ch in "*+?{":
            if ch == "{":
                m = re.match(r"\{([0-9]+)(,([0-9]*))?\}", pattern[i:])
                if not m and (m := re.match(r"\{,([0-9]+)\}", pattern[i:])):
                    raise RegexDialectError(
                        f"regex: '{m.group(0)}' at offset {i} is read differently by Python's re (at most "
                        f"{m.group(1)}) and ECMA (the text itself); write {{0,{m.group(1)}}}, or \\{{ for the text")
                if not m:
                    raise RegexDialectError(f"regex: '{{' at offset {i} is not a counted repetition; escape it as \\{{")
                lo, hi = int(m.group(1)), m.group(3)
                if max(lo, int(hi or 0)) > (MAX_USER_COUNT if user else 1000):
                    # (a user's regex: its token automaton's state cap judges the size, compiler.lazy_nfa)
                    raise RegexDialectError(f"regex: repetition count above {MAX_USER_COUNT if user else 1000:,} "
                                            f"at offset {i}")
                tok, size = m.group(0), len(m.group(0))
            else:
                tok, size = ch, 1
            if prev_quant and ch == "?" and (ecma and subset or not ecma):
                # lazy ('*?', '{2,5}?'): which match a search finds, never whether one exists (nor
                # which strings a whole-string match takes: a user's regex reads so)
                i += 1
                prev_quant = can_quantify = False
                continue
            if prev_quant:
                raise RegexDialectError(f"regex: lazy/possessive or stacked quantifier at offset {i} is not supported")
            if not can_quantify:
                raise RegexDialectError(f"regex: quantifier '{tok}' at offset {i} has nothing to repeat")
            out.append(tok)
            i += size
            quant = True
        elif ch in "^$":
            raise RegexDialectError(f"regex: anchor '{ch}' at offset {i} is not supported (matching is always whole-string)")
        elif ch == "]" or ch == "}":
            raise RegexDialectError(f"regex: unbalanced '{ch}' at offset {i}; escape it")
        elif ch == ".":
            out.append(DOT_CHAR if ecma else _ANY_CHAR if dotall else "[^\\n]")
            i += 1
            can_quantify = True
        else:
            if ch == ")" and scopes:
                fold, dotall = scopes.pop()
            out.append(atom(escape_literal(ch), i) if ch != "|" and ch != ")" else ch)
            can_quantify = ch != "|"
            i += 1
        prev_quant = quant
    return "".join(out)


# every character Python's str \\s or ECMA's \\s matches (str.isspace, and U+FEFF)
_WIDE_SPACES = "".join(chr(c) for c in range(0x10000) if chr(c).isspace()) + "\ufeff"


# the characters a pattern's string body never writes raw (DOT_CHAR leaves them out)
_JSON_UNSAFE_POINTS = (*range(0x20), 0x22, 0x5C, 0x2028, 0x2029)


def _json_safe_class(cls: str, offset: int) -> str:
    """The positive class ``cls`` (translated, Python dialect) less the characters JSON must
    escape (``_JSON_UNSAFE_POINTS``): CloudFormation's ``[\\u0021-\\u007F]`` holds '"' and
    '\\'. Each character of a match is one class's, so a pattern whose classes lose them
    matches exactly its strings that JSON writes raw (a subset). ``cls`` itself when it holds
    none of them; ``RegexDialectError`` when it holds nothing else."""
    try:
        rx = re.compile(cls)
    except re.error:  # (a range out of order: the pattern's check names it)
        return cls
    if not any(rx.fullmatch(chr(c)) for c in _JSON_UNSAFE_POINTS):
        return cls
    parsed = list(_sre_parse.parse(cls))
    if len(parsed) != 1 or parsed[0][0] is not _sre_constants.IN and parsed[0][0] is not _sre_constants.LITERAL:
        return cls  # (left to the pattern's own check, which refuses it)
    members = parsed[0][1] if parsed[0][0] is _sre_constants.IN else [parsed[0]]
    ranges: list[tuple[int, int]] = []
    for op, arg in members:
        if op is _sre_constants.LITERAL:
            ranges.append((arg, arg))
        elif op is _sre_constants.RANGE:
            ranges.append(arg)
        else:  # a category (the translation writes shorthands out) or a negation: not cut here
            return cls
    cut: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        for bad in _JSON_UNSAFE_POINTS:
            if lo <= bad <= hi:
                if lo < bad:
                    cut.append((lo, bad - 1))
                lo = bad + 1
        if lo <= hi:
            cut.append((lo, hi))
    if not cut:
        raise RegexDialectError(f"regex: the class at offset {offset} holds only characters JSON must escape")
    return "[" + "".join(class_literal(chr(a)) if a == b else f"{class_literal(chr(a))}-{class_literal(chr(b))}"
                         for a, b in cut) + "]"


_RAW_UNSAFE_POINTS = (*range(0x20), 0x22, 0x5C)  # what SAFE_RAW_CHAR leaves out


def json_safe_atoms(body: str) -> bool:
    """Whether every character ``body`` (a translated regex) can match is one ``SAFE_RAW_CHAR``
    takes (none of ``_RAW_UNSAFE_POINTS``), read from Python's parse of it: its literals and classes
    one by one, no automaton built (that of a padded or counted body can have millions of
    states). False where it cannot tell (a category, ``.``): the caller then builds the
    automaton."""
    try:
        tree = _sre_parse.parse(body)
    except re.error:
        return False
    c = _sre_constants

    def member(items: list, point: int) -> bool | None:
        hit, negated = False, False
        for op, arg in items:
            if op is c.NEGATE:
                negated = True
            elif op is c.LITERAL:
                hit = hit or arg == point
            elif op is c.RANGE:
                hit = hit or arg[0] <= point <= arg[1]
            else:
                return None
        return hit != negated

    def safe(nodes: Any) -> bool:
        for op, arg in nodes:
            if op is c.LITERAL:
                if arg in _RAW_UNSAFE_POINTS:
                    return False
            elif op is c.IN:
                if any(member(arg, p) is not False for p in _RAW_UNSAFE_POINTS):
                    return False
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
                if not safe(arg[2]):
                    return False
            elif op is c.SUBPATTERN:
                if not safe(arg[-1]):
                    return False
            elif op is c.BRANCH:
                if not all(safe(b) for b in arg[1]):
                    return False
            else:
                return False
        return True

    return safe(tree)


def _ecma_negated_shorthand(letter: str) -> str:
    """``\\S``, ``\\D`` or ``\\W`` in a JSON pattern, as a subset of what both Python's
    ``re`` (Unicode-wide shorthands) and ECMA match, of raw JSON string characters: ``\\S``
    every such character but the Unicode spaces, the others printable ASCII only."""
    if letter == "s":
        return "[^" + "".join(class_literal(c) for c in _WIDE_SPACES) + _JSON_UNSAFE_CLASS_BODY + "]"
    return _ascii_class("\\" + letter.upper(), 0)


def _ascii_class(cls: str, offset: int) -> str:
    """The printable ASCII characters JSON writes raw that Python's ``re`` matches with the
    class (or shorthand) ``cls``, listed: a subset of its characters."""
    try:
        rx = re.compile(cls)
    except re.error as exc:
        raise RegexDialectError(f"pattern: the class at offset {offset}: {exc}") from exc
    chars = [chr(c) for c in range(0x20, 0x7F) if chr(c) not in '"\\' and rx.fullmatch(chr(c))]
    if not chars:
        raise RegexDialectError(f"regex: the class at offset {offset} matches no printable ASCII character")
    return "[" + "".join(class_literal(c) for c in chars) + "]"


def _class_with_negated_shorthands(body: str, negated: bool, letters: list[str], ecma: bool, offset: int,
                                   unicode: str | None = None) -> str:
    """A class holding ``\\S``, ``\\D`` or ``\\W`` (``[\\s\\S]``, ``[^\\S\\n]``), which the
    dialect cannot nest: ``body`` is the rest of the class. The negated shorthands together
    leave out a finite set F of ASCII characters (the intersection of their positive sets),
    so ``[X\\S]`` is ``[^F-X]`` and ``[^X\\S]`` is ``[F-X]``; F - X is listed (X read by Python
    re, in which the body is written). ``unicode`` (a user's regex without the flag 'a'): F and
    X hold the Unicode-wide members of their shorthands too (``_unicode_extra``; X's are the
    letters ``unicode`` names), so the class is exactly Python's (``[\\s\\S]`` any character)."""
    common = set.intersection(*({ord(c) for c in _shorthand_chars(letter, ecma)}
                                | (_unicode_extra(letter) if unicode is not None else set()) for letter in letters))
    rest = re.compile("[" + body + "]") if body else None
    wide_rest = set().union(*(_unicode_extra(letter) for letter in unicode or ""))
    left = _runs_body(sorted(c for c in common if c not in wide_rest and (rest is None or not rest.fullmatch(chr(c)))))
    if negated:  # in F and not in X
        if not left:
            raise RegexDialectError(f"regex: the class at offset {offset} matches no character")
        return "[" + left + "]"
    if ecma:  # any character JSON writes raw, but F - X
        return "[^" + left + _JSON_UNSAFE_CLASS_BODY + "]"
    return "[^" + left + "]" if left else "(?:[^\\n]|\\n)"  # the latter: any character


def _shorthand_chars(letter: str, ecma: bool) -> str:
    """The characters of ``\\<letter>`` (lower case), as ``_shorthand_body`` writes them."""
    if letter == "d":
        return "0123456789"
    if letter == "w":
        return "".join(chr(c) for c in range(128) if chr(c).isalnum()) + "_"
    return " " if ecma else " \t\n\r\f\v"


@_lru_cache(maxsize=3)
def _unicode_extra(letter: str) -> frozenset[int]:
    """The code points Python's ``re`` matches with ``\\<letter>`` (lower case) in a str pattern
    that its ASCII reading (``_shorthand_chars``) leaves out: 650 decimal digits, 23 spaces
    (``\\x1c``-``\\x1f`` among them), 133,485 word characters. A negation of the ASCII reading
    would take them in, which Python's ``\\D \\S \\W`` leave out."""
    rx, ascii_chars = re.compile("\\" + letter), set(_shorthand_chars(letter, False))
    return frozenset(c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF
                     and chr(c) not in ascii_chars and rx.match(chr(c)))


@_lru_cache(maxsize=8)
def _unicode_extra_body(letters: str) -> str:
    """``_unicode_extra`` of each letter, together, as a class body of ranges."""
    return _runs_body(sorted(set().union(*(_unicode_extra(letter) for letter in letters))))


_EVERY_CHAR = None


@_lru_cache(maxsize=64)
def _python_folded_class(cls: str, ascii_only: bool, offset: int) -> str:
    """The characters Python's ``re`` matches with the class ``cls`` under ``re.IGNORECASE``
    (and ``re.ASCII``), exactly, as a class (negated where that is shorter)."""
    global _EVERY_CHAR
    if _EVERY_CHAR is None:
        _EVERY_CHAR = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    try:
        rx = re.compile(cls, re.IGNORECASE | (re.ASCII if ascii_only else 0))
    except re.error as exc:  # ('[\\d-z]': a range from a shorthand)
        raise RegexDialectError(f"regex: does not compile with Python re: {exc} (the class at offset {offset})") from exc
    members = {ord(c) for c in rx.findall(_EVERY_CHAR)}
    if not members:
        raise RegexDialectError(f"regex: the class at offset {offset} matches no character")
    others = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c not in members]
    if not others:
        return _ANY_CHAR
    if len(others) < len(members):
        return "[^" + _runs_body(others) + "]"
    return "[" + _runs_body(sorted(members)) + "]"


def _runs_body(code_points: list[int]) -> str:
    """Sorted code points as a class body, consecutive ones as ranges."""
    runs: list[list[int]] = []
    for cp in code_points:
        if runs and runs[-1][1] == cp - 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    return "".join(class_literal(chr(a)) + ("" if a == b else ("" if b == a + 1 else "-") + class_literal(chr(b)))
                   for a, b in runs)


def _code_point_escape(pattern: str, i: int, surrogate: bool = False) -> tuple[str, int]:
    """The character of the ``\\uXXXX`` or ``\\UXXXXXXXX`` escape at ``i``, and its length; a
    surrogate (U+D800-U+DFFF) is refused unless ``surrogate``."""
    size = 6 if pattern[i + 1] == "u" else 10
    digits = pattern[i + 2 : i + size]
    if not re.fullmatch(r"[0-9a-fA-F]+", digits) or len(digits) != size - 2:
        raise RegexDialectError(f"regex: escape '\\{pattern[i + 1]}' at offset {i} needs exactly {size - 2} hex digits")
    code = int(digits, 16)
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF and not surrogate:
        raise RegexDialectError(f"regex: escape '{pattern[i:i + size]}' at offset {i} is not a Unicode scalar value")
    return chr(code), size


# the code points no output under a grammar holds: the surrogates (UTF-8 has none) and
# U+100000-U+10FFFF (index_markers.py), as sorted (lo, hi) ranges
_NEVER_GENERATED = ((0xD800, 0xDFFF), (0x100000, 0x10FFFF))


def _generable_class(cls: str, offset: int) -> str:
    """The class ``cls`` (translated, Python dialect, no categories) over the code points a grammar
    generates: ``[\\x00-\\U0010FFFF]`` stops at U+FFFFF, a negated class no longer lists the
    surrogates or U+100000-U+10FFFF (as the EBNF path reads classes, ebnf.py). Exact on every
    output a grammar can write: the class matches the same such characters, so the regex does
    too (and its complement, where a pattern is read negatively). ``cls`` itself when it names
    none of them; ``RegexDialectError`` when it matches no character a grammar generates."""
    named = any(0xD800 <= ord(c) <= 0xDFFF or ord(c) >= 0x100000 for c in cls)
    if not named and not (cls.startswith("[^") and any(ord(c) > 0xFFFF for c in cls)):
        return cls  # (a negated class can only leave nothing out naming a code point past U+FFFF)
    try:
        parsed = list(_sre_parse.parse(cls))
    except re.error:  # (a range out of order: the pattern's check names it)
        return cls
    if len(parsed) != 1 or parsed[0][0] not in (_sre_constants.IN, _sre_constants.LITERAL, _sre_constants.NOT_LITERAL):
        return cls
    op, arg = parsed[0]  # (a class of one member parses as a literal, or a negated one)
    members = arg if op is _sre_constants.IN else [(_sre_constants.LITERAL, arg)] if op is _sre_constants.LITERAL \
        else [(_sre_constants.NEGATE, None), (_sre_constants.LITERAL, arg)]
    negated, ranges = False, []
    for op, arg in members:
        if op is _sre_constants.NEGATE:
            negated = True
        elif op is _sre_constants.LITERAL:
            ranges.append((arg, arg))
        elif op is _sre_constants.RANGE:
            ranges.append(arg)
        else:  # (a category: the translation writes shorthands out)
            return cls
    kept: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        pieces = [(lo, hi)]
        for a, b in _NEVER_GENERATED:
            pieces = [p for x, y in pieces for p in (((x, y),) if y < a or x > b else ((x, a - 1), (b + 1, y)))
                      if p[0] <= p[1]]
        kept += pieces
    covered = _merged(kept + list(_NEVER_GENERATED))
    if not kept and not negated or negated and covered == [(0, 0x10FFFF)]:
        raise RegexDialectError(
            f"regex: the class at offset {offset} matches no character a grammar generates (only surrogates, which "
            "UTF-8 text never holds, or code points of U+100000-U+10FFFF, which are reserved: index_markers.py)")
    if not named:
        return cls
    if negated and not kept:
        return "(?:[^\\n]|\\n)"  # any character
    return "[" + ("^" if negated else "") + "".join(
        class_literal(chr(a)) if a == b else f"{class_literal(chr(a))}-{class_literal(chr(b))}" for a, b in kept) + "]"


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


# the largest count of a user's regex (``{m,n}``): past the 1,000 of a JSON Schema pattern, since the
# lazy token index builds a count in linear time and refuses past its state cap by name
# ('[^"]{1,60000}' builds in 0.3 s, '[^"]{1,100000}' is a 400 at once)
MAX_USER_COUNT = 1_000_000


def _python_octal(pattern: str, i: int, in_class: bool) -> tuple[str, int] | None:
    """The octal escape at ``pattern[i]`` (a backslash) as Python's ``re`` reads it: ``\\0``
    and up to two more octal digits anywhere, three octal digits ``\\101`` outside a class (fewer
    are a group reference there), one to three inside one. ``(character, length)``, or None where
    it is no octal escape; ``RegexDialectError`` past ``\\377``, as in Python."""
    digits = pattern[i + 1:i + 4]
    if in_class or digits[:1] == "0":
        m = re.match(r"0[0-7]{0,2}" if digits[:1] == "0" else r"[0-7]{1,3}", digits)
    else:
        m = re.fullmatch(r"[0-7]{3}", digits)
    if m is None:
        return None
    value = int(m.group(), 8)
    if value > 0o377:
        raise RegexDialectError(f"regex: octal escape value '\\{m.group()}' at offset {i} is outside the range 0-0o377")
    return chr(value), 1 + len(m.group())


def _ends_with_anchor(pattern: str) -> bool:
    """Whether ``pattern`` ends in an unescaped ``$`` (an even run of backslashes before it)."""
    if not pattern.endswith("$"):
        return False
    k = len(pattern) - 1
    while k > 0 and pattern[k - 1] == "\\":
        k -= 1
    return (len(pattern) - 1 - k) % 2 == 0


def translate_regex(pattern: str) -> str:
    """A user's regex written in the dialect (the module docstring): ``\\d`` as ``[0-9]``,
    ``.`` as ``[^\\n]``, escaped punctuation as its literal; ``ValueError`` naming the first
    construct outside it. Linear in the pattern, unlike ``validate_regex``.

    Matching is whole-string, so a ``^`` that starts the pattern and a ``$`` that ends it
    are no-ops, as in outlines and xgrammar (the pattern means what ``re.fullmatch`` does
    with them), as are ``\\A`` and ``\\Z``; anchors anywhere else are refused. Leading flags
    ``(?i)`` (``(?ai)``, ``(?s)``, ``(?m)``, ``(?x)``) are read as Python reads them."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("regex: the pattern is empty")
    flags = ""
    while m := _FLAG_GROUP.match(pattern):  # Python's global flags, '(?i)', only at the start
        if m.group(3) != ")" or m.group(2) is not None or not m.group(1):
            break
        if "L" in m.group(1):
            raise RegexDialectError("regex: the flag 'L' (locale-dependent) is not supported")
        flags += m.group(1)
        pattern = pattern[m.end():]
    if "x" in flags:
        pattern = _unverbose(pattern)
    cuts = top_level_cuts(pattern) or []  # '^yes$|^no$': each branch's own anchors are no-ops too
    bounds = [-1, *cuts, len(pattern)]
    pattern = "|".join(_unanchored(pattern[a + 1:b]) for a, b in zip(bounds, bounds[1:]))
    if not pattern:
        raise ValueError("regex: the pattern matches only the empty string")
    from treadle.constrained.regex import regex_whole  # (it reads regex_ecma.py, which imports this file)

    if regex_whole.has_assertions(pattern):  # lookarounds, '\\b': an automaton without them, exactly
        out = regex_whole.whole_regex(pattern, flags)
    else:
        out = _scan(pattern, ecma=False, flags=flags)  # (it names what the dialect refuses first)
        plain = flags.replace("x", "")  # (the pattern is already unverbosed)
        try:  # a regex Python refuses ('[\\d-z]': a bad range) matches nothing there: refuse it here too
            try:
                re.compile((f"(?{plain})" if plain else "") + pattern)
            except re.error:  # (the dialect also takes .NET's named groups, '(?<name>...)')
                re.compile((f"(?{plain})" if plain else "") + regex_whole.ecma._unnamed(pattern))
        except re.error as exc:
            raise RegexDialectError(f"regex: does not compile with Python re: {exc}") from exc
        except RecursionError as exc:
            raise RegexDialectError("regex: its groups nest too deeply to parse") from exc
    try:
        re.compile(out)
    except re.error as exc:
        raise RegexDialectError(f"regex: does not compile with Python re: {exc}") from exc
    except RecursionError as exc:  # (re's parser recurses per group: some hundreds of levels)
        raise RegexDialectError("regex: its groups nest too deeply to parse") from exc
    return out


def _unanchored(branch: str) -> str:
    """One top-level branch of a whole-string regex without the anchors at its ends: '^' or
    '\\A' starting it, '$' or '\\Z' (or '\\z') ending it, unescaped."""
    if branch.startswith("^"):
        branch = branch[1:]
    elif branch.startswith("\\A"):
        branch = branch[2:]
    if _ends_with_anchor(branch):
        branch = branch[:-1]
    elif re.search(r"(?<!\\)(?:\\\\)*\\[Zz]\Z", branch):  # an unescaped '\Z' (or '\z') ends it
        branch = branch[:-2]
    return branch


def _unverbose(pattern: str) -> str:
    """``pattern`` under the verbose flag 'x' without what that flag ignores: whitespace and
    ``#`` comments outside classes (an escaped space or '#' is kept, as the literal). As in
    Python's re, whitespace inside ``{2, 3}`` makes the braces text (``\\{2,3\\}``), and a
    quantifier after a quantifier and a gap (``a+ ?``) is an error, not a lazy one."""
    out: list[str] = []
    i, n, in_class, gap = 0, len(pattern), False, False
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            gap = False
            continue
        if in_class:
            in_class = ch != "]" or (bool(out) and out[-1] in ("[", "[^"))
        elif ch == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                gap = False
                continue
        elif ch in " \t\n\r\f\v":
            i += 1
            gap = True
            continue
        elif ch == "#":
            end = pattern.find("\n", i)
            i = n if end < 0 else end + 1
            gap = True
            continue
        elif ch in "*+?{}":
            m = re.match(r"\{[0-9]*(?:,[0-9]*)?\}", pattern[i:]) if ch == "{" else None
            quantifier = ch in "*+?" or m is not None
            if quantifier and gap and out and (out[-1] in ("*", "+", "?") or out[-1][:1] == "{" and out[-1][-1:] == "}"):
                raise RegexDialectError(f"regex: multiple repeat at offset {i} (under the flag 'x' a gap keeps a "
                                        "'?' from making the quantifier before it lazy, as in Python's re)")
            piece = m.group() if m else ch if quantifier else "\\" + ch  # (braces of no count: the text)
            out.append(piece)
            i += len(m.group()) if m else 1
            gap = False
            continue
        out.append(ch)
        i += 1
        gap = False
    return "".join(out)


def validate_regex(pattern: str) -> str:
    """``translate_regex``, then interegular's parse of the translation (which takes seconds
    to minutes on a pattern of thousands of alternatives: the compile worker runs it).
    Returns the translation; raises ``ValueError`` naming the problem."""
    out = translate_regex(pattern)
    try:
        interegular.parse_pattern(out).to_fsm()
    except Exception as exc:  # interegular raises several unrelated exception types
        raise RegexDialectError(f"regex: interegular cannot parse it: {exc}") from exc
    return out


def pattern_to_body(pattern: str, subset: bool = False) -> str:
    """Translate a JSON Schema (ECMA-262, unanchored search) ``pattern`` to a string body.

    The result matches the characters between the quotes of a JSON string, every one of
    which satisfies ``pattern``. Raises ``RegexDialectError`` when it cannot be sound.
    """
    anchored_start = pattern.startswith("^")
    anchored_end = _ends_with_anchor(pattern)
    core = pattern[1 if anchored_start else 0 : len(pattern) - 1 if anchored_end else len(pattern)]
    if (anchored_start or anchored_end) and has_top_level_alternation(core):
        raise RegexDialectError("pattern: anchors with a top-level '|' bind to one branch only; wrap it in a group")
    if not core:
        translated = ""
    else:
        translated = _scan(core, ecma=True, subset=subset)
        try:
            re.compile(translated)
        except re.error as exc:  # e.g. a class range out of order ("[_-.]"): the schema's, a 400
            raise RegexDialectError(f"pattern: {exc}") from exc
        # The narrowed pattern must never emit a raw character that JSON has to escape.
        verdict = _tree_verdict(translated)
        if verdict is None:  # (a text the lazy index's parser does not read: interegular's DFA)
            fsm = interegular.parse_pattern(translated).to_fsm()
            safe = interegular.parse_pattern(SAFE_RAW_CHAR + "*").to_fsm()
            verdict = (not fsm.empty(), not (fsm - safe).empty())
        matches, unsafe = verdict
        if unsafe:
            raise RegexDialectError("pattern: can match characters that JSON must escape (quote, backslash, control)")
        if not matches:
            raise RegexDialectError("pattern: matches no string")
    left = "" if anchored_start else SAFE_RAW_CHAR + "*"
    right = "" if anchored_end else SAFE_RAW_CHAR + "*"
    return left + (f"(?:{translated})" if translated else "") + right


# the code points SAFE_RAW_CHAR leaves out, as sorted (lo, hi) ranges
_UNSAFE_RANGES = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))


def _tree_verdict(translated: str) -> tuple[bool, bool] | None:
    """(whether ``translated`` matches some string, whether one of its strings holds a character
    JSON must escape), read off its parse tree in time linear in the pattern; None where the lazy
    index's parser (lazy_index.parse_regex) does not read it. The same verdicts as interegular's
    ``fsm.empty()`` and ``(fsm - SAFE_RAW_CHAR*).empty()``, without building the DFA, which is
    exponential in a pattern like ``(a|b)*a(a|b){30}`` (2^31 states: a JSON schema holding it ran
    into the compile timeout while the same regex as a ``regex`` constraint compiled at once).

    A character is in some string of the language exactly when it is in a literal that is live:
    the root is live when its language is not empty; a branch of a live alternation when its own
    is not; an item of a live sequence always (all of them are non-empty then); the body of a
    live repetition when it may repeat at least once and its language is not empty."""
    from treadle.constrained.index.lazy_index import LazyUnsupported, parse_regex

    try:
        tree = parse_regex(translated)
    except (LazyUnsupported, RecursionError):
        return None
    nonempty: dict[int, bool] = {}

    def full(node: tuple) -> bool:
        hit = nonempty.get(id(node))
        if hit is not None:
            return hit
        kind = node[0]
        if kind == "lit":
            out = bool(node[1])
        elif kind == "seq":
            out = all(full(n) for n in node[1])
        elif kind == "alt":
            out = any([full(n) for n in node[1]])  # (every branch's verdict kept for the walk)
        elif kind == "rep":
            out = node[2] == 0 or full(node[1])
        else:  # an ordered-members node: not in a pattern's text
            raise LazyUnsupported(kind)
        nonempty[id(node)] = out
        return out

    seen: dict[int, bool] = {}

    def unsafe(node: tuple) -> bool:  # ``node`` live (which it is wherever it stands, if anywhere)
        hit = seen.get(id(node))
        if hit is not None:
            return hit
        kind = node[0]
        if kind == "lit":
            out = any(lo <= b and a <= hi for lo, hi in node[1] for a, b in _UNSAFE_RANGES)
        elif kind == "seq":
            out = any(unsafe(n) for n in node[1])
        elif kind == "alt":
            out = any(unsafe(n) for n in node[1] if full(n))
        else:  # "rep"
            out = node[3] != 0 and full(node[1]) and unsafe(node[1])
        seen[id(node)] = out
        return out

    try:
        if not full(tree):
            return False, False
        return True, unsafe(tree)
    except (LazyUnsupported, RecursionError):
        return None


# `^ATOM QUANT?$`: one character (a class, an escape, `.` or a literal), repeated
_ONE_CHAR_RUN_RE = re.compile(r"\^((?:\[(?:\\.|[^\]\\])+\]|\\.|[^\\^$.|?*+()\[\]{}]|\.))"
                              r"([*+?]|\{[0-9]+(?:,[0-9]*)?\})?\$")


_WHOLE_GROUP_RE = re.compile(r"\^\((?:\?:)?([^()|]*)\)\$")


def pattern_with_length(pattern: str, min_length: int, max_length: int | None) -> str | None:
    """A string body for ``pattern`` and ``minLength``/``maxLength`` together, when the pattern
    is one character repeated over the whole string (``^[A-Z0-9]+$``, ``^\\d{3,}$``, as
    Pydantic's ``constr(pattern=..., max_length=...)`` writes it): the repetition bounds
    and the length bounds intersect. None for any other pattern (where counting characters
    across the pattern is beyond a regex). Raises ValueError when the two never meet."""
    m = _ONE_CHAR_RUN_RE.fullmatch(pattern)
    group = _WHOLE_GROUP_RE.fullmatch(pattern)
    if m is None and group is not None:  # ^([a-z]*)$ is ^[a-z]*$ (one group, no alternation: exact)
        m = _ONE_CHAR_RUN_RE.fullmatch("^" + group.group(1) + "$")
    if m is None:
        return None
    atom, quant = m.group(1), m.group(2) or "{1}"
    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(quant, (None, None))
    if lo is None:
        a, _, b = quant[1:-1].partition(",")
        lo, hi = int(a), (int(a) if not _ else int(b) if b else None)
    lo = max(lo, min_length)
    hi = max_length if hi is None else hi if max_length is None else min(hi, max_length)
    if hi is not None and hi < lo:
        raise ValueError(f"the pattern's {quant} repetition and the length bounds {min_length}..{max_length} "
                         "never meet")
    if lo > MAX_MIN_LENGTH:
        raise ValueError(f"minLength {lo} exceeds the supported {MAX_MIN_LENGTH}")
    try:
        one = pattern_to_body("^" + atom + "$", subset=True)  # checked and made JSON-safe as any pattern
    except RegexDialectError:
        # (a class holding '"', '\\' or a control: its other characters, regex_ecma's subset reading)
        from treadle.constrained.regex.regex_ecma import pattern_subset_body

        one = "(?:" + pattern_subset_body("^" + atom + "$") + ")"
    if hi is None:
        return f"{one}{{{lo},}}"
    hi = min(hi, max(lo, MAX_REPEAT) if lo <= MAX_REPEAT else lo + MAX_REPEAT)  # (as string_regex: fewer, sound)
    return f"{one}{{{lo}}}" if hi == lo else f"{one}{{{lo},{hi}}}"


def bounded_repetitions(body: str, most: int) -> str:
    """``body`` (a translated regex) with every unbounded repetition bounded: ``*`` is
    ``{0,most}``, ``+`` is ``{1,most}``, ``{n,}`` is ``{n,n+most}``. Its strings are some of
    ``body``'s (a subset: sound wherever ``body`` is), now of bounded length."""
    return reshaped_repetitions(body, 0, most, cap_counted=False)


def reshaped_repetitions(body: str, least: int, most: int | None, cap_counted: bool = True,
                         loops: bool = True, optional: bool = True, only: int | None = None) -> str:
    """``body`` (a translated regex) with every repetition's range narrowed toward
    ``least..most`` repetitions: ``*`` is ``{least,most}``, ``+`` ``{max(1,least),most}``,
    ``?`` is required once ``least`` is 1 or more, ``{m,}`` is ``{a,a+most}`` with ``a =
    max(m, least)``, and (``cap_counted``) ``{m,n}`` is ``{a,min(n, max(a, most))}`` with
    ``a = max(m, min(least, n))``; ``most`` None leaves upper bounds as they are. Without
    ``loops``, only counted ``{m,n}`` change (``*``, ``+``, ``?``, ``{m,}`` stay); without
    ``optional``, ``?`` is ``{0}`` (the part left out) where ``least`` is 0. With ``only``, the
    ``only``-th quantifier of ``body`` alone (counted from 0 in the order written,
    ``quantifier_sites`` lists them) changes; the others stay as written.

    Each new range lies inside the old one, and concatenation, alternation and repetition
    are monotone, so the result's strings are some of ``body``'s (sound wherever ``body``
    is). Raising ``least`` lengthens the shortest strings (for a minLength), lowering
    ``most`` shortens the longest (for a maxLength)."""
    return _reshaped(body, least, most, cap_counted, loops, optional, only)[0]


def _reshaped(body: str, least: int, most: int | None, cap_counted: bool, loops: bool, optional: bool,
              only: int | None) -> tuple[str, list[int]]:
    """``reshaped_repetitions``' text, and where each quantifier of ``body`` starts."""
    assert most is None or most >= least
    out, i, sites = [], 0, []

    def counted(lo: int, top: int | None) -> str:
        if top is None:
            return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
        return f"{{{lo}}}" if top == lo else f"{{{lo},{top}}}"

    while i < len(body):
        c = body[i]
        if c == "\\":
            out.append(body[i:i + 2])
            i += 2
            continue
        if c == "[":  # a class: copied whole (its * and + are characters)
            j = i + 1
            if j < len(body) and body[j] == "^":
                j += 1
            if j < len(body) and body[j] == "]":
                j += 1
            while j < len(body) and body[j] != "]":
                j += 2 if body[j] == "\\" else 1
            out.append(body[i:j + 1])
            i = j + 1
            continue
        if c == "(" and body.startswith("(?:", i):  # a group's '?' is no quantifier
            out.append("(?:")
            i += 3
            continue
        quantifier = _QUANTIFIER.match(body, i)
        if quantifier:
            sites.append(i)
            if only is not None and len(sites) - 1 != only:  # another quantifier: as written
                out.append(quantifier.group(0))
                i = quantifier.end()
                continue
        if c in "*+?" and not loops:
            out.append(c)
        elif c == "{" and not loops and re.match(r"\{\d+,\}", body[i:]):
            out.append(c)
        elif c == "*":
            out.append(counted(least, most))
        elif c == "+":
            lo = max(1, least)
            out.append(counted(lo, None if most is None else max(most, lo)))
        elif c == "?":
            out.append("" if least >= 1 else "?" if optional else "{0}")
        elif c == "{" and (m := re.match(r"\{(\d+)(,(\d*))?\}", body[i:])):
            lo, comma, hi = int(m.group(1)), m.group(2), m.group(3)
            if not comma:  # {m}: exactly m
                out.append(m.group(0))
            elif not hi:  # {m,}
                a = max(lo, least)
                out.append(counted(a, None if most is None else a + most))
            elif cap_counted:
                n = int(hi)
                a = max(lo, min(least, n))
                top = n if most is None else min(n, max(a, most))
                out.append(f"{{{a}}}" if top == a else f"{{{a},{top}}}")
            else:
                out.append(m.group(0))
            i += m.end()
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out), sites


# a quantifier of a translated regex, where one stands (outside classes, not a group's "(?")
_QUANTIFIER = re.compile(r"[*+?]|\{\d+(?:,\d*)?\}")


def quantifier_sites(body: str) -> list[int]:
    """Where each quantifier of ``body`` (a translated regex) starts, in the order written:
    ``reshaped_repetitions``' ``only`` indexes this list."""
    return _reshaped(body, 0, None, True, True, True, None)[1]


def has_top_level_alternation(core: str) -> bool:
    """Whether ``core`` has a ``|`` outside every group and class."""
    return "|" in core and bool(top_level_cuts(core))


def top_level_cuts(core: str) -> list[int] | None:
    """The positions of the ``|`` in ``core`` outside every group and class, or None where a
    ``)`` closes a group opened before ``core``."""
    cuts, depth, i, in_class = [], 0, 0, False
    while i < len(core):
        c = core[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return None
        elif c == "|" and depth == 0:
            cuts.append(i)
        i += 1
    return cuts


# ---------------------------------------------------------------- Unicode property escapes
# ECMA-262 (u flag) general categories, long names to short ones; a one-letter name is a group
_CATEGORY_NAMES = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M", "Combining_Mark": "M",
    "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me", "Number": "N", "Decimal_Number": "Nd",
    "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P", "punct": "P",
    "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps", "Close_Punctuation": "Pe",
    "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf", "Other_Punctuation": "Po", "Symbol": "S",
    "Math_Symbol": "Sm", "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z",
    "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C", "Control": "Cc",
    "cntrl": "Cc", "Format": "Cf", "Private_Use": "Co",
}
_CATEGORIES = frozenset(
    "L LC Lu Ll Lt Lm Lo M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl Zp C Cc Cf Co".split())
# A property class is written over the code points up to this one (Basic Latin to Latin
# Extended-B: the letters of European languages): a subset of what it matches, of a size the
# automata handle cheaply (all of \p{L} is
# 130k characters, which interegular expands one by one: seconds a parse).
PROPERTY_WINDOW = 0x24F


def _property_escape_size(pattern: str, i: int) -> int:
    """The length of the ``\\p{..}`` / ``\\P{..}`` escape at ``i``."""
    end = pattern.find("}", i)
    if pattern[i + 2 : i + 3] != "{" or end < 0:
        raise RegexDialectError(f"regex: escape '\\{pattern[i + 1]}' at offset {i} needs a braced property name "
                                "(ECMA-262 writes \\p{L})")
    return end + 1 - i


def _property_test(escape: str, offset: int) -> Any:
    """``escape`` (``\\p{L}``, ``\\P{Lu}``, ``\\p{General_Category=Letter}``) as a test of a
    code point's category; ``RegexDialectError`` for a property treadle does not know (scripts,
    binary properties but ASCII / Any / Assigned)."""
    name = escape[3:-1]
    if "=" in name:
        kind, _, name = name.partition("=")
        if kind not in ("General_Category", "gc"):
            raise RegexDialectError(f"regex: Unicode property '{escape}' at offset {offset} is not supported "
                                    "(general categories only, as \\p{L}, and ASCII / Any / Assigned)")
    name = _CATEGORY_NAMES.get(name, name)
    if name in _POSIX_ASCII:  # not ECMA's: read by their printable ASCII members (a subset)
        members = _POSIX_ASCII[name]
        test = lambda cp, cat: chr(cp) in members  # noqa: E731
        test.narrow = True  # type: ignore[attr-defined]
        return test
    if name in ("ASCII", "Any", "Assigned"):
        limit = 0x80 if name == "ASCII" else 0x110000
        return lambda cp, cat: cp < limit
    if name not in _CATEGORIES:
        raise RegexDialectError(f"regex: Unicode property '{escape}' at offset {offset} is not supported "
                                "(general categories only, as \\p{L}, and ASCII / Any / Assigned)")
    if name == "LC":
        return lambda cp, cat: cat in ("Lu", "Ll", "Lt")
    return (lambda cp, cat: cat[0] == name) if len(name) == 1 else (lambda cp, cat: cat == name)


_ASCII_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Names the regex module (and POSIX classes) know but ECMA-262 does not, by their printable ASCII
# members as the regex module reads them (each a subset of its members: a negation would not be)
_POSIX_ASCII = {
    "Graph": "".join(chr(c) for c in range(0x21, 0x7F)),
    "Print": "".join(chr(c) for c in range(0x20, 0x7F)),
    "Alnum": "0123456789" + _ASCII_LETTERS,
    "Alpha": _ASCII_LETTERS,
    "Upper": _ASCII_LETTERS[:26],
    "Lower": _ASCII_LETTERS[26:],
    "Digit": "0123456789",
    "XDigit": "0123456789ABCDEFabcdef",
    "Punct": "!\"#%&'()*,-./:;?@[\\]_{}",
    "Space": " ",
    "Blank": " ",
    "Word": "0123456789" + _ASCII_LETTERS + "_",
}


@_lru_cache(maxsize=1)
def _stable_window() -> list[tuple[int, str]]:
    """(code point, category) of the characters a property class may write: raw in a JSON
    string (not a control, quote or backslash), at most ``PROPERTY_WINDOW``, and assigned
    with the same category in Unicode 3.2 (``unicodedata.ucd_3_2_0``) and in this Python's
    data, so a validator of any Unicode version since reads the class as treadle does."""
    out = []
    for cp in range(0x20, PROPERTY_WINDOW + 1):
        ch = chr(cp)
        cat = _unicodedata.category(ch)
        if ch in '"\\' or cat == "Cn" or _unicodedata.ucd_3_2_0.category(ch) != cat:
            continue
        out.append((cp, cat))
    return out


def _literal_brackets(items: str) -> str:
    """A class body with each unescaped ``[``, ``|``, ``&`` and ``~`` escaped: literals in ECMA's
    classes (no v flag), which Python reads as literals too but warns that a later version may
    read ``[`` as a nested set and ``||`` ``&&`` ``~~`` as set operations."""
    out, escaped = [], False
    for ch in items:
        out.append("\\" + ch if ch in "[|&~" and not escaped else ch)
        escaped = ch == "\\" and not escaped
    return "".join(out)


def _property_class(text: str, properties: list[str], body: str | None, negated: bool, subset: bool,
                    offset: int, raw_rest: str = "") -> str:
    """A class holding Unicode property escapes (``[\\p{L}\\p{N}_.-]``, ``\\P{C}``) of a string
    value's pattern, listed over ``_stable_window``: a subset of what it matches.

    A positive class is the union of its properties and its other items (``body``, their
    translation: the ASCII reading of shorthands, a subset; negated shorthands, with ``body``
    None, left out: a smaller union). A negated one holds the window's characters that are in
    none of its properties and that Python's Unicode-wide reading of its other items
    (``raw_rest``, a superset of ECMA's) leaves out. Key patterns (patternProperties,
    propertyNames) are read exactly and refuse it."""
    if not subset:
        raise RegexDialectError(f"regex: Unicode property escape '{properties[0]}' at offset {offset} is supported "
                                "in a string value's pattern only (not in patternProperties or propertyNames)")
    tests = [(_property_test(p, offset), p[1] == "P") for p in properties]
    if any(getattr(test, "narrow", False) and (neg or negated) for test, neg in tests):
        raise RegexDialectError(f"regex: Unicode property '{properties[0]}' at offset {offset} is read by its ASCII "
                                "members only, which a negation would not leave out")
    try:
        items = raw_rest if negated else body
        rest = re.compile("[" + _literal_brackets(items) + "]") if items else None
    except re.error as exc:
        raise RegexDialectError(f"pattern: the class at offset {offset}: {exc}") from exc
    members = []
    for cp, cat in _stable_window():
        inside = any(test(cp, cat) != neg for test, neg in tests) or bool(rest and rest.fullmatch(chr(cp)))
        if inside != negated:
            members.append(cp)
    if not members:
        raise RegexDialectError(f"regex: the class {text!r} at offset {offset} matches no character treadle writes")
    runs: list[list[int]] = []
    for cp in members:
        if runs and runs[-1][1] == cp - 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    return "[" + "".join(class_literal(chr(a)) + ("" if a == b else ("" if b == a + 1 else "-") + class_literal(chr(b)))
                         for a, b in runs) + "]"

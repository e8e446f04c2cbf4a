"""URIs of other shapes, for a URI format under a pattern that its usual subset misses.

treadle writes ``format: uri`` (and iri, uri-reference, iri-reference) as a subset of RFC 3986:
``scheme://host...`` (regex_text.FORMATS). A pattern can ask for URIs of another shape, the
``scheme:path`` form with no ``//`` authority: URNs (CycloneDX's BOM-Link,
``^urn:cdx:<uuid>/<version>#<ref>$`` under ``iri-reference``), ``mailto:``, ``tag:``. Intersected
with the subset, such a pattern leaves nothing, and the schema was refused as unsatisfiable ("no
'iri-reference' string matches it") though every ``urn:`` string of its pattern is a valid IRI.

``wider_uri_format`` is the subset with that form added (RFC 3986 section 3: ``scheme ":"``
then path-rootless or path-absolute, a query and a fragment, of the same characters as the
subset's), tried only where the usual subset meets no string of the pattern: a schema the
subset serves is written as before; ``widest_uri_format`` adds ',' and ';' to those paths
(a ``data:`` URI's ``;base64,``), tried last.

``uris_by_scheme`` writes a pattern that fixes the scheme (``^https://``, ``^mailto:``) as the
URIs of those schemes that lie inside it, bounded under a maxLength; ``narrow_uris_by_scheme``
narrower ones (lowercase hosts, a few plain segments) where the usual subset's product with
the pattern is too long to write (``^s3://[a-z0-9.-]+(/.*)?$``).

Importing this module does not import torch.
"""

from __future__ import annotations

import re
from typing import Any

import interegular

from treadle.constrained.regex import regex_text as text
from treadle.constrained.regex.fsm_regex import forced_prefix

__all__ = ["HIERARCHICAL_SCHEMES", "narrow_uris_by_scheme", "uris_by_scheme", "wider_uri_format", "widest_uri_format"]

_PCHAR = r"(?:[a-zA-Z0-9._~!$&'()*+=:@-]|%[0-9a-fA-F]{2})"
# scheme ":" ["/"] segment-nz *("/" segment) ["?" query] ["#" fragment]: a segment-nz first, so
# never "//" (an authority, which the usual subset writes)
_SCHEME = r"[a-zA-Z][a-zA-Z0-9+.-]{0,15}"


def _no_authority_tail(pchar: str) -> str:
    return rf":/?{pchar}+(?:/{pchar}*)*(?:\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?"


_NO_AUTHORITY_TAIL = _no_authority_tail(_PCHAR)
_NO_AUTHORITY = _SCHEME + _NO_AUTHORITY_TAIL
_WIDENED = frozenset({"uri", "iri", "uri-reference", "iri-reference"})
# the same with RFC 3986's sub-delimiters ',' and ';' in its path (``data:image/png;base64,...``)
_NO_AUTHORITY_DELIMS = _SCHEME + _no_authority_tail(r"(?:[a-zA-Z0-9._~!$&'()*+,;=:@-]|%[0-9a-fA-F]{2})")
# schemes whose URIs have an authority (``scheme://host``), as the usual subset writes them
HIERARCHICAL_SCHEMES = ("https", "http", "ftp", "sftp", "ftps", "ws", "wss", "git", "ssh", "s3", "file")
# narrower shapes of both forms, whose products with a pattern stay short to write: a host of
# plain lowercase labels ending in a top-level domain of letters and up to 5 plain path segments;
# a path of up to 6 plain parts joined by ':', '/' or '@' (``mailto:a.b@c.org``, ``urn:isbn:0451``)
_NARROW_AFTER_SCHEME = r"://[a-z0-9]{1,20}(?:[.-][a-z0-9]{1,20}){0,3}\.[a-z]{2,6}(?:/[a-zA-Z0-9._~-]{1,20}){0,5}/?"
_NARROW_NO_AUTHORITY = r":[a-zA-Z0-9._~-]{1,20}(?:[:/@][a-zA-Z0-9._~-]{1,20}){0,5}"
# and last, a host of one short label and a short top-level domain: for a pattern whose counted
# host treadle reads as a shorter one (the web's URL pattern's {1,256}, lowered to 4)
_TINY_AFTER_SCHEME = r"://[a-z0-9]{1,4}\.[a-z]{2,4}(?:/[a-zA-Z0-9._~-]{1,8}){0,3}/?"


def wider_uri_format(fmt: str) -> str | None:
    """The regex of ``fmt``'s usual subset or an absolute URI with no authority (every such
    string is a URI, an IRI and a reference of either); None for a format that is no URI."""
    if fmt not in _WIDENED:
        return None
    return rf"(?:{text.FORMATS[fmt]}|{_NO_AUTHORITY})"


def widest_uri_format(fmt: str) -> str | None:
    """``wider_uri_format`` with ',' and ';' also in the authority-less URIs' paths, queries and
    fragments (a ``data:`` URI's ``;base64,``); None for a format that is no URI."""
    if fmt not in _WIDENED:
        return None
    return rf"(?:{text.FORMATS[fmt]}|{_NO_AUTHORITY_DELIMS})"


def _forced_scheme(pattern_fsm: Any) -> str | None:
    """The scheme every string of the pattern's automaton starts with (``^mailto:``, ``^urn:``,
    ``^s3://``: the text it must read first, up to a ':'), or None."""
    m = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]{0,15}):", forced_prefix(pattern_fsm, 17))
    return m.group(1) if m else None


def _starts_with(pattern_fsm: Any, prefix: str) -> bool:
    """Whether the pattern's automaton can read ``prefix`` from its start (a cheap test before
    checking a scheme's URIs inside it)."""
    state = pattern_fsm.initial
    for ch in prefix:
        key = pattern_fsm.alphabet[ch]  # (anything_else's key for a character it does not list)
        state = pattern_fsm.map.get(state, {}).get(key)
        if state is None:
            return False
    return True


def _schemes(pattern_fsm: Any) -> list[str]:
    """The hierarchical schemes and the one the pattern fixes, those its strings can start with."""
    forced = _forced_scheme(pattern_fsm)
    schemes = list(HIERARCHICAL_SCHEMES) + ([forced] if forced and forced not in HIERARCHICAL_SCHEMES else [])
    return [s for s in schemes if _starts_with(pattern_fsm, s + ":")]


def _inside(rx: str, pattern_fsm: Any) -> bool:
    return (interegular.parse_pattern(rx).to_fsm() - pattern_fsm).empty()


def uris_by_scheme(pattern_fsm: Any, bounded: bool = False) -> str | None:
    """For a URI format under a pattern that fixes the scheme (``^https://``, ``^(https|http|ftp)://.+``,
    ``^mailto:``, ``^urn:``): the URIs of each scheme it takes whole, each checked inside the
    pattern (a subset of the format: their product's regex is long), as one alternation, or
    None. A hierarchical scheme's URIs are written with an authority, the one the pattern fixes
    otherwise without one (then with one, where that is not inside). ``bounded`` (a maxLength
    to fit): URIs whose lengths end, as the format's own under one (regex_text.BOUNDED_FORMATS:
    a few short host labels and path segments; a plain authority-less path), or else the narrow
    ones of ``narrow_uris_by_scheme``."""
    after = text.BOUNDED_URI_AFTER_SCHEME if bounded else text.URI_AFTER_SCHEME
    listed, other = [], []
    for s in _schemes(pattern_fsm):
        if s in HIERARCHICAL_SCHEMES:
            if _inside(s + after, pattern_fsm):
                listed.append(s)
            elif bounded and _inside(s + _NARROW_AFTER_SCHEME, pattern_fsm):
                other.append(s + _NARROW_AFTER_SCHEME)  # (its product under lengths takes seconds)
            continue
        for rx in (s + (_NARROW_NO_AUTHORITY if bounded else _NO_AUTHORITY_TAIL), s + after):
            if _inside(rx, pattern_fsm):
                other.append(rx)
                break
    parts = (["(?:" + "|".join(listed) + ")" + after] if listed else []) + other
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def narrow_uris_by_scheme(pattern_fsm: Any, write: Any) -> str | None:
    """For a URI format whose product with the pattern is too long to write (``^s3://[a-z0-9.-]+(/.*)?$``,
    the web's ``^https?://(www\\.)?[-a-zA-Z0-9@:%._\\+~#=]{1,256}\\.[a-zA-Z0-9()]{1,6}\\b...``):
    for each scheme the pattern can start with, its narrow URIs (plain lowercase hosts, few
    plain segments; a plain authority-less path for a scheme not hierarchical) where they lie
    inside the pattern, else their product with it where ``write`` (fsm_to_regex) can write it;
    as one alternation, or None."""
    parts = []
    if _starts_with(pattern_fsm, "zz:"):  # (no scheme fixed, as in an unanchored example\.com: none fit)
        return None
    for s in _schemes(pattern_fsm):
        tails = ((_NARROW_AFTER_SCHEME, _TINY_AFTER_SCHEME) if s in HIERARCHICAL_SCHEMES
                 else (_NARROW_NO_AUTHORITY, _NARROW_AFTER_SCHEME, _TINY_AFTER_SCHEME))
        for tail in tails:
            fsm = interegular.parse_pattern(s + tail).to_fsm()
            if (fsm - pattern_fsm).empty():
                parts.append(s + tail)
                break
            try:
                out = write(fsm & pattern_fsm)
            except ValueError:
                continue
            if out is not None:
                parts.append(out)
                break
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

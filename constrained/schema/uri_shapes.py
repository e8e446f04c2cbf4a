"""URIs without an authority, for a URI format under a pattern that its usual subset misses.

treadle writes ``format: uri`` (and iri, uri-reference, iri-reference) as a subset of RFC 3986:
``scheme://host...`` (regex_text.FORMATS). A pattern can ask for URIs of another shape, the
``scheme:path`` form with no ``//`` authority: URNs (CycloneDX's BOM-Link,
``^urn:cdx:<uuid>/<version>#<ref>$`` under ``iri-reference``), ``mailto:``, ``tag:``. Intersected
with the subset, such a pattern leaves nothing, and the schema was refused as unsatisfiable ("no
'iri-reference' string matches it") though every ``urn:`` string of its pattern is a valid IRI.

``wider_uri_format`` is the subset with that form added (RFC 3986 section 3: ``scheme ":"``
then path-rootless or path-absolute, a query and a fragment, of the same characters as the
subset's), tried only where the usual subset meets no string of the pattern: a schema the
subset serves is written as before.

Importing this module does not import torch.
"""

from __future__ import annotations

from treadle.constrained.regex import regex_text as text

__all__ = ["wider_uri_format"]

_PCHAR = r"(?:[a-zA-Z0-9._~!$&'()*+=:@-]|%[0-9a-fA-F]{2})"
# scheme ":" ["/"] segment-nz *("/" segment) ["?" query] ["#" fragment]: a segment-nz first, so
# never "//" (an authority, which the usual subset writes)
_NO_AUTHORITY = (rf"[a-zA-Z][a-zA-Z0-9+.-]{{0,15}}:/?{_PCHAR}+(?:/{_PCHAR}*)*"
                 rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?")
_WIDENED = frozenset({"uri", "iri", "uri-reference", "iri-reference"})


def wider_uri_format(fmt: str) -> str | None:
    """The regex of ``fmt``'s usual subset or an absolute URI with no authority (every such
    string is a URI, an IRI and a reference of either); None for a format that is no URI."""
    if fmt not in _WIDENED:
        return None
    return rf"(?:{text.FORMATS[fmt]}|{_NO_AUTHORITY})"

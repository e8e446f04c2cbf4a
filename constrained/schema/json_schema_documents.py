"""Documents a ``$ref`` may name beyond the schema itself: json-schema.org's meta-schemas.

A schema that refers to a meta-schema (``"$ref": "http://json-schema.org/draft-07/schema#"``
for a property that holds a schema, or the 2019-09 / 2020-12 meta-schemas, which are built of
``$ref``s to their vocabularies ``meta/core``, ``meta/applicator`` ...) is resolved as every
validator resolves it, offline: jsonschema's own copies of the meta-schemas
(``jsonschema_specifications``, which jsonschema reads them from) are embedded in the document,
each under its own URI, so the refs resolve in-document (json_schema_dialects._resolve_ids)
to the very text a validator checks against.

Embedding changes no meaning: a resource identified by its URI is the same resource wherever
it stands (JSON Schema's bundling). A document of another draft than the root's is not
embedded (the root's draft could not read its identifiers), so the ref stays unresolved and is
refused by name, as a ref to any other document is.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable
from urllib.parse import urldefrag, urljoin

import jsonschema_specifications

__all__ = ["embedded", "missing_documents"]

_EMBED_KEY = "x-treadle-document-{}"  # the $defs / definitions name each embedded document gets


def missing_documents(refs: Iterable[tuple[str, str]], held: set[str] | dict, dialect: str,
                      dialect_of: Callable[[Any], str]) -> dict[str, Any]:
    """The known documents (by URI) that the ``(ref, base URI)`` pairs name and the document
    does not hold (``held``: its resources' URIs), of the root's ``dialect`` (``dialect_of``
    reads a document's; a schema naming no draft, "plain", is read as 2020-12)."""
    readable = {dialect, "2020-12"} if dialect == "plain" else {dialect}
    out: dict[str, Any] = {}
    for ref, base in refs:
        uri = urldefrag(urljoin(base, ref)).url
        if uri in held or uri in out:
            continue
        try:
            doc = jsonschema_specifications.REGISTRY.contents(uri)
        except LookupError:
            continue
        if dialect_of(doc) in readable:
            out[uri] = doc
    return out


def embedded(schema: dict, docs: dict[str, Any], dialect: str) -> dict:
    """``schema`` (a new dict) with ``docs`` added to its definitions (``$defs``; ``definitions``
    for drafts 3 to 7), each keeping the identifier it names itself by."""
    key = "definitions" if dialect in ("draft-03", "draft-04", "draft-06", "draft-07") else "$defs"
    defs = dict(schema[key]) if isinstance(schema.get(key), dict) else {}
    for doc in docs.values():
        n = len(defs)
        while _EMBED_KEY.format(n) in defs:
            n += 1
        defs[_EMBED_KEY.format(n)] = doc
    return {**schema, key: defs}

"""``iri``, ``uri-reference`` and ``iri-reference`` under a ``maxLength`` (OpenAPI's links and
``$ref``-like fields: ``{"format": "uri-reference", "maxLength": 2048}``) were 400s, though
``uri`` under one is written (http(s) URLs of bounded length). They are written as that subset
(every URI is an IRI; a reference is such a URL, a relative path of plain segments or a
fragment). Walks validate under jsonschema's format checker (rfc3987) and the lengths."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from json_checks import byte_walks
from treadle.constrained.schema.json_schema import json_schema_to_regex



def _values(schema: dict, n: int = 40) -> list:
    walks = byte_walks(json_schema_to_regex(schema), n, stop_p=0.1)
    out = [json.loads(t) for t in walks if t is not None]
    assert len(out) >= n // 2
    return out


@pytest.mark.parametrize("fmt", ["iri", "uri-reference", "iri-reference"])
@pytest.mark.parametrize("lo,hi", [(0, 2048), (1, 255), (1, 100)])
def test_uri_formats_under_lengths_are_written(fmt: str, lo: int, hi: int) -> None:
    schema = {"type": "string", "format": fmt, "minLength": lo, "maxLength": hi}
    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for value in _values(schema):
        assert check.is_valid(value) and lo <= len(value) <= hi, (fmt, value)
    rx = re.compile(json_schema_to_regex(schema))
    assert rx.fullmatch('"https://example.com/a/b"')
    if fmt != "iri":
        assert rx.fullmatch('"/docs/intro"') and rx.fullmatch('"#top"')


def test_an_openapi_link_object_compiles() -> None:
    schema = {"type": "object", "required": ["href"], "additionalProperties": False,
              "properties": {"href": {"type": "string", "format": "uri-reference", "maxLength": 2048},
                             "rel": {"type": "string", "maxLength": 40}}}
    check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for value in _values(schema, 20):
        assert check.is_valid(value), value

"""``iri``, ``uri-reference`` and ``iri-reference`` under a ``maxLength`` (OpenAPI's links and
``$ref``-like fields: ``{"format": "uri-reference", "maxLength": 2048}``) were 400s, though
``uri`` under one is written (http(s) URLs of bounded length). They are written as that subset
(every URI is an IRI; a reference is such a URL, a relative path of plain segments or a
fragment). Walks validate under jsonschema's format checker (rfc3987) and the lengths."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from treadle.constrained.index.lazy_index import LazyIndex, TokenArrays, build_nfa
from treadle.constrained.schema.json_schema import json_schema_to_regex

BYTES = TokenArrays({b: bytes([b]) for b in range(256)})


def _values(schema: dict, n: int = 40) -> list:
    index = LazyIndex(build_nfa(json_schema_to_regex(schema)), BYTES)
    rng, out = random.Random(0), []
    for _ in range(n):
        s, text = index.get_initial_state(), bytearray()
        for _ in range(400):
            allowed = [int(t) for t in index.get_allowed_tokens(s)]
            if index.is_final_state(s) and (not allowed or rng.random() < 0.1):
                break
            assert allowed, text
            text.append(rng.choice(allowed))
            s = index.get_next_state(s, text[-1])
        if index.is_final_state(s):
            out.append(json.loads(text))
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

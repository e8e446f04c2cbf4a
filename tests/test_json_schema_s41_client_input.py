"""Schemas a client may send that raised something other than a ValueError (a 5xx where the
server lets it through; a crash of an Engine caller that catches ValueError), each refused or
compiled now (helper-64's hostile inputs):

- integers past the largest double: JSON writes integers of any size and Python's json reads them
  as ints, which ``math.isfinite`` turned into doubles: ``"minimum": 1`` and 400 zeros raised
  OverflowError (bounds, ``const`` / ``enum``, ``multipleOf``). They are exact integers, and
  written as such;
- schemas nested a few hundred levels: the checks before the translation (metaschema, keyword
  values, dynamic refs) and json's own reading and writing recurse, and raised RecursionError
  (only the translation itself caught it)."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from json_checks import byte_walks

from treadle.constrained import GrammarSpec
from treadle.constrained.schema.json_schema import json_schema_to_regex

BIG = 10**400  # (a 401-digit integer: no double holds it)


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": BIG},
    {"type": "integer", "maximum": -BIG},
    {"type": "integer", "exclusiveMinimum": BIG, "maximum": BIG + 20},
    {"type": "integer", "multipleOf": 7, "minimum": BIG, "maximum": BIG + 30},
    {"type": "integer", "multipleOf": BIG},
    {"const": BIG},
    {"enum": [BIG, -BIG, 1]},
    {"oneOf": [{"const": BIG}, {"const": 1}]},
], ids=["minimum", "maximum", "exclusive", "multiple-between", "multipleOf", "const", "enum", "oneOf"])
def test_integers_past_the_largest_double_are_exact(schema):
    """(before: OverflowError: int too large to convert to float)"""
    rx = json_schema_to_regex(schema)
    check = jsonschema.Draft202012Validator(schema)
    seen = 0
    for data in byte_walks(rx, 12, seed=3, steps=2000):
        if data is not None:
            assert check.is_valid(json.loads(data)), data[:80]
            seen += 1
    assert seen
    if "const" in schema or "enum" in schema:
        assert re.fullmatch(rx, str(BIG))


def test_a_number_bound_past_the_largest_double_is_refused_by_name():
    with pytest.raises(ValueError, match="keyword 'minimum' at \\$"):
        json_schema_to_regex({"type": "number", "minimum": BIG})


def _nested(kind: str, depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        if kind == "items":
            schema = {"type": "array", "items": schema}
        elif kind == "properties":
            schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        else:
            schema = {kind: [schema]} if kind == "allOf" else {kind: schema}
    return schema


@pytest.mark.parametrize("kind,depth", [("items", 400), ("properties", 240), ("allOf", 300), ("not", 400)])
def test_a_schema_nested_too_deeply_is_a_value_error(kind, depth):
    """(before: RecursionError from the metaschema / keyword / dynamic-ref checks)"""
    schema = _nested(kind, depth)
    with pytest.raises(ValueError, match="schema nests too deeply to convert"):
        json_schema_to_regex(schema)
    with pytest.raises(ValueError, match="schema nests too deeply to convert"):
        GrammarSpec.from_params(json_schema=schema).to_regex(holes=True)


@pytest.mark.parametrize("given", ["dict", "text"])
def test_a_request_schema_too_deep_for_json_itself_is_a_value_error(given):
    """GrammarSpec.from_params reads and writes the schema with json, which recurses: 3,000
    levels (a dict) or 5,000 (a JSON text) raised RecursionError where the request is read."""
    schema = _nested("items", 3000) if given == "dict" else '{"items":' * 5000 + "{}" + "}" * 5000
    with pytest.raises(ValueError, match="schema nests too deeply to convert"):
        GrammarSpec.from_params(json_schema=schema)


@pytest.mark.parametrize("regex", ["(" * 600 + "a" + ")" * 600, "(?:a|" * 2000 + "b" + ")" * 2000])
def test_a_regex_nested_too_deeply_is_a_value_error(regex):
    """(before: RecursionError from Python's re parser, which translate_regex asks whether the
    translation compiles; 400 levels still compile)"""
    with pytest.raises(ValueError, match="groups nest too deeply to parse"):
        GrammarSpec.from_params(regex=regex).to_regex()
    assert GrammarSpec.from_params(regex="(" * 400 + "a" + ")" * 400).to_regex()


def test_a_structural_tag_too_deep_for_json_is_a_value_error():
    """(before: RecursionError from json.dumps writing the tag's canonical form)"""
    tag = {"structures": [{"begin": "<a>", "schema": _nested("items", 3000), "end": "</a>"}], "triggers": ["<a>"]}
    with pytest.raises(ValueError, match="nests too deeply"):
        GrammarSpec.from_params(structural_tag=tag)

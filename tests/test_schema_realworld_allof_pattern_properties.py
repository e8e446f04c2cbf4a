"""An allOf whose parts split an object's keywords: one part's ``additionalProperties`` and the
other's ``patternProperties`` (an OpenAPI-style base with ``additionalProperties: {type:
string}`` and an extension part allowing ``^x-`` keys of any value). Merged into one object, the
patterns took their keys out of the first part's ``additionalProperties``, which in that part
still governs them: ``{"x-a": 1}`` was written though the first part refuses it (a random
schema fuzz found it, jsonschema rejecting the walk's output). A part's patterns now carry the
other part's ``additionalProperties`` beside them (a key matching them is under both, as it is
in the parts)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from treadle.constrained.schema.json_schema import json_schema_to_regex

from json_checks import byte_walks

BASE = {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": {"type": "string"}}
EXT = {"type": "object", "patternProperties": {"^x-": {}}}

CASES = [
    ({"allOf": [BASE, EXT]}, ['{"name":"a"}', '{"x-a":"s"}', '{"name":"a","x-b":"t"}'], ['{"x-a":1}', '{"x-a":null}']),
    ({"allOf": [EXT, BASE]}, ['{"x-a":"s"}'], ['{"x-a":1}', '{"x-":[]}']),
    ({"allOf": [{"type": "object", "additionalProperties": False}, EXT]}, ["{}"], ['{"x-a":1}', '{"x-a":"s"}']),
    # the fuzz's schema: the first part's extra keys are integers, the second's ^x keys strings
    ({"anyOf": [{"allOf": [
        {"type": "object", "properties": {"p0": {"type": "number"}}, "additionalProperties": {"type": "integer"}},
        {"type": "object", "properties": {"p0": {"type": "integer"}, "p1": {"type": "integer", "exclusiveMaximum": 100}},
         "required": ["p0", "p1"], "additionalProperties": True, "patternProperties": {"^x": {"type": "string"}}}]}]},
     ['{"p0":1,"p1":2}'], ['{"p0":-10,"p1":0,"x1":"8"}', '{"p0":1,"p1":2,"xy":"s"}']),
]


@pytest.mark.parametrize("schema,valid,invalid", CASES)
def test_patterns_of_one_part_stay_under_the_others_additional_properties(schema: dict, valid: list,
                                                                          invalid: list) -> None:
    rx = re.compile(json_schema_to_regex(schema))
    check = jsonschema.Draft202012Validator(schema)
    for t in valid:
        assert check.is_valid(json.loads(t)) and rx.fullmatch(t), t
    for t in invalid:
        assert not check.is_valid(json.loads(t)) and not rx.fullmatch(t), t
    texts = [t for t in byte_walks(rx.pattern, 60, seed=5, steps=300, by_state=True) if t is not None]
    assert len(texts) >= 20
    for t in texts:
        assert check.is_valid(json.loads(t)), t

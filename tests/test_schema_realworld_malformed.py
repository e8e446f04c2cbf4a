"""Malformed schemas (a keyword's value of a kind no draft allows, as hand-written or generated
schemas hold by mistake) raised TypeError / AttributeError / OverflowError / jsonschema's
UnknownType out of the converter, which the server answers with a 500. Each is now a ValueError
naming the keyword and where it is (a 400), found by mutating real schemas at random; the forms
of older drafts still read (draft-03's ``required: true``, schemas in its ``type`` lists)."""

from __future__ import annotations

import pytest

from treadle.constrained.schema.json_schema import json_schema_to_regex


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "string", "pattern": {"$ref": "#"}}, "pattern"),
    ({"type": "string", "pattern": 10**30}, "pattern"),
    ({"type": "object", "properties": -0.0, "allOf": [{"if": {"properties": {"a": {"const": True}}, "required": ["a"]},
                                                       "then": {"required": ["b"]}}]}, "properties"),
    ({"type": "string", "format": [{"type": "integer"}], "pattern": "^2024-"}, "format"),
    ({"type": [None], "enum": ["a", 1, "b"]}, "type"),
    ({"const": {"a": 1}, "type": "#/$defs/x"}, "type"),
    ({"type": 1e308, "const": 1}, "type"),
    ({"type": "object", "properties": {"a": -1}, "required": ["a"]}, "$.properties.a"),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "$id": [None]}, "$id"),
    ({"type": "object", "properties": {"email": {"type": "string"}}, "oneOf": [{"required": ["email"]}],
      "required": 10**30}, "required"),
    ({"const": 1.5e300, "minimum": "#/$defs/x"}, "minimum"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "if": {"type": "integer"}, "then": {"minimum": 5},
      "else": {"type": [{"type": "integer"}]}}, "type"),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": -1, "properties": {"a": {}},
      "dependencies": {"a": ["b"]}}, "type"),
    ({"const": {"a": [1, 2]}, "$ref": {"a": 1}}, "$ref"),
    ({"type": "array", "items": {"enum": [1, True], "exclusiveMaximum": "x"}}, "exclusiveMaximum"),
    ({"enum": ["a", "b"], "minLength": "x"}, "minLength"),
    ({"enum": [1, "1", None], "dependentRequired": None}, "dependentRequired"),
    ({"allOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}], "maxLength": [1, "a"]}, "maxLength"),
    ({"type": "object", "properties": {"card": {}}, "dependentRequired": {"card": ["b"]}, "required": False}, "required"),
    ({"const": 12345678901234567890, "multipleOf": 0}, "multipleOf"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}, "minContains": 10**30}, "minContains"),
])
def test_malformed_keywords_are_refused_by_name(schema: dict, keyword: str) -> None:
    with pytest.raises(ValueError, match=keyword.replace("$", r"\$")):
        json_schema_to_regex(schema)
    with pytest.raises(ValueError, match=keyword.replace("$", r"\$")):
        json_schema_to_regex(schema, holes=True, members=True)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string", "required": True}}},
    {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object",
     "properties": {"a": {"type": "object", "required": True, "properties": {"b": {"required": True}}}}},
    {"$schema": "http://json-schema.org/draft-03/schema#", "type": ["string", {"type": "integer"}]},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0, "exclusiveMinimum": True},
    {"type": "array", "items": [{"type": "integer"}], "additionalItems": False},
    {"type": "string", "title": 5, "examples": "x", "deprecated": "yes", "x-custom": {"type": 3}},
    {"$defs": {"note": "not a schema, never referenced"}, "type": "integer"},
    {"type": "array", "minItems": 2.0, "items": {"type": "integer"}},
])
def test_forms_of_the_drafts_and_annotations_still_compile(schema: dict) -> None:
    json_schema_to_regex(schema)

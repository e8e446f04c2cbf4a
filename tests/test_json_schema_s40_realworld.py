"""Real schemas from installed packages (session 40's corpus: openai's types and what its
``.parse()`` sends, FastAPI's OpenAPI document, huggingface_hub's inference types, AWS SAM's
pydantic models, cfn-lint's template schemas, openapi-spec-validator's OpenAPI 2.0-3.2 schemas,
rustc's target spec): the refusals and acceptances it found wrong, each failing before its fix."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from json_checks import byte_walks

from treadle.constrained.schema.json_schema import json_schema_to_regex

CODE = "^[1-5](?:[0-9]{2}|XX)$"
# openapi-spec-validator's OpenAPI 3.2 schema, its Responses Object (the response shortened):
# "either default, or at least one response code property must exist", an if/then beside
# unevaluatedProperties whose 'if' names only the status-code pattern the object names itself
RESPONSES = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {"extensions": {"patternProperties": {"^x-": True}},
              "response": {"type": "object", "properties": {"description": {"type": "string", "maxLength": 8}},
                           "required": ["description"], "additionalProperties": False}},
    "type": "object",
    "properties": {"default": {"$ref": "#/$defs/response"}},
    "patternProperties": {CODE: {"$ref": "#/$defs/response"}},
    "minProperties": 1,
    "$ref": "#/$defs/extensions",
    "unevaluatedProperties": False,
    "if": {"$comment": "either default, or at least one response code property must exist",
           "patternProperties": {CODE: False}},
    "then": {"required": ["default"]},
}


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_an_if_that_evaluates_nothing_new_beside_unevaluated_properties_compiles(mode):
    """(before: "keyword 'if' ... beside unevaluatedProperties is not supported")"""
    rx = re.compile(json_schema_to_regex(RESPONSES, mode=mode))
    check = jsonschema.Draft202012Validator(RESPONSES)
    assert rx.fullmatch('{"default":{"description":"ok"}}')  # (strict: the declared members only)
    for bad in ('{}', '{"404":{}}', '{"600":{"description":"x"}}'):
        assert not check.is_valid(json.loads(bad)) and not rx.fullmatch(bad), bad
    if mode == "spec":  # extensions too (a status-code member is not written: "some member is a
        # status code", the 'else' side, has no rewrite; leaving it out only narrows)
        assert rx.fullmatch('{"default":{"description":"ok"},"x-a":1}')
        assert not rx.fullmatch('{"x-a":1}')  # no code and no default: 'then' requires default
        assert not rx.fullmatch('{"default":{"description":"ok"},"zz":1}')  # unevaluated
    seen = 0
    for data in byte_walks(rx.pattern, 60, seed=2, by_state=True):
        if data is not None:
            value = json.loads(data)
            assert check.is_valid(value), data
            seen += 1
    assert seen > 20


@pytest.mark.parametrize("extra", [
    {"if": {"properties": {"other": {"type": "string"}}}, "then": {"required": ["default"]}},  # a name not its own
    {"if": {"patternProperties": {"^y-": False}}, "then": {"required": ["default"]}},  # a pattern not its own
    {"if": {"additionalProperties": False}, "then": {"required": ["default"]}},  # evaluates every member
], ids=["name", "pattern", "additional"])
def test_an_if_that_evaluates_more_is_still_refused_beside_unevaluated_properties(extra):
    schema = {**{k: v for k, v in RESPONSES.items() if k not in ("if", "then")}, **extra}
    with pytest.raises(ValueError, match="keyword 'if' at .* beside unevaluatedProperties is not supported"):
        json_schema_to_regex(schema, mode="spec")

"""Keywords of real schemas that treadle refused and now enforces or reads as the standard says
(issue 31, the corpus tally of benchmarks/schema_refusals.py). Each case is a real schema from
the corpus (CloudFormation resource schemas as cfn-lint ships them, SchemaStore's) or a minimal
extract of one; its outputs (random walks of the regex, and of the compiled grammar with the
embedded tokenizer) must validate under the schema's own draft (``validator_for``), whose
``pattern`` is read by the ``regex`` module where Python's ``re`` cannot read it (``\\p{L}``)."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import regex as ecma_re
from json_checks import compiled_walks
from test_json_schema_patterns import random_strings

from treadle.constrained.schema.json_schema import UnsupportedSchemaError, drop_unenforceable, json_schema_to_regex
from treadle.constrained.regex.regex_text import PROPERTY_WINDOW



def _pattern(validator, patrn, instance, schema):  # noqa: ANN001 - jsonschema's keyword signature
    if validator.is_type(instance, "string") and not ecma_re.search(patrn, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")


def checker(schema: dict):  # noqa: ANN201
    """The schema's own draft validator, formats checked, ``pattern`` read with Unicode properties."""
    cls = jsonschema.validators.extend(jsonschema.validators.validator_for(schema), {"pattern": _pattern})
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def body_strings(pattern: str, n: int = 80, **lengths: int) -> list[str]:
    rx = json_schema_to_regex({"type": "string", "pattern": pattern, **lengths})
    assert rx.startswith('"') and rx.endswith('"')
    return random_strings(rx[1:-1], n)


# ------------------------------------------------------------------ \p{..} property classes

@pytest.mark.parametrize("pattern, lengths", [
    ("^([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)$", {"minLength": 1, "maxLength": 128}),  # CloudFormation tags, names
    ("^[\\p{L}\\p{N}][\\p{L}\\p{N}\\p{M}\\p{S}\\p{P} ]*$", {}),
    ("^\\p{Lu}{2,5}$", {}),
    ("^[^\\p{L}]+$", {}),                     # negated class: no letter of any script
    ("^\\P{C}+$", {}),                        # AWS's "printable" reading
    ("^[^\\s\\p{N}]*$", {"maxLength": 10}),   # negated with a shorthand: read wide, then left out
    ("^\\p{General_Category=Letter}+\\d$", {}),
])
def test_property_classes_are_written_as_a_subset(pattern: str, lengths: dict) -> None:
    strings = body_strings(pattern, **lengths)
    for s in strings:
        assert ecma_re.search(pattern, s), (pattern, s)
        assert lengths.get("minLength", 0) <= len(s) <= lengths.get("maxLength", 10**9), (pattern, s)
        assert re.fullmatch(r'[^"\\\x00-\x1f]*', s), s
    wide = [c for s in strings for c in s if ord(c) > 0x7F]
    assert wide and max(map(ord, wide)) <= PROPERTY_WINDOW, (pattern, strings[:5])  # not ASCII alone


def test_negated_property_classes_leave_out_every_member() -> None:
    for pattern, member in [("^[^\\p{L}]*$", "é"), ("^[^\\p{L}]*$", "ж"), ("^\\P{N}*$", "٣"), ("^\\P{N}*$", "7")]:
        rx = re.compile(json_schema_to_regex({"type": "string", "pattern": pattern}))
        assert not rx.fullmatch(json.dumps(member, ensure_ascii=False)), (pattern, member)


@pytest.mark.parametrize("schema, keyword, what", [
    ({"type": "string", "pattern": "^[\\p{Script=Latin}]+$"}, "pattern", "Script=Latin"),
    ({"type": "string", "pattern": "^\\P{Graph}+$"}, "pattern", "Graph"),   # not ECMA; negated: its ASCII reading is narrow
    ({"type": "string", "pattern": "^\\pL+$"}, "pattern", "braced"),
])
def test_property_escapes_treadle_cannot_write_are_refused_by_name(schema: dict, keyword: str, what: str) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_regex(schema)
    assert f"keyword '{keyword}'" in str(info.value) and what in str(info.value), str(info.value)
    rewritten, dropped = drop_unenforceable(schema)  # the lenient opt-in drops it, and says so
    assert [d["keyword"] for d in dropped] == [keyword]


# AWS::FMS::ApplicationsList (cfn-lint's schema), cut to one app list: \p{..} under lengths
FMS_APPS = {
    "type": "object", "additionalProperties": False, "required": ["ListName", "AppsList"],
    "definitions": {"App": {"type": "object", "additionalProperties": False,
                            "required": ["AppName", "Protocol", "Port"],
                            "properties": {"AppName": {"type": "string", "minLength": 1, "maxLength": 128},
                                           "Protocol": {"type": "string", "minLength": 1, "maxLength": 20},
                                           "Port": {"type": "integer", "minimum": 0, "maximum": 65535}}},
                    "Tag": {"type": "object", "additionalProperties": False, "required": ["Key", "Value"],
                            "properties": {"Key": {"type": "string", "minLength": 1, "maxLength": 128,
                                                   "pattern": "^([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)$"},
                                           "Value": {"type": "string", "minLength": 0, "maxLength": 256,
                                                     "pattern": "^([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)$"}}}},
    "properties": {"ListName": {"type": "string", "minLength": 1, "maxLength": 128,
                                "pattern": "^([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)$"},
                   "AppsList": {"type": "array", "items": {"$ref": "#/definitions/App"}, "maxItems": 3},
                   "Tags": {"type": "array", "items": {"$ref": "#/definitions/Tag"}, "maxItems": 2}},
}


def test_cloudformation_property_patterns_compile_and_walks_validate(smol) -> None:  # noqa: ANN001
    assert compiled_walks(smol, FMS_APPS, checker(FMS_APPS), walks=4, steps=200, seed=7) >= 2


# ------------------------------------------------------------------ oneOf told apart by keys

def _walks_validate(schema: dict, n: int = 60, seed: int = 0) -> re.Pattern:
    from json_checks import byte_walks

    rx = json_schema_to_regex(schema)
    compiled, check, seen = re.compile(rx), checker(schema), 0
    # walks of the lazy byte automaton, each also matched by Python's re (interegular's whole
    # DFA of the overlapping oneOf took ~18 s)
    for data in byte_walks(rx, n, seed=seed, by_state=True):
        if data is not None:
            text = data.decode()
            assert compiled.fullmatch(text), text
            value = json.loads(text)
            assert check.is_valid(value), (text, next(iter(check.iter_errors(value))).message)
            seen += 1
    assert seen
    return compiled


def _closed(key: str, value: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "properties": {key: value}, "required": [key]}


# AWS::QBusiness::Plugin's AuthConfiguration (cfn-lint): one closed object per auth kind
QBUSINESS_AUTH = {
    "type": "object",
    "definitions": {"Basic": {"type": "object", "additionalProperties": False, "required": ["SecretArn", "RoleArn"],
                              "properties": {"SecretArn": {"type": "string", "maxLength": 8},
                                             "RoleArn": {"type": "string", "maxLength": 8}}},
                    "OAuth2": {"type": "object", "additionalProperties": False, "required": ["SecretArn"],
                               "properties": {"SecretArn": {"type": "string", "maxLength": 8}}},
                    "NoAuth": {"type": "object", "additionalProperties": False}},
    "properties": {"AuthConfiguration": {"oneOf": [
        _closed("BasicAuthConfiguration", {"$ref": "#/definitions/Basic"}),
        _closed("OAuth2ClientCredentialConfiguration", {"$ref": "#/definitions/OAuth2"}),
        _closed("NoAuthConfiguration", {"$ref": "#/definitions/NoAuth"})]}},
    "required": ["AuthConfiguration"], "additionalProperties": False,
}


def test_oneof_of_closed_objects_each_requiring_its_own_key_is_enforced() -> None:
    rx = _walks_validate(QBUSINESS_AUTH)
    for kind in ("BasicAuthConfiguration", "OAuth2ClientCredentialConfiguration", "NoAuthConfiguration"):
        # walks from several seeds: one seed's 30 walks missed a branch once (set order varies by run)
        assert any(kind in t for seed in range(1, 9) for t in random_strings(rx.pattern, 30, seed=seed)), kind


@pytest.mark.parametrize("branches", [
    # not closed: {"a": .., "b": ..} is valid under both
    [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
     _closed("b", {"type": "integer"}), _closed("c", {"type": "integer"})],
    # closed, but a pattern of the first lets "b" in
    [{"type": "object", "additionalProperties": False, "patternProperties": {"^[ab]$": {}}, "required": ["a"]},
     {"type": "object", "additionalProperties": False, "properties": {"a": {}, "b": {}}, "required": ["b"]},
     _closed("c", {"type": "integer"})],
])
def test_oneof_whose_branches_may_overlap_is_not_read_as_anyof(branches: list) -> None:
    schema = {"oneOf": branches}
    try:
        _walks_validate(schema)
    except UnsupportedSchemaError as exc:
        assert "keyword 'oneOf'" in str(exc)


def test_oneof_of_closed_untyped_branches_writes_no_value_two_branches_take() -> None:
    # closed but untyped: a string is valid under every branch, so under none of the oneOf
    schema = {"oneOf": [{"additionalProperties": False, "properties": {k: {}}, "required": [k]} for k in "abc"]}
    try:
        rx = re.compile(json_schema_to_regex(schema))
    except UnsupportedSchemaError as exc:
        assert "keyword 'oneOf'" in str(exc)
        return
    for text in ('"x"', "1", "null", "[]"):
        assert not rx.fullmatch(text), text


# ------------------------------------------------------------------ $schema: the "latest" URI

def test_unversioned_metaschema_uri_is_read_as_a_schema_naming_none() -> None:
    # SchemaStore schemas write "http://json-schema.org/schema#" (the latest draft, as
    # jsonschema's validator_for reads it): read as with no $schema, not refused
    schema = {"$schema": "http://json-schema.org/schema#", "type": "object", "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer", "minimum": 1}},
              "required": ["name"]}
    rx = _walks_validate(schema)
    assert rx.fullmatch('{"name":"ab","n":2}') and not rx.fullmatch('{"name":"ab","n":0}')
    with pytest.raises(UnsupportedSchemaError, match="'\\$schema'"):
        json_schema_to_regex({**schema, "$schema": "http://json-schema.org/draft-02/schema#"})


# ------------------------------------------------------------------ formats real schemas assert

@pytest.mark.parametrize("fmt, invalid", [
    ("uri-reference", "a b"), ("iri-reference", "\\\\x"), ("iri", "no scheme"), ("regex", "(unclosed"),
])
def test_uri_reference_iri_and_regex_formats_are_written_as_subsets(fmt: str, invalid: str) -> None:
    # SchemaStore's $schema / $ref / homepage strings (format uri-reference), mergify's regexes
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"],
              "additionalProperties": False}
    assert not checker(schema).is_valid({"v": invalid})  # the format is checked by the validator
    rx = _walks_validate(schema, n=80)
    assert not rx.fullmatch(json.dumps({"v": invalid}, separators=(",", ":")))


# ------------------------------------------------------------------ patterns that hung the translation

@pytest.mark.timeout(120)  # the old translation built these automata for minutes (2^count subsets)
@pytest.mark.parametrize("schema", [
    # AWS::Batch::JobQueue: unanchored, a count past 1000 (lowered to 256) after a padded start
    {"pattern": "arn:[a-z0-9-\\.]{1,63}:[a-z0-9-\\.]{0,63}:[a-z0-9-\\.]{0,63}:[a-z0-9-\\.]{0,63}:[^/].{0,1023}"},
    # AWS::SageMaker::CodeRepository: a loop, then a long count it overlaps
    {"pattern": "^https://([^/]+)/?.{3,1016}$", "minLength": 1, "maxLength": 1024},
])
def test_patterns_whose_automata_exploded_are_written_as_a_subset(schema: dict) -> None:
    rx = json_schema_to_regex({"type": "string", **schema})
    for s in random_strings(rx[1:-1], 40):
        assert re.search(schema["pattern"], s), s
        assert schema.get("minLength", 0) <= len(s) <= schema.get("maxLength", 10**9)

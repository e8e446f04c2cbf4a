"""Real-world schemas: annotations of any name, every draft's spellings, and the assertion
keywords json_schema_logic.py rewrites (dependencies, if/then/else, not, contains), each
checked sound by random strings of the compiled regex validated by the schema's own draft
validator (jsonschema's ``validator_for``, formats checked)."""

from __future__ import annotations

import json
import random
import re

import interegular
import jsonschema
import pytest
from json_checks import sample_regex

from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"


def walks_validate(schema: dict, *, n: int = 40, also: tuple = (), own: bool = True, mode: str = "strict",
                   seed: int = 0) -> re.Pattern:
    """Compile ``schema``, check ``n`` random strings of its regex are JSON valid under its own
    draft (unless ``own`` is False: 2020-12 cannot read list ``items``) and under each
    validator class in ``also``; return the compiled regex."""
    pattern = json_schema_to_regex(schema, mode=mode)
    fsm = interegular.parse_pattern(pattern).to_fsm()
    checker = jsonschema.FormatChecker()
    validators = [jsonschema.validators.validator_for(schema)(schema, format_checker=checker)] if own else []
    validators += [cls(schema, format_checker=checker) for cls in also]
    rng = random.Random(seed)
    seen = 0
    for _ in range(n):
        text = sample_regex(fsm, rng)
        if text is None:
            continue
        value = json.loads(text)
        for v in validators:
            assert v.is_valid(value), (text, type(v).__name__, next(iter(v.iter_errors(value))).message)
        seen += 1
    assert seen, "no walk finished"
    return re.compile(pattern)


def test_unknown_keywords_of_any_name_are_annotations() -> None:
    # what the issue's real schemas held: vendor metadata, editor hints, typos, OpenAPI extras
    schema = {"id": "https://x/y.json", "self": {"vendor": "acme", "name": "e", "version": "1-0-0"},
              "type": "object", "desciption": "typo", "markdownDescription": "**m**",
              "properties": {"a": {"type": "string", "esriDocumentation": {}, "readonly": True, "_format": "x",
                                   "x-go-type": "string", "nullable": False},
                             "b": {"type": "array", "items": {"type": "integer"}, "_uniqueItems": True}},
              "required": ["a"], "additionalProperties": False}
    rx = walks_validate(schema)
    assert rx.fullmatch('{"a":"x","b":[1,2]}')


def test_format_no_validator_checks_is_an_annotation() -> None:
    rx = walks_validate({"type": "object", "properties": {"n": {"type": "integer", "format": "int32"},
                                                           "s": {"type": "string", "format": "byte"}},
                         "required": ["n", "s"]})
    assert rx.fullmatch('{"n":5,"s":"anything"}')
    # a format a validator checks is enforced, not an annotation
    assert not re.fullmatch(json_schema_to_regex({"type": "string", "format": "idn-hostname"}), '"a b"')


def test_draft4_spellings() -> None:
    schema = {"$schema": D4, "id": "http://x/s.json", "type": "object",
              "definitions": {"pos": {"type": "number", "minimum": 0, "exclusiveMinimum": True}},
              "properties": {"p": {"$ref": "#/definitions/pos"},
                             "t": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}],
                                   "additionalItems": False, "minItems": 2},
                             "c": {"const": 5, "type": "integer"}},  # const is no draft-04 keyword
              "required": ["p", "t", "c"], "dependencies": {"c": ["p"]}}
    rx = walks_validate(schema)
    assert not rx.fullmatch('{"p":0,"t":["a",1],"c":5}')  # exclusive minimum
    assert rx.fullmatch('{"p":1,"t":["a",1],"c":6}')  # const ignored
    assert not rx.fullmatch('{"p":1,"t":["a",1,2],"c":6}')  # additionalItems false


def test_without_schema_old_spellings_mean_the_old_thing() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "dependencies": {"a": ["b"]}}
    rx = walks_validate(schema, also=(jsonschema.Draft7Validator,))
    assert not rx.fullmatch('{"a":1}') and rx.fullmatch('{"a":1,"b":2}') and rx.fullmatch('{"b":2}')
    # 2020-12 has no reading of list items (its validator fails on them): draft-07's is the one
    t = walks_validate({"type": "array", "items": [{"type": "boolean"}], "additionalItems": {"type": "null"},
                        "maxItems": 3}, own=False, also=(jsonschema.Draft7Validator,))
    assert t.fullmatch("[true,null]") and not t.fullmatch("[true,1]")
    lo = walks_validate({"type": "number", "minimum": 2, "exclusiveMinimum": True, "maximum": 3},
                        also=(jsonschema.Draft4Validator,))
    assert not lo.fullmatch("2") and lo.fullmatch("2.5")


def test_draft7_ref_overrides_its_siblings_and_2019_applies_them() -> None:
    defs = {"s": {"type": "string"}}
    d7 = walks_validate({"$schema": D7, "definitions": defs, "$ref": "#/definitions/s", "maxLength": 1})
    assert d7.fullmatch('"long"')  # maxLength beside $ref: ignored in draft-07
    d19 = walks_validate({"$schema": D2019, "$defs": defs, "$ref": "#/$defs/s", "maxLength": 1})
    assert not d19.fullmatch('"long"') and d19.fullmatch('"l"')
    plain = walks_validate({"definitions": defs, "$ref": "#/definitions/s", "maxLength": 1},
                           also=(jsonschema.Draft7Validator,))
    assert not plain.fullmatch('"long"')  # no $schema: siblings apply (valid under both readings)


def test_pointers_follow_renamed_keywords() -> None:
    schema = {"$schema": D4, "type": "array", "items": [{"type": "integer", "maximum": 3}],
              "additionalItems": {"$ref": "#/items/0"}}
    rx = walks_validate(schema)
    assert rx.fullmatch("[1,2]") and not rx.fullmatch("[1,5]")


def test_dependent_required_and_schemas() -> None:
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "string"}}
    rx = walks_validate({"type": "object", "properties": props, "dependentRequired": {"a": ["b"]},
                         "dependentSchemas": {"c": {"required": ["a"]}}})
    assert rx.fullmatch('{"a":1,"b":2,"c":"x"}') and rx.fullmatch('{"b":2}') and rx.fullmatch("{}")
    assert not rx.fullmatch('{"a":1}') and not rx.fullmatch('{"b":2,"c":"x"}')


def test_if_then_else_is_enforced() -> None:
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
              "required": ["kind"],
              "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["n"]},
              "else": {"properties": {"n": {"maximum": 0}}}}
    rx = walks_validate(schema, n=80)
    assert rx.fullmatch('{"kind":"a","n":7}') and not rx.fullmatch('{"kind":"a"}')
    assert rx.fullmatch('{"kind":"b","n":-1}') and not rx.fullmatch('{"kind":"b","n":7}')
    typed = walks_validate({"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer"}})
    assert typed.fullmatch('"ab"') and not typed.fullmatch('"a"') and typed.fullmatch("3")
    assert not typed.fullmatch("true")


def test_not_where_the_complement_is_expressible() -> None:
    s = walks_validate({"type": "string", "maxLength": 3, "not": {"enum": ["ab", "c"]}})
    assert s.fullmatch('"abc"') and not s.fullmatch('"ab"') and not s.fullmatch('"c"')
    i = walks_validate({"type": "integer", "minimum": 0, "maximum": 4, "not": {"const": 2}})
    assert i.fullmatch("1") and not i.fullmatch("2") and not i.fullmatch("2.0")
    o = walks_validate({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}},
                        "not": {"required": ["a", "b"]}})
    assert o.fullmatch('{"a":1}') and not o.fullmatch('{"a":1,"b":null}')
    n = walks_validate({"type": "number", "not": {"minimum": 10}})
    assert n.fullmatch("9.5") and not n.fullmatch("10")


def test_format_with_pattern_intersects() -> None:
    rx = walks_validate({"type": "string", "format": "date", "pattern": "^2024-0[1-3]"})
    assert rx.fullmatch('"2024-02-29"') and not rx.fullmatch('"2023-02-28"') and not rx.fullmatch('"2024-04-01"')


def test_older_drafts_read_in_their_own_draft_stay_sound() -> None:
    # a draft-04 schema with a draft-06 keyword beside the draft-04 spelling of bounds
    schema = {"$schema": D4, "type": "object", "properties": {
        "x": {"type": "integer", "maximum": 5, "exclusiveMaximum": True, "contains": {"const": 1}},
        "y": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}}, "required": ["x", "y"]}
    rx = walks_validate(schema)
    assert not rx.fullmatch('{"x":5,"y":[]}') and rx.fullmatch('{"x":4,"y":[]}')


def test_strict_uri_takes_the_uris_real_data_holds() -> None:
    """format uri: ports, hyphenated hosts, long path segments, queries, fragments and other
    schemes; random strings of it are URIs to rfc3987 (jsonschema's uri checker)."""
    assert "uri" in jsonschema.FormatChecker().checkers, "rfc3987 (the test extra) checks format uri"
    rx = walks_validate({"type": "string", "format": "uri"}, n=300)
    for uri in ("http://mesos-master:5050", "https://example.com/a-path-segment-longer-than-twenty/x?q=1&r=%20#top",
                "ftp://files.example.org/pub", "s3://bucket/key/part", "http://10.0.0.1:8080/"):
        assert rx.fullmatch(json.dumps(uri)), uri
    for bad in ("http://a b", "mesos-master:5050", "http://", "//x"):
        assert not rx.fullmatch(json.dumps(bad)), bad


def test_unique_items_of_any_items_in_strict_mode() -> None:
    schema = {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}},
              "uniqueItems": True}
    rx = walks_validate(schema)
    assert rx.fullmatch('[{"a":"x"}]') and rx.fullmatch("[]") and not rx.fullmatch('[{"a":"x"},{"a":"x"}]')
    two = walks_validate({**schema, "minItems": 2})  # objects of 0 and 1 members: never equal
    assert two.fullmatch('[{},{"a":"x"}]') and not two.fullmatch('[{"a":"x"},{"a":"y"}]')
    with pytest.raises(UnsupportedSchemaError, match="'uniqueItems'"):  # objects of one size: no rule tells them apart
        json_schema_to_regex({**schema, "minItems": 2, "items": {**schema["items"], "required": ["a"],
                                                                 "additionalProperties": False}})


def test_min_and_max_properties_count_any_declared_property() -> None:
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "null"}}
    one = walks_validate({"type": "object", "properties": props, "minProperties": 1})
    assert one.fullmatch('{"b":1}') and one.fullmatch('{"c":null}') and not one.fullmatch("{}")
    two = walks_validate({"type": "object", "properties": props, "minProperties": 2, "maxProperties": 2})
    assert two.fullmatch('{"a":1,"c":null}') and two.fullmatch('{"b":1,"c":null}')
    assert not two.fullmatch('{"a":1,"b":1,"c":null}') and not two.fullmatch('{"a":1}')


def test_contains_with_min_and_max_contains() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}, "minContains": 2,
              "maxContains": 3}
    rx = walks_validate(schema)
    assert rx.fullmatch("[5,6]") and not rx.fullmatch("[5]") and not rx.fullmatch("[1,2]")
    assert walks_validate({"type": "array", "contains": {"const": "x"}}).fullmatch('["x"]')


def test_oneof_with_overlapping_branches_is_made_exclusive() -> None:
    props = {"a": {"type": "integer"}, "b": {"type": "string"}}
    rx = walks_validate({"type": "object", "properties": props, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]})
    assert rx.fullmatch('{"a":1}') and rx.fullmatch('{"b":"x"}') and not rx.fullmatch('{"a":1,"b":"x"}')
    nums = walks_validate({"oneOf": [{"type": "integer", "minimum": 3}, {"type": "number", "maximum": 5}]}, n=80)
    assert nums.fullmatch("7") and nums.fullmatch("2.5") and not nums.fullmatch("4")


def test_pattern_with_lengths_intersects() -> None:
    rx = walks_validate({"type": "string", "pattern": "^[a-z][a-z0-9-]*$", "minLength": 3, "maxLength": 8})
    assert rx.fullmatch('"abc"') and not rx.fullmatch('"ab"') and not rx.fullmatch('"abcdefghi"')


def test_long_max_length_bounds_the_patterns_repetitions() -> None:
    """CloudFormation's ARNs: an anchored pattern with unbounded parts under maxLength 128 is
    written with its repetitions bounded so its longest string fits (a subset of the pattern),
    in well under a second (the product automaton took 23 s)."""
    arn = {"type": "string", "maxLength": 128,
           "pattern": "^(arn:aws[-a-z]*:s3files:[0-9a-z-:]+:file-system/fs-[0-9a-f]{17,40}|fs-[0-9a-f]{17,40})$"}
    rx = walks_validate(arn)
    assert rx.fullmatch('"fs-0123456789abcdef01"')
    # unanchored: written anchored, its repetitions bounded (a subset), quickly
    walks_validate({"type": "string", "pattern": "a+b", "maxLength": 10})


def test_lenient_translation_drops_and_names() -> None:
    from treadle.constrained.schema.json_schema import drop_unenforceable

    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.3},
                                               "s": {"type": "string", "not": {"format": "email"}}},
              "required": ["n", "s"]}
    rewritten, dropped = drop_unenforceable(schema)
    assert [(d["keyword"], d["path"]) for d in dropped] == [("multipleOf", "$.properties.n"),
                                                           ("not", "$.properties.s")]
    assert json_schema_to_regex(rewritten)
    assert drop_unenforceable({"type": "integer"})[1] == []
    with pytest.raises(UnsupportedSchemaError, match="no possible output|false"):
        drop_unenforceable({"type": "object", "properties": {"a": False}, "required": ["a"]})


def test_a_pattern_python_cannot_compile_is_a_400() -> None:
    # found by the corpus run (AWS::ConnectCampaignsV2::Campaign): re.error escaped as a crash
    with pytest.raises(UnsupportedSchemaError, match="'pattern' at \\$: pattern: bad character range"):
        json_schema_to_regex({"type": "string", "pattern": "^[a-z_-.]+$"})

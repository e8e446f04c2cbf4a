"""Draft-03 schemas (issue 31): read by rewriting them into the 2020-12 spelling
(constrained/schema/json_schema_dialects.py), each keyword draft-03 spells its own way checked sound:
random strings of the compiled regex, and chosen valid and invalid instances, judged by
jsonschema's Draft3Validator (formats checked)."""

from __future__ import annotations

import json
import re

import jsonschema
import jsonschema_specifications
import pytest
from json_checks import byte_walks, compiled_walks
from test_grammar_compiler import accepts
from test_lazy_index import EOS, V

from treadle.constrained import GrammarCompiler, GrammarSpec

from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex
from treadle.constrained.schema.json_schema_dialects import dialect_of, to_2020_12

D3 = "http://json-schema.org/draft-03/schema#"


def translated(schema: dict) -> dict:
    """What ``json_schema_to_regex`` compiles of a draft-03 schema: its 2020-12 rewrite. (The
    entry's ``check_metaschemas``, in json_schema_parts.py, still refuses draft-03's URI before
    the rewrite: see ``test_the_entry_point_reads_draft3``.)"""
    return {k: v for k, v in to_2020_12({"$schema": D3, **schema}).items() if k != "$schema"}


def draft3(schema: dict) -> jsonschema.Draft3Validator:
    full = {"$schema": D3, **schema}
    return jsonschema.Draft3Validator(full, format_checker=jsonschema.Draft3Validator.FORMAT_CHECKER)


def walks3(schema: dict, valid: tuple = (), invalid: tuple = (), *, n: int = 40, seed: int = 0) -> re.Pattern:
    """Compile draft-03 ``schema``; ``n`` random strings of its regex, and each of ``valid``,
    are valid under Draft3Validator (``valid`` also matched), each of ``invalid`` is invalid
    there and not matched."""
    pattern = json_schema_to_regex(translated(schema))
    check = draft3(schema)
    rx = re.compile(pattern)
    seen = 0
    # walks of the lazy byte automaton (json_checks.byte_walks), each also matched by Python's
    # re: interegular's whole DFA of these regexes (up to ~185k characters) took ~55 s to build
    for data in byte_walks(pattern, n, seed=seed, by_state=True):
        if data is None:
            continue
        text = data.decode()
        assert rx.fullmatch(text), text
        value = json.loads(text)
        assert check.is_valid(value), (text, next(iter(check.iter_errors(value))).message)
        seen += 1
    assert seen, "no walk finished"
    for text in valid:
        assert check.is_valid(json.loads(text)) and rx.fullmatch(text), text
    for text in invalid:
        assert not check.is_valid(json.loads(text)) and not rx.fullmatch(text), text
    return rx


def test_draft3_is_a_dialect() -> None:
    assert dialect_of({"$schema": D3}) == "draft-03"
    assert dialect_of({"$schema": "http://json-schema.org/draft-03/schema"}) == "draft-03"


def test_required_is_a_boolean_in_each_property() -> None:
    schema = {"type": "object", "definitions": {"n": {"type": "number"}}, "required": True,
              "properties": {"a": {"type": "string", "required": True}, "b": {"type": "integer", "required": False},
                             "c": {"$ref": "#/definitions/n", "required": True}}}  # read beside $ref too
    walks3(schema, valid=('{"a":"x","c":1}', '{"a":"x","b":1,"c":2.5}'),
           invalid=('{"b":1,"c":1}', '{"a":"x"}', '{"a":"x","c":"y"}'))


def test_type_lists_schemas_and_any() -> None:
    union = {"type": ["integer", {"type": "string", "maxLength": 2},
                      {"type": "object", "properties": {"k": {"type": "boolean", "required": True}}}]}
    walks3(union, valid=("1", '"ab"', '{"k":true}'), invalid=('"abc"', "{}", "true", "1.5"), n=60)
    walks3({"type": "object", "properties": {"x": {"type": "any", "required": True}}},
           valid=('{"x":null}', '{"x":[1,"a"]}'), invalid=("{}", "[]"))
    walks3({"type": ["string", "any"], "maxLength": 1}, valid=("3", "null", '"a"'), invalid=('"ab"',))
    walks3({"type": ["string", "null"]}, valid=('"a"', "null"), invalid=("1",))


def test_disallow_is_none_of_its_types_and_schemas() -> None:
    schema = {"type": ["integer", "boolean", "string"], "disallow": ["string", {"type": "integer", "minimum": 5}]}
    walks3(schema, valid=("4", "true"), invalid=('"x"', "5"), n=60)
    walks3({"type": "array", "items": {"disallow": "null"}, "maxItems": 2}, valid=("[1]",), invalid=("[null]",))
    with pytest.raises(UnsupportedSchemaError):
        json_schema_to_regex(translated({"disallow": ["any"]}))  # nothing is valid


def test_extends_is_all_of_its_schemas() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}},
              "extends": [{"properties": {"a": {"minimum": 2}}},
                          {"properties": {"b": {"type": "string", "required": True}}}]}
    walks3(schema, valid=('{"a":2,"b":"x"}',), invalid=('{"a":1,"b":"x"}', '{"a":3}'))
    one = {"definitions": {"base": {"type": "object", "properties": {"id": {"type": "integer", "required": True}}}},
           "extends": {"$ref": "#/definitions/base"}, "properties": {"id": {"maximum": 9}}}
    walks3(one, valid=('{"id":9}',), invalid=('{"id":10}', "{}", '{"id":"x"}'))


def test_divisible_by_is_multiple_of() -> None:
    walks3({"type": "integer", "divisibleBy": 3, "minimum": 0, "maximum": 20}, valid=("9", "0"), invalid=("10",))


def test_a_dependency_may_be_one_property_name() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "dependencies": {"a": "b", "b": ["a"]}, "additionalProperties": False}
    walks3(schema, valid=('{"a":1,"b":2}', "{}"), invalid=('{"a":1}', '{"b":1}'))
    walks3({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependencies": {"a": {"properties": {"b": {"required": True}}}}}, valid=('{"a":1,"b":2}', '{"b":1}'),
           invalid=('{"a":1}',))


def test_later_drafts_keywords_are_annotations() -> None:
    # allOf, anyOf, oneOf, not, min/maxProperties, const ... are no draft-03 keywords
    schema = {"type": "object", "properties": {"a": {"type": "integer", "const": 4}}, "additionalProperties": False,
              "allOf": [{"required": ["a"]}], "anyOf": [{"type": "string"}], "oneOf": [{"type": "null"}],
              "not": {"type": "object"}, "minProperties": 3, "maxProperties": 0, "required": ["a"]}
    walks3(schema, valid=("{}", '{"a":1}'), invalid=('{"a":"x"}', '{"b":1}'))


def test_exclusive_bounds_and_ref_siblings() -> None:
    walks3({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1}, valid=("0.5", "1"),
           invalid=("0", "1.5"))
    schema = {"definitions": {"s": {"type": "string"}}, "type": "object",
              "properties": {"p": {"$ref": "#/definitions/s", "maxLength": 1, "required": True}}}
    walks3(schema, valid=('{"p":"long"}',), invalid=("{}", '{"p":1}'))


def test_formats_draft3_checks() -> None:
    schema = {"type": "object", "properties": {"ip": {"type": "string", "format": "ip-address", "required": True},
                                               "t": {"type": "string", "format": "time", "required": True},
                                               "c": {"type": "string", "format": "color"},
                                               "u": {"type": "string", "format": "uuid"}}}
    rx = walks3(schema, valid=('{"ip":"10.0.0.1","t":"23:59:59","c":"#a0b1c2","u":"x"}',),
                invalid=('{"ip":"x","t":"12:00:00"}', '{"ip":"1.2.3.4","t":"12:00:00Z"}'), n=60)
    # color: checked where webcolors is installed (a CSS 2.1 name or hex code): written as hex codes
    assert not rx.fullmatch('{"ip":"10.0.0.1","t":"23:59:59","c":"not a color"}')


def test_pointers_into_renamed_keywords() -> None:
    schema = {"type": "object", "extends": {"properties": {"a": {"type": "integer", "maximum": 3}}},
              "disallow": ["string", {"type": "object", "properties": {"z": {"type": "null", "required": True}}}],
              "properties": {"b": {"$ref": "#/extends/properties/a"}, "c": {"$ref": "#/disallow/1/properties/z"},
                             "d": {"type": ["boolean", {"type": "string", "maxLength": 1}]},
                             "e": {"$ref": "#/properties/d/type/1"}}}
    walks3(schema, valid=('{"b":1,"c":null,"e":"x"}',), invalid=('{"b":5}', '{"c":1}', '{"e":"xy"}', '{"e":true}', '{"z":null}'))


def grammar_checks(tok, schema: dict, valid: tuple, invalid: tuple, *, seed: int) -> None:
    """Compile draft-03 ``schema`` with treadle's GrammarCompiler (recursive refs need it): its
    random walks validate under Draft3Validator, ``valid`` are accepted, ``invalid`` refused."""
    check = draft3(schema)
    assert compiled_walks(tok, translated(schema), check, walks=8, steps=300, seed=seed) >= 3
    with GrammarCompiler(tok, [EOS], vocab_size=V, timeout_s=60) as compiler:
        g = compiler.compile(GrammarSpec.from_params(json_schema=translated(schema)))
        for text in valid:
            assert check.is_valid(json.loads(text)) and accepts(g, tok, text), text
        for text in invalid:
            assert not check.is_valid(json.loads(text)) and not accepts(g, tok, text), text


def test_a_ref_to_the_draft3_metaschema_resolves_offline(smol) -> None:
    schema = {"type": "object", "properties": {"schema": {"$ref": D3, "required": True}}, "additionalProperties": False}
    grammar_checks(smol, schema, valid=('{"schema":{"type":"string"}}', '{"schema":{"type":[{"minimum":1}]}}',
                          '{"schema":{"extends":{"type":"any"}}}'),
                   invalid=("{}", '{"schema":{"type":7}}', '{"schema":{"required":1}}'), seed=3)


def test_the_draft3_metaschema_compiles_and_its_walks_validate(smol) -> None:
    meta = jsonschema_specifications.REGISTRY.contents(D3)  # the corpus's metaschema/draft3/metaschema.json
    grammar_checks(smol, meta, valid=('{"disallow":"any","extends":[{"divisibleBy":2}]}', '{"type":"any"}',
                          '{"items":[{"type":"string"}],"additionalItems":false}'),
                   invalid=('{"divisibleBy":0}', '{"exclusiveMinimum":true}', '{"items":[{"type":1}]}'), seed=5)


def test_another_draft_below_a_draft3_root_is_refused() -> None:
    with pytest.raises(UnsupportedSchemaError, match="another draft"):
        translated({"type": "object", "properties": {"a": {"$schema": "http://json-schema.org/draft-07/schema#"}}})


def test_a_draft3_subschema_below_a_root_naming_no_draft_is_refused() -> None:
    # jsonschema reads it with Draft3Validator (validator_for of the subschema): {"a": 1} is
    # invalid there; read as 2020-12, disallow would be an annotation and 1 written
    schema = {"type": "object", "properties": {"a": {"$schema": D3, "type": ["string", "integer"], "disallow": "integer"}},
              "required": ["a"]}
    assert not jsonschema.validators.validator_for(schema)(schema).is_valid({"a": 1})
    with pytest.raises(UnsupportedSchemaError, match="another draft"):
        json_schema_to_regex(schema)


def test_the_entry_point_reads_draft3() -> None:
    rx = re.compile(json_schema_to_regex({"$schema": D3, "type": "object",
                                          "properties": {"a": {"type": "integer", "required": True}}}))
    assert rx.fullmatch('{"a":1}') and not rx.fullmatch("{}")

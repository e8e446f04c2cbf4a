"""Refs to documents beyond the schema itself (issue 31): json-schema.org's meta-schemas resolve
offline, embedded as jsonschema resolves them (constrained/schema/json_schema_documents.py), and the
dynamic refs of a document of several resources resolve where every evaluation path agrees."""
from __future__ import annotations

import re

import jsonschema
import pytest
from json_checks import compiled_walks
from test_grammar_compiler import accepts
from test_lazy_index import EOS, V

from treadle.constrained import GrammarCompiler, GrammarSpec
from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2020 = "https://json-schema.org/draft/2020-12/schema"


def checker(schema: dict):  # noqa: ANN201
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_a_property_holding_a_schema_refs_the_draft7_metaschema(smol) -> None:
    # as OpenAPI-like config schemas write it: a property whose value is itself a JSON schema
    schema = {"$schema": D7, "type": "object", "properties": {"schema": {"$ref": D7}}, "required": ["schema"],
              "additionalProperties": False}
    assert compiled_walks(smol, schema, checker(schema), walks=6, steps=300, seed=3) >= 2
    with GrammarCompiler(smol, [EOS], vocab_size=V, timeout_s=120) as compiler:
        g = compiler.compile(GrammarSpec.from_params(json_schema=schema))
        assert accepts(g, smol, '{"schema":{"type":"string"}}')
        assert not accepts(g, smol, '{"schema":{"type":7}}')  # "type" is a name or a list of names
        assert not accepts(g, smol, '{"schema":{"minLength":-1}}')  # ... minLength a non-negative integer


def test_a_metaschema_of_another_draft_stays_refused_by_name() -> None:
    # draft-07 cannot read draft-04's "id": the ref is not embedded, and is refused as another document's
    with pytest.raises(UnsupportedSchemaError, match=r"keyword '\$ref' at \$\.properties\.s"):
        json_schema_to_regex({"$schema": D7, "type": "object", "properties": {"s": {"$ref": D4}}, "required": ["s"]})


# A root and an embedded resource that both declare $dynamicAnchor "node": the embedded one's
# $dynamicRef "#node" is the root's (the outermost of every dynamic scope, as each starts at the
# root), not its own resource's, which would let a child skip the root's required "name".
TREE = {"$schema": D2020, "$id": "https://example.com/root", "$dynamicAnchor": "node", "type": "object",
        "properties": {"name": {"enum": ["a", "b"]}, "kids": {"type": "array", "items": {"$ref": "list"}, "maxItems": 1}},
        "required": ["name"], "additionalProperties": False,
        "$defs": {"list": {"$id": "https://example.com/list", "$dynamicAnchor": "node", "type": "object",
                           "properties": {"child": {"$dynamicRef": "#node"}}, "additionalProperties": False}}}


def test_dynamic_ref_of_an_embedded_resource_resolves_to_the_root() -> None:
    rx = re.compile(json_schema_to_regex(TREE))
    check = checker(TREE)
    assert rx.fullmatch('{"name":"a","kids":[{"child":{"name":"b"}}]}')
    assert not check.is_valid({"name": "a", "kids": [{"child": {}}]})
    assert not rx.fullmatch('{"name":"a","kids":[{"child":{}}]}')


def test_dynamic_ref_the_path_decides_stays_refused() -> None:
    # no anchor at the root and two resources declaring it: which one wins depends on the path
    schema = {"$schema": D2020, "$id": "https://example.com/root", "type": "object",
              "properties": {"x": {"$ref": "a"}, "y": {"$ref": "b"}},
              "$defs": {"a": {"$id": "https://example.com/a", "$dynamicAnchor": "n", "type": "object",
                              "properties": {"c": {"$ref": "b"}}},
                        "b": {"$id": "https://example.com/b", "$dynamicAnchor": "n", "type": "object",
                              "properties": {"d": {"$dynamicRef": "#n"}}}}}
    with pytest.raises(UnsupportedSchemaError, match=r"\$dynamicRef"):
        json_schema_to_regex(schema)

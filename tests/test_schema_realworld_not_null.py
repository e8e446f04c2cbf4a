"""``not: {enum: [null]}`` / ``not: {const: null}`` ("any value but null", a nullable type made
non-null) and ``not: {enum: [true, false]}`` were 400s ("no output treadle can write satisfies
it"): excluding every value of one type left the others out too. Each type whose values are all
excluded is left out, the rest written. Also: a ``const`` no value of the type satisfies is a
400 naming ``const`` (it named ``enum``)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from treadle.constrained.schema.json_schema import json_schema_to_regex


def _rx(schema: dict) -> re.Pattern:
    return re.compile(json_schema_to_regex(schema))


@pytest.mark.parametrize("schema,valid,invalid", [
    ({"not": {"enum": [None]}}, [1, "a", True, [], {}], [None]),
    ({"not": {"const": None}}, [0, "", False], [None]),
    ({"type": ["string", "null"], "not": {"enum": [None]}}, ["", "x"], [None, 1]),
    ({"not": {"enum": [True, False]}}, [None, 0, "true"], [True, False]),
    ({"not": {"enum": [None, 1, "a"]}}, [2, "b", True, {}], [None, 1, "a"]),
    ({"type": "object", "properties": {"id": {"type": ["integer", "null"], "not": {"const": None}}},
      "required": ["id"]}, [{"id": 3}], [{"id": None}, {}]),
])
def test_excluding_every_value_of_one_type_keeps_the_others(schema: dict, valid: list, invalid: list) -> None:
    rx = _rx(schema)
    check = jsonschema.Draft202012Validator(schema)
    for v in valid:
        assert check.is_valid(v) and rx.fullmatch(json.dumps(v, separators=(",", ":"))), v
    for v in invalid:
        assert not check.is_valid(v) and not rx.fullmatch(json.dumps(v, separators=(",", ":"))), v


def test_every_value_excluded_is_still_a_400() -> None:
    with pytest.raises(ValueError, match="'not'"):
        json_schema_to_regex({"type": "null", "not": {"const": None}})


def test_an_impossible_const_names_const() -> None:
    with pytest.raises(ValueError, match="keyword 'const'"):
        json_schema_to_regex({"type": "string", "const": 1})
    with pytest.raises(ValueError, match="keyword 'enum'"):
        json_schema_to_regex({"type": "string", "enum": [1, 2]})

"""``not: {contains: S}`` ("no item is S": a tag list that must not hold "deprecated") and
``not: {items: S}`` ("some item is not S") were 400s ("treadle cannot write the values it
excludes"). They are written as what they say of arrays: ``items: {not: S}`` (every item fails
S; where minContains is 0 every array holds enough, and nothing is written), and ``contains:
{not: S}`` (where no ``prefixItems`` stands beside ``items``, whose ``items`` then says only of
the later items). A non-array satisfies ``contains`` and ``items`` vacuously, so the ``not``
excludes it. Where these are written as fewer arrays than they allow (a ``contains`` as its
first items, a ``minContains: 2`` as none of the items), the ``valid`` lists below hold arrays
that are written; every array a walk writes is valid."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from treadle.constrained.schema.json_schema import json_schema_to_regex

from json_checks import byte_walks

TAGS = {"type": "string", "enum": ["stable", "beta", "deprecated"]}

CASES = [
    ({"type": "array", "items": TAGS, "not": {"contains": {"const": "deprecated"}}},
     [[], ["beta"], ["stable", "beta", "stable"]], [["deprecated"], ["beta", "deprecated"]]),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3},
      "not": {"contains": {"const": 1}, "minContains": 2}},
     [[], [0, 2, 3]], [[1, 1], [1, 0, 1]]),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 5},
      "not": {"items": {"maximum": 2}}},
     [[3], [5, 0]], [[], [0, 1, 2]]),
    ({"type": "array", "not": {"items": False}}, [[1], [None]], [[]]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": {"enum": ["a", "b"]},
      "not": {"contains": {"const": "a"}}}, [[], ["b", "b"]], [["a"], ["b", "a"]]),
    ({"not": {"contains": {"const": 0}}, "type": ["array", "string"], "items": {"type": "boolean"}},
     [[], [True]], ["x", "", [0]]),
]


@pytest.mark.parametrize("schema,valid,invalid", CASES)
def test_not_contains_and_not_items_write_what_they_say(schema: dict, valid: list, invalid: list) -> None:
    rx = re.compile(json_schema_to_regex(schema))
    check = jsonschema.validators.validator_for(schema)(schema)
    for v in valid:
        assert check.is_valid(v) and rx.fullmatch(json.dumps(v, separators=(",", ":"))), v
    for v in invalid:
        assert not check.is_valid(v) and not rx.fullmatch(json.dumps(v, separators=(",", ":"))), v
    texts = [t for t in byte_walks(rx.pattern, 40, seed=3, steps=400, by_state=True) if t is not None]
    assert len(texts) >= 10
    for t in texts:
        assert check.is_valid(json.loads(t)), t


def test_min_contains_zero_excludes_every_array() -> None:
    """``contains`` with ``minContains: 0`` holds for every array: its ``not`` holds for none."""
    with pytest.raises(ValueError, match="'not'"):
        json_schema_to_regex({"type": "array", "not": {"contains": {"const": 1}, "minContains": 0}})

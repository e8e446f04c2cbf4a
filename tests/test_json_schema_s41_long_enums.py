"""Long enums translate in work linear in their length. Every listed value is checked against the
schema it stands in (the rest may rule some out), and jsonschema's ``enum`` keyword compares a
value with each listed one in turn: an ``enum`` of 20,000 integers took 82 s to translate, a
``oneOf`` of two enums of 3,000 (each value checked against the other branch's ``not``) 8.9 s,
past the compile worker's 60 s time limit on a busy box at the first. The translator now looks
the value up (constrained/schema/listed_values.py) and has jsonschema check the rest of the
schema. The work is counted here as jsonschema's equality calls, not timed."""
from __future__ import annotations

import re

import jsonschema
import jsonschema._keywords as keywords
import pytest

from treadle.constrained.schema.json_schema import json_schema_to_regex
from treadle.constrained.schema.listed_values import ListedValues


@pytest.fixture
def equality_calls(monkeypatch):
    calls = [0]
    equal = keywords.equal

    def counted(a, b):
        calls[0] += 1
        return equal(a, b)

    monkeypatch.setattr(keywords, "equal", counted)
    return calls


@pytest.mark.parametrize("schema", [
    {"enum": list(range(3000))},
    {"type": "object", "properties": {"code": {"type": "string", "enum": [f"C{i:04d}" for i in range(3000)]}},
     "required": ["code"]},
    {"oneOf": [{"enum": list(range(1500))}, {"enum": list(range(1500, 3000))}]},
], ids=["enum", "property", "oneOf"])
def test_a_long_enum_is_not_compared_value_by_value(schema, equality_calls):
    """(before: 4.5 million comparisons for the first, 2.25 million for the oneOf)"""
    rx = json_schema_to_regex(schema)
    assert equality_calls[0] < 3000, equality_calls[0]
    probe = '{"code":"C2999"}' if "properties" in schema else "2999"
    assert re.fullmatch(rx, probe) and not re.fullmatch(rx, probe.replace("2999", "3000"))


POOL = [0, 1, 1.0, -0.0, 2.5, 10**400, True, False, None, "", "1", "a", [], [1], [1.0], [True], [[1]], {},
        {"a": 1}, {"a": 1.0}, {"a": True}, {"a": [1, {"b": None}]}, {"b": 1}]


@pytest.mark.parametrize("listed", [POOL, [1, "a", [1], {"a": 1}], [True, 0, [], {}], [1.0, [1.0, True]], []])
def test_listed_values_agree_with_jsonschema(listed):
    """ListedValues.holds gives jsonschema's verdict on the enum alone (1 and 1.0 equal, true no
    number, arrays and objects compared member by member)."""
    values = ListedValues(listed)
    check = jsonschema.Draft202012Validator({"enum": listed})
    for value in POOL:
        assert values.holds(value) == check.is_valid(value), (value, listed)

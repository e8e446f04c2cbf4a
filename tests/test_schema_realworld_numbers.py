"""Listed numbers (``const`` / ``enum``) past 2**53 given as floats (``1.5e300``, a physical
constant, a "max double" sentinel): their decimal digits alone ("15000...0") parse to an
integer, which JSON Schema's equality (exact in jsonschema: Python compares an int and a float
by value) finds different from the double, so only spellings that parse to the double may be
written (its own "1.5e+300", or the digits with a ".0"). Floats whose double is that integer
exactly (1e21, 2**60 as a float) keep their digits."""

from __future__ import annotations

import json

import jsonschema
import pytest

from json_checks import byte_walks
from treadle.constrained.schema.json_schema import json_schema_to_regex



def _texts(schema: dict, n: int = 40) -> set[str]:
    walks = byte_walks(json_schema_to_regex(schema), n)
    assert None not in walks, "a walk ended in a dead end"
    return {t.decode() for t in walks}


@pytest.mark.parametrize("schema", [
    {"const": 1.5e300},
    {"enum": [1e300, -2.5e22, "x"]},
    {"type": "number", "enum": [6.02214076e23, 1.7976931348623157e308]},
    {"type": "object", "properties": {"max": {"const": 9.9e99}}, "required": ["max"]},
])
def test_big_float_literals_are_written_as_the_double(schema: dict) -> None:
    check = jsonschema.Draft202012Validator(schema)
    texts = _texts(schema)
    for text in texts:
        assert check.is_valid(json.loads(text)), (schema, text)
    assert any("e" in t or ".0" in t for t in texts)


@pytest.mark.parametrize("value", [1e21, 2.0**53, 123456789.0, -4.0])
def test_floats_whose_double_is_the_integer_keep_their_digits(value: float) -> None:
    schema = {"const": value}
    check = jsonschema.Draft202012Validator(schema)
    texts = _texts(schema)
    assert str(int(value)) in texts
    for text in texts:
        assert check.is_valid(json.loads(text)), text

"""An unbounded JSON number was written with an exponent of up to 3 digits: ``-4.800e892`` (a
walk of a oneOf's ``{"type": "number"}`` branch) parses to -inf in Python and in JavaScript, and
jsonschema then raised OverflowError on the anyOf's ``multipleOf`` branch instead of deciding
(a random-schema fuzz found it). A number past a double's range is no value a reader can hold:
exponents are now of at most 2 digits (|x| below 1e116, and a nonzero mantissa above 1e-116),
in the regex backend's NUMBER and in the any-JSON pushdown automaton alike."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from treadle.constrained.index.json_any import JsonAnyGrammar, JsonPushdown
from treadle.constrained.schema.json_schema import json_schema_to_regex

from json_checks import byte_walks

FUZZ = {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 20, "multipleOf": 0.5},
                  {"allOf": [{"oneOf": [{"enum": ["a", True]}, {"type": "number"}]}]}]}


@pytest.mark.parametrize("schema", [{"type": "number"}, {"type": "array", "items": {"type": "number"}}, FUZZ])
def test_numbers_written_are_finite_doubles(schema: dict) -> None:
    rx = json_schema_to_regex(schema)
    for text in ("-4.800e892", "1e999", "1E+100", "1e-100"):
        assert not re.fullmatch(rx, text) and not re.fullmatch(rx, f"[{text}]"), text
    assert re.fullmatch(rx, "1e99") or re.fullmatch(rx, "[1e99]")
    check = jsonschema.Draft202012Validator(schema)
    texts = [t for t in byte_walks(rx, 200, seed=9, steps=60) if t is not None]
    assert len(texts) >= 100
    for t in texts:
        value = json.loads(t)
        for v in value if isinstance(value, list) else [value]:
            assert not isinstance(v, float) or math.isfinite(v), t
        assert check.is_valid(value), t  # (raised OverflowError on -4.800e892)


def test_the_any_json_automaton_takes_two_exponent_digits() -> None:
    table = [bytes([b]) for b in range(256)]
    table[2] = None  # the EOS id
    pda = JsonPushdown(table, len(table), len(table), (2,))
    g = JsonAnyGrammar(pda, "value")
    for text, ok in ((b"1e99", True), (b"-2.5E-12", True), (b"[1e+7]", True), (b"1e999", False),
                     (b"[-4.800e892]", False), (b"1e100", False)):
        state, stack = pda.run(g.initial, (), text)
        assert pda.is_final(state, stack) is ok, text

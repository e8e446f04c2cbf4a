"""Session 45: a bounded ``number`` takes fractions longer than the 1e-6 grid's six digits
(before: at most 6, so a model writing 0.12345678 for a probability in [0, 1] was cut off).
Compile-level: treadle's regex read by Python's ``re``, every text it takes checked by
``jsonschema`` and by exact decimal arithmetic; the automaton walked over single bytes."""
from __future__ import annotations

import json
import random
import re
from decimal import Decimal
from fractions import Fraction

import jsonschema
import pytest
from json_checks import byte_walks

from treadle.constrained.schema.json_schema import json_schema_to_regex

BOUNDS = [  # (schema, texts past six fraction digits it now takes, texts it must not take)
    ({"minimum": 0, "maximum": 1}, ["0.12345678", "0.9999991234", "0.0000001"], ["1.0000001", "-0.0000001"]),
    ({"minimum": 0.001, "maximum": 0.999}, ["0.5000000001", "0.0010000001"], ["0.0009999999", "0.9990000001"]),
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 1}, ["0.0000011", "0.99999812345"],
     ["0.99999999999", "0.00000000001"]),
    ({"minimum": -273.15, "maximum": 1000}, ["-273.1499999", "-12.34567891", "999.9999991"],
     ["-273.1500001", "1000.0000001"]),
    ({"exclusiveMaximum": 0}, ["-0.00000123", "-999999998.1234567"], ["0.0000001"]),
]


def _holds(schema: dict, text: str) -> bool:
    """Exact: the decimal ``text`` against each bound's shortest decimal."""
    x = Fraction(Decimal(text))
    tests = {"minimum": x.__ge__, "exclusiveMinimum": x.__gt__, "maximum": x.__le__, "exclusiveMaximum": x.__lt__}
    return all(tests[k](Fraction(Decimal(repr(b)))) for k, b in schema.items())


@pytest.mark.parametrize("bounds, ok, bad", BOUNDS)
def test_bounded_numbers_take_fractions_past_six_digits(bounds: dict, ok: list[str], bad: list[str]) -> None:
    schema = {"type": "number", **bounds}
    rx = re.compile(json_schema_to_regex(schema))
    check = jsonschema.Draft202012Validator(schema)
    for text in ok:
        assert rx.fullmatch(text), text
    for text in bad:
        assert not rx.fullmatch(text), text
    # near each bound, texts of up to 16 fraction digits: every one taken holds, exactly and as a double
    rng, taken = random.Random(45), 0
    for _ in range(1500):
        step = Decimal(rng.randint(1, 10 ** rng.randint(1, 10))) / Decimal(10 ** rng.randint(1, 16))
        text = format(Decimal(repr(rng.choice(list(bounds.values())))) + rng.choice((-1, 1)) * step, "f")
        if rx.fullmatch(text):
            taken += 1
            assert _holds(bounds, text) and check.is_valid(json.loads(text)), text
    assert taken > 100, taken
    for data in byte_walks(json_schema_to_regex(schema), 60, seed=45, by_state=True, stop_p=0.05, steps=40):
        if data is not None:
            assert _holds(bounds, data.decode()) and check.is_valid(json.loads(data)), data

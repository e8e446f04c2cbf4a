"""An integer's ``multipleOf`` as users write it: Pydantic's ``Field(multiple_of=5)`` on an int
(no bounds, or one), OpenAPI's ``multipleOf: 100`` on an amount in cents. These were 400s
(only a multipleOf between two bounds holding at most 4,096 multiples was written). A whole
``multipleOf`` dividing a power of ten (2, 5, 25, 100, ...) is written exactly (its last digits
decide); another (3, 7, 86400) stays a 400 naming multipleOf unless two bounds hold few
multiples. Walks of each compiled regex validate; valid instances are taken."""

from __future__ import annotations

import json
import re
from typing import Annotated

import jsonschema
import pytest
from pydantic import BaseModel, Field

from json_checks import byte_walks
from treadle.constrained.schema.json_schema import json_schema_to_regex



def _check(schema: dict, valid: list, invalid: list, mode: str = "strict", walks: int = 60) -> None:
    rx = json_schema_to_regex(schema, mode=mode)
    validator = jsonschema.Draft202012Validator(schema)
    done = 0
    for text in byte_walks(rx, walks):
        assert text is not None, "dead end"
        value = json.loads(text)
        assert validator.is_valid(value), (schema, text)
        done += 1
    compiled = re.compile(rx)
    for v in valid:
        assert validator.is_valid(v)
        assert compiled.fullmatch(json.dumps(v, separators=(",", ":"))), (schema, v)
    for v in invalid:
        assert not compiled.fullmatch(json.dumps(v, separators=(",", ":"))), (schema, v)


class Order(BaseModel):
    quantity: Annotated[int, Field(multiple_of=5)]
    cents: Annotated[int, Field(ge=0, multiple_of=100)]
    pack: Annotated[int, Field(gt=0, multiple_of=20)]


def test_pydantic_multiple_of_on_int_compiles_and_walks_validate() -> None:
    schema = Order.model_json_schema()
    _check(schema, [{"quantity": -15, "cents": 123400, "pack": 40}, {"quantity": 0, "cents": 0, "pack": 20}],
           [{"quantity": 3, "cents": 100, "pack": 20}, {"quantity": 5, "cents": 150, "pack": 20},
            {"quantity": 5, "cents": 100, "pack": 0}])


@pytest.mark.parametrize("mode", ["strict", "spec"])
@pytest.mark.parametrize("m,valid,invalid", [
    (5, [0, 5, -5, 10, 995, 123456789012345 - 5, -10**14], [1, 51, -3, 10**15]),
    (2, [0, 2, -8, 10**14], [1, -3, 7]),
    (25, [0, 25, 50, 75, 100, 1025, -975], [5, 10, 30, 1010]),
    (100, [0, 100, -300, 987654321000], [50, 1001, 10]),
    (16, [0, 16, 32, 10000, 10016, -64], [8, 10008, 1]),
])
def test_multiples_of_a_divisor_of_a_power_of_ten_are_exact(mode: str, m: int, valid: list, invalid: list) -> None:
    _check({"type": "integer", "multipleOf": m}, valid, invalid, mode=mode)


@pytest.mark.parametrize("schema,valid,invalid", [
    ({"type": "integer", "multipleOf": 10, "minimum": 15}, [20, 30, 10**12], [10, 0, 25]),
    ({"type": "integer", "multipleOf": 10, "exclusiveMaximum": -15}, [-20, -10**9], [-10, 0]),
    ({"type": "integer", "multipleOf": 4, "minimum": 1234, "maximum": 987654}, [1236, 987652, 5000], [1232, 987656]),
    ({"type": "number", "multipleOf": 50, "minimum": 0}, [0, 50, 1000], [25, -50]),
    ({"type": "integer", "multipleOf": 5.0, "minimum": 100}, [100, 105], [95, 101]),
])
def test_multiples_with_one_bound_are_exact(schema: dict, valid: list, invalid: list) -> None:
    _check(schema, valid, invalid)


@pytest.mark.parametrize("schema", [
    {"type": "integer", "multipleOf": 3},
    {"type": "integer", "multipleOf": 86400, "minimum": 0},
    {"type": "integer", "multipleOf": 5.0, "minimum": 2**60},
])
def test_other_unbounded_multiples_are_refused_by_name(schema: dict) -> None:
    with pytest.raises(ValueError, match="multipleOf"):
        json_schema_to_regex(schema)


def test_other_multiples_between_close_bounds_are_still_listed() -> None:
    _check({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 100}, [7, 98], [0, 8, 105])


def test_no_multiple_within_the_bounds_is_still_a_400() -> None:
    with pytest.raises(ValueError, match="multipleOf"):
        json_schema_to_regex({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9})

"""Membership in an ``enum`` as JSON Schema defines it, in constant time per value.

jsonschema checks ``enum`` by comparing the value with each listed one in turn, so checking
every listed value of a long enum against its own schema (what the translator does to keep the
values the rest of the schema allows) took time quadratic in its length: an ``enum`` of 20,000
integers spent 82 s there. ``ListedValues`` keeps the scalars as keys under JSON Schema's
equality (``1`` and ``1.0`` are one number, ``true`` is no number) and compares only the
containers one by one.

Importing this module does not import torch.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

__all__ = ["ListedValues", "json_equal", "scalar_key"]


def scalar_key(value: Any) -> tuple | None:
    """A key two scalars share exactly when JSON Schema calls them equal (1 and 1.0 do; true
    and 1 do not); None for containers and for numbers that are not finite."""
    if value is None or isinstance(value, (bool, str)):
        return (type(value).__name__, value)
    if isinstance(value, int):  # (an int of any size: no double is made of it)
        return ("number", Fraction(value))
    if isinstance(value, float) and math.isfinite(value):
        return ("number", Fraction(value))
    return None


def json_equal(a: Any, b: Any) -> bool:
    """JSON Schema's equality of two JSON values (arrays item by item, objects key by key)."""
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(
            json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
            json_equal(a[k], b[k]) for k in a)
    ka, kb = scalar_key(a), scalar_key(b)
    return ka is not None and ka == kb


class ListedValues:
    """The values of one ``enum``: ``holds(value)`` is jsonschema's verdict on that keyword alone."""

    def __init__(self, values: list) -> None:
        self._keys = set()
        self._containers = []
        self._other = []  # (numbers that are not finite: compared by jsonschema's rule, ==)
        for v in values:
            key = scalar_key(v)
            if key is not None:
                self._keys.add(key)
            elif isinstance(v, (list, dict)):
                self._containers.append(v)
            else:
                self._other.append(v)

    def holds(self, value: Any) -> bool:
        key = scalar_key(value)
        if key is not None:
            return key in self._keys
        if isinstance(value, (list, dict)):
            return any(json_equal(value, c) for c in self._containers)
        return any(value == v for v in self._other)

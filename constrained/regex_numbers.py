"""Regexes for JSON integers and numbers, with exact bounds.

Integer ranges are exact digit-range regexes. Bounded numbers are written without an
exponent and with a short fraction so that every accepted text, even after rounding to a
binary float, stays inside the bounds (strict comparisons are where rounding bites).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

INT_DIGITS = 15  # an unbounded integer side stops at 15 digits (exact in a double)
NUM_INT_DIGITS = 9  # integer part of a bounded number; see _FRAC_ANY for why
INT_LIMIT = 10**INT_DIGITS - 1
NUM_LIMIT = 10**NUM_INT_DIGITS - 1

# With |integer part| < 1e9 a 6-digit fraction never rounds up to the next integer as a
# double (ulp at 1e9 is ~2.4e-7 < 1e-6), so "I.999999" < I+1 holds after parsing too.
_FRAC_ANY = r"(?:\.[0-9]{1,6})?"
_FRAC_NONZERO = r"\.[1-9][0-9]{0,5}"  # >= 0.1: L + f > L survives rounding
_FRAC_ZERO = r"(?:\.0{1,6})?"

NUMBER = r"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,16})?(?:[eE][+-]?[0-9]{1,3})?"


class BoundsError(ValueError):
    """Numeric keywords that cannot be enforced; ``keyword`` names the culprit."""

    def __init__(self, keyword: str, reason: str) -> None:
        super().__init__(reason)
        self.keyword = keyword


def _same_length(a: str, b: str) -> str:
    """Regex for the decimal strings of equal length n with a <= s <= b."""
    if a == b:
        return a
    if len(a) == 1:
        return f"[{a}-{b}]"
    n = len(a) - 1
    if a[0] == b[0]:
        return a[0] + "(?:" + _same_length(a[1:], b[1:]) + ")"
    parts = []
    lo_full = a[1:] == "0" * n
    hi_full = b[1:] == "9" * n
    if not lo_full:
        parts.append(a[0] + "(?:" + _same_length(a[1:], "9" * n) + ")")
    start = int(a[0]) if lo_full else int(a[0]) + 1
    end = int(b[0]) if hi_full else int(b[0]) - 1
    if start <= end:
        head = str(start) if start == end else f"[{start}-{end}]"
        parts.append(head + "[0-9]" + (f"{{{n}}}" if n > 1 else ""))
    if not hi_full:
        parts.append(b[0] + "(?:" + _same_length("0" * n, b[1:]) + ")")
    return "|".join(parts)


def nonneg_range_regex(lo: int, hi: int) -> str:
    """Regex for canonical decimal integers in ``[lo, hi]`` (0 <= lo <= hi)."""
    assert 0 <= lo <= hi
    parts = []
    for length in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = min(hi, 10**length - 1)
        if a <= b:
            parts.append(_same_length(str(a), str(b)))
    return "(?:" + "|".join(parts) + ")"


def int_range_regex(lo: int | None, hi: int | None, limit: int = INT_LIMIT) -> str:
    """Regex for JSON integers in ``[lo, hi]``; a missing side stops at ``limit`` digits-wise."""
    lo = -limit if lo is None else max(lo, -limit)
    hi = limit if hi is None else min(hi, limit)
    if lo > hi:
        raise BoundsError("minimum", f"integer range [{lo}, {hi}] is empty within ±{limit}")
    parts = []
    if lo < 0:
        # -n for n in [max(1, -hi), -lo]
        parts.append("-" + nonneg_range_regex(max(1, -hi), -lo))
    if hi >= 0:
        parts.append(nonneg_range_regex(max(0, lo), hi))
    return "(?:" + "|".join(parts) + ")"


def _bound(schema: dict[str, Any], key: str) -> Fraction | None:
    if key not in schema:
        return None
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BoundsError(key, f"'{key}' must be a finite number, got {value!r}")
    return Fraction(value)


def _lower(schema: dict[str, Any]) -> tuple[Fraction | None, bool]:
    """The tightest lower bound and whether it is inclusive."""
    m, x = _bound(schema, "minimum"), _bound(schema, "exclusiveMinimum")
    if m is None and x is None:
        return None, True
    if x is None or (m is not None and m > x):
        return m, True
    return x, False


def _upper(schema: dict[str, Any]) -> tuple[Fraction | None, bool]:
    m, x = _bound(schema, "maximum"), _bound(schema, "exclusiveMaximum")
    if m is None and x is None:
        return None, True
    if x is None or (m is not None and m < x):
        return m, True
    return x, False


def integer_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """Inclusive integer bounds implied by the numeric keywords of ``schema``."""
    (lo, lo_inc), (hi, hi_inc) = _lower(schema), _upper(schema)
    ilo = None if lo is None else (math.ceil(lo) if lo_inc else math.floor(lo) + 1)
    ihi = None if hi is None else (math.floor(hi) if hi_inc else math.ceil(hi) - 1)
    return ilo, ihi


def integer_regex(schema: dict[str, Any]) -> str:
    """Regex for the ``integer`` type under the schema's bounds."""
    lo, hi = integer_bounds(schema)
    return int_range_regex(lo, hi)


def number_regex(schema: dict[str, Any]) -> str:
    """Regex for the ``number`` type under the schema's bounds (a sound subset).

    A non-integer bound is rounded inward to an integer (fewer outputs, all valid).
    """
    (lo, lo_inc), (hi, hi_inc) = _lower(schema), _upper(schema)
    if lo is None and hi is None:
        return NUMBER
    if lo is not None and lo.denominator != 1:
        lo, lo_inc = Fraction(math.ceil(lo)), True
    if hi is not None and hi.denominator != 1:
        hi, hi_inc = Fraction(math.floor(hi)), True
    L = None if lo is None else int(lo)
    H = None if hi is None else int(hi)
    if L is not None and H is not None and (L > H or (L == H and not (lo_inc and hi_inc))):
        raise BoundsError("minimum", f"number bounds {schema} leave no integer-anchored value")
    alts: list[str] = []

    # Non-negative texts "I(.F)?" with value in [I, I+1).
    any_lo = 0 if L is None else max(0, L if lo_inc else L + 1)
    any_hi = NUM_LIMIT if H is None else min(NUM_LIMIT, H - 1)
    if any_lo <= any_hi:
        alts.append(nonneg_range_regex(any_lo, any_hi) + _FRAC_ANY)
    if L is not None and not lo_inc and 0 <= L <= NUM_LIMIT and (H is None or L + 1 <= H):
        alts.append(str(L) + _FRAC_NONZERO)
    if H is not None and hi_inc and 0 <= H <= NUM_LIMIT and (L is None or H > L or lo_inc):
        alts.append(str(H) + _FRAC_ZERO)

    # Negative texts "-J(.F)?" with value in (-J-1, -J].
    j_lo = 0 if H is None else max(0, -H if hi_inc else -H + 1)
    j_hi = NUM_LIMIT if L is None else min(NUM_LIMIT, -L - 1)
    if j_lo <= j_hi:
        alts.append("-" + nonneg_range_regex(j_lo, j_hi) + _FRAC_ANY)
    if H is not None and not hi_inc and H <= 0 and -H <= NUM_LIMIT and (L is None or -H - 1 >= L):
        alts.append("-" + str(-H) + _FRAC_NONZERO)
    if L is not None and lo_inc and L < 0 and -L <= NUM_LIMIT and (H is None or L < H or hi_inc):
        alts.append("-" + str(-L) + _FRAC_ZERO)
    if not alts:
        raise BoundsError("minimum", f"number bounds {schema} are outside ±{NUM_LIMIT}")
    return "(?:" + "|".join(alts) + ")"

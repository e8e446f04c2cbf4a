"""Regexes for JSON integers and numbers, with exact bounds.

Integer ranges are exact digit-range regexes. Bounded numbers are written without an
exponent and with a short fraction so that every accepted text, even after rounding to a
binary float, stays inside the bounds (strict comparisons are where rounding bites); the
bounds themselves are exact to 1e-6 (``minimum: 1.1`` admits "1.1"). A longer fraction (up to
16 digits) is written where the 1e-6 step its first six digits name lies within the bounds.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

INT_DIGITS = 15  # an unbounded integer side stops at 15 digits (exact in a double)
NUM_INT_DIGITS = 9  # integer part of a bounded number; see _FRAC_ANY for why
INT_LIMIT = 10**INT_DIGITS - 1
NUM_LIMIT = 10**NUM_INT_DIGITS - 1
FRAC_DIGITS = 6  # fraction digits of a bounded number: the texts form a grid of step 1e-6
_SCALE = 10**FRAC_DIGITS

# With |integer part| < 1e9 a 6-digit fraction never rounds up to the next integer as a
# double (ulp below 2**30 is <= 2**-23 < 1e-6), so "I.999999" < I+1 holds after parsing too.
_FRAC_ANY = r"(?:\.[0-9]{1,6})?"
# Past the grid, a bounded number's fraction goes on for up to 10 more digits (16 in all, as
# NUMBER's) where the grid step its first FRAC_DIGITS name lies within the bounds (number_regex).
_FRAC_MORE = r"[0-9]{1,10}"
# JSON Schema counts 1.0 as an integer: the integer type also takes a zero fraction.
ZERO_FRACTION = r"(?:\.0{1,6})?"

# (exponents of at most 2 digits: 3 wrote -4.800e892, -inf to a reader of doubles, on which
# jsonschema's multipleOf raised; with 2 every text is a finite double, none that is not 0 reads as 0)
NUMBER = r"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,16})?(?:[eE][+-]?[0-9]{1,2})?"


def finite(value: int | float) -> bool:
    """Whether a JSON number (not a bool) is finite. JSON writes integers of any size and Python's
    json reads them as ints, which ``math.isfinite`` turns into doubles first: past 1.8e308
    (``"minimum": 1`` and 400 zeros) that raised OverflowError, not a refusal."""
    return isinstance(value, int) or math.isfinite(value)


class BoundsError(ValueError):
    """Numeric keywords that cannot be enforced; ``keyword`` names the culprit. ``unsupported``:
    values exist but none can be written (the bounds are not empty)."""

    def __init__(self, keyword: str, reason: str, unsupported: bool = False) -> None:
        super().__init__(reason)
        self.keyword = keyword
        self.unsupported = unsupported


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
    """Regex for JSON integers in ``[lo, hi]``. A given bound is exact at any size (a 64-bit
    id's ``minimum``); a missing side stops at ``limit``, or, past a given bound beyond it,
    at the largest number with as many digits as that bound."""
    if lo is None:
        lo = -max(limit, 10 ** len(str(abs(hi))) - 1) if hi is not None and hi < -limit else -limit
    if hi is None:
        hi = max(limit, 10 ** len(str(abs(lo))) - 1) if lo > limit else limit
    if lo > hi:
        raise BoundsError("minimum", f"integer range [{lo}, {hi}] is empty")
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not finite(value):
        raise BoundsError(key, f"'{key}' must be a finite number, got {value!r}", unsupported=True)
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


def integer_regex(schema: dict[str, Any], *, zero_fraction: bool = False) -> str:
    """Regex for the ``integer`` type under the schema's bounds.

    Plain digits by default: "5.0" is an integer in JSON Schema, but a generated integer is
    written as one ("age": 5 parses to an int, not a float). ``zero_fraction`` also admits
    "5.0" / "-3.00" (the spec-faithful mode): the digits before the point carry the value,
    so the bounds hold as they do for plain digits. Exponent forms are never produced.
    """
    lo, hi = integer_bounds(schema)
    return int_range_regex(lo, hi) + (ZERO_FRACTION if zero_fraction else "")


def number_regex(schema: dict[str, Any]) -> str:
    """Regex for the ``number`` type under the schema's bounds (a sound subset).

    A bounded number is written ``-?I(.F)?`` with ``|I| <= NUM_LIMIT`` and at most
    ``FRAC_DIGITS`` fraction digits: the texts form a grid of step 1e-6. Past the grid, up to
    ``INT_LIMIT``, integer texts only (exact as doubles below 2**53, so the integer bounds
    hold after parsing): a millisecond timestamp's ``minimum: 1e12`` has values. A bound is read as
    the shortest decimal that parses back to the same double (so ``minimum: 1.1`` admits
    "1.1"), rounded inward to the grid. Why that is exact after parsing: below 1e9 a double's
    ulp is at most 2**-23 < 1e-6, so two distinct grid values, or a grid value and a bound
    1e-6 away, never round to the same double, and rounding is monotone. An inclusive bound
    b then admits grid values >= b (they parse to >= float(b)), and an exclusive one admits
    grid values >= the first grid point past b, plus one step when b is off the grid.

    Past the grid: a text of exactly ``FRAC_DIGITS`` fraction digits naming grid value t, then
    1 to 10 more digits, is a value x with t <= |x| < t + 1 step; it is written where that whole
    step lies in [a, b] (t + 1 step <= b; for -x, -(t + 1 step) >= a), so x parses (rounding is
    monotone) between two grid values that hold.
    """
    (lo, lo_inc), (hi, hi_inc) = _lower(schema), _upper(schema)
    if lo is None and hi is None:
        return NUMBER
    key = next(k for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum") if k in schema)
    if lo is not None and hi is not None and (lo > hi or lo == hi and not (lo_inc and hi_inc)):
        raise BoundsError(key, f"number bounds {_bounds_text(schema)} are empty")
    span = (NUM_LIMIT + 1) * _SCALE - 1  # largest magnitude on the grid, in grid steps
    a = -span if lo is None else max(-span, _grid_lower(_raw_bound(schema, "minimum", lo), lo_inc))
    b = span if hi is None else min(span, _grid_upper(_raw_bound(schema, "maximum", hi), hi_inc))
    alts = []
    if a <= b and b >= 0:
        alts.append(_magnitude_regex(max(a, 0), b))
    if a <= b and a < 0:  # "-x" for x >= 1e-6 (zero is written "0", never "-0")
        alts.append("-" + _magnitude_regex(max(-b, 1), -a))
    # past the grid: a grid text of all FRAC_DIGITS fraction digits, t, then more digits, a
    # value x in [t, t + 1 step); sound where the whole step lies within [a, b]
    if max(a, 0) <= b - 1:
        alts.append(_full_magnitude_regex(max(a, 0), b - 1) + _FRAC_MORE)
    if max(-b, 1) <= -a - 1:  # "-x": -x in (-(t + 1 step), -t]
        alts.append("-" + _full_magnitude_regex(max(-b, 1), -a - 1) + _FRAC_MORE)
    ilo, ihi = integer_bounds(schema)  # past the grid: integers, up to INT_LIMIT
    ilo = -INT_LIMIT if ilo is None else max(ilo, -INT_LIMIT)
    ihi = INT_LIMIT if ihi is None else min(ihi, INT_LIMIT)
    if max(ilo, NUM_LIMIT + 1) <= ihi:
        alts.append(nonneg_range_regex(max(ilo, NUM_LIMIT + 1), ihi))
    if ilo <= min(ihi, -(NUM_LIMIT + 1)):
        alts.append("-" + nonneg_range_regex(-min(ihi, -(NUM_LIMIT + 1)), -ilo))
    if not alts:
        raise BoundsError(key, f"number bounds {_bounds_text(schema)}: no value on the grid of 1e-6 steps within "
                          f"±{NUM_LIMIT}, nor an integer within ±{INT_LIMIT}", unsupported=True)
    return "(?:" + "|".join(alts) + ")"


MAX_STEP_BITS = 3  # a decimal multipleOf 1/k is written on a grid of at most 2**-3 (0.125)


def multiple_grid(m: Any, magnitude: int = INT_LIMIT + 1) -> int | None:
    """The grid a ``multipleOf: m`` of the form 1/k (0.5, 0.1, 0.01, 1e-3; k whole) is written on:
    steps of 1/2**a, a the power of 2 in k up to MAX_STEP_BITS; returns 2**a (0.1 -> 2, 0.01 -> 4,
    0.2 -> 1), or None.

    Its points are multiples of m twice over: of the decimal the schema spells (x*k is whole), and
    as validators compute it, dividing by the double m (jsonschema: ``x / m`` whole; 0.3 / 0.1 is
    not). A point x is exact as a double and x*k is a whole q; where the double m lies within
    2**-54 of 1/k, relative (checked here), ``x / m`` rounds to q itself below 2**53 (the error,
    under q * 2**-54, is less than half an ulp of q), and every double past 2**52 is whole, as
    long as it is finite: the values written stay below ``magnitude``, and a quotient past the
    largest double (x / 1e-300 for x of 1e9) makes jsonschema check exactly, against the double
    m, which is not 1/k. None where m is not 1/k, its double is further off (1e-5: jsonschema
    finds 3 / 1e-5 not whole), or ``magnitude`` / m could overflow.
    """
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not finite(m) or m <= 0:
        return None
    spelt = _shortest(m)
    k = 1 / spelt
    if k.denominator != 1 or abs(Fraction(m) - spelt) * 2**54 > spelt:
        return None
    if isinstance(m, float) and magnitude / Fraction(m) >= 2**1023:
        return None
    twos = (k.numerator & -k.numerator).bit_length() - 1
    return 2 ** min(twos, MAX_STEP_BITS)


def integer_magnitude(schema: dict[str, Any]) -> int:
    """A bound on |n| for the integers ``integer_regex`` writes under the schema's bounds (a side
    left open stops at INT_LIMIT, or at as many digits as a larger bound the other side gives)."""
    try:
        bounds = [b for b in integer_bounds(schema) if b is not None]
    except BoundsError:  # (refused where the integer is written)
        bounds = []
    return max([INT_LIMIT + 1] + [10 ** len(str(abs(b))) for b in bounds])


def multiples_regex(schema: dict[str, Any], per: int) -> str:
    """The multiples of 1/``per`` (``multiple_grid``'s grid) under the schema's bounds, written
    ``-?I(.F)?`` with |I| <= INT_LIMIT (so I + F is exact as a double: I * 8 < 2**53) and F one of
    the grid's fractions, digits as they are (0.125, never 0.1250). The bounds compare exactly:
    every point is a double, so the validator's comparison with the bound's double is exact."""
    (lo, lo_inc), (hi, hi_inc) = _lower(schema), _upper(schema)
    top = (INT_LIMIT + 1) * per - 1
    a = -top if lo is None else max(-top, math.ceil(lo * per) if lo_inc else math.floor(lo * per) + 1)
    b = top if hi is None else min(top, math.floor(hi * per) if hi_inc else math.ceil(hi * per) - 1)
    alts = []
    if a <= b and b >= 0:
        alts.append(_steps_regex(max(a, 0), b, per))
    if a <= b and a < 0:
        alts.append("-" + _steps_regex(max(-b, 1), -a, per))
    if not alts:
        raise BoundsError("multipleOf", f"no multiple of {schema.get('multipleOf')} within {_bounds_text(schema)}")
    return "(?:" + "|".join(alts) + ")"


def _steps_regex(lo: int, hi: int, per: int) -> str:
    """Texts ``I(.F)?`` of the values lo/per .. hi/per in steps of 1/per (per a power of 2)."""

    def fractions(first: int, last: int) -> str:
        texts = [str(Decimal(j) / per)[2:] for j in range(max(first, 1), last + 1)]  # 3/8 -> "375"
        if not texts:
            return ""
        return r"(?:\.(?:" + "|".join(texts) + "))" + ("?" if first == 0 else "")

    ia, ja = divmod(lo, per)
    ib, jb = divmod(hi, per)
    if ia == ib:
        return str(ia) + fractions(ja, jb)
    alts = []
    if ja != 0:
        alts.append(str(ia) + fractions(ja, per - 1))
    first, last = ia + (ja != 0), ib - (jb != per - 1)
    if first <= last:
        alts.append(nonneg_range_regex(first, last) + fractions(0, per - 1))
    if jb != per - 1:
        alts.append(str(ib) + fractions(0, jb))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _bounds_text(schema: dict[str, Any]) -> str:
    keys = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
    return str({k: schema[k] for k in keys if k in schema})


def _shortest(value: Any) -> Fraction:
    """``value`` as the shortest decimal that parses back to the same double."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _raw_bound(schema: dict[str, Any], key: str, exact: Fraction) -> Fraction:
    """The winning bound ``exact`` came from ``key`` or its exclusive twin: its shortest form."""
    twin = "exclusive" + key[0].upper() + key[1:]
    for k in (key, twin):
        if k in schema and Fraction(schema[k]) == exact:
            return _shortest(schema[k])
    raise AssertionError("unreachable: the winning bound is one of the keywords")


def _grid_lower(bound: Fraction, inclusive: bool) -> int:
    """Smallest grid value (in steps of 1e-6) soundly >= (or >) ``bound``."""
    steps = math.ceil(bound * _SCALE)
    return steps if inclusive else steps + 1


def _grid_upper(bound: Fraction, inclusive: bool) -> int:
    steps = math.floor(bound * _SCALE)
    return steps if inclusive else steps - 1


def _magnitude_regex(lo: int, hi: int) -> str:
    """Texts ``I(.F)?`` (F of 1..FRAC_DIGITS digits) whose value in grid steps is in [lo, hi]."""
    assert 0 <= lo <= hi
    ia, fa = divmod(lo, _SCALE)
    ib, fb = divmod(hi, _SCALE)
    if ia == ib:
        return str(ia) + _fraction_regex(fa, fb)
    alts = []
    first, last = ia + (fa != 0), ib - (fb != _SCALE - 1)  # integer parts with any fraction
    if fa != 0:
        alts.append(str(ia) + _fraction_regex(fa, _SCALE - 1))
    if first <= last:
        alts.append(nonneg_range_regex(first, last) + _FRAC_ANY)
    if fb != _SCALE - 1:
        alts.append(str(ib) + _fraction_regex(0, fb))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _full_magnitude_regex(lo: int, hi: int) -> str:
    """Texts ``I.F`` with F of exactly FRAC_DIGITS digits whose value in grid steps is in [lo, hi]."""
    assert 0 <= lo <= hi
    ia, fa = divmod(lo, _SCALE)
    ib, fb = divmod(hi, _SCALE)
    pad = lambda v: str(v).zfill(FRAC_DIGITS)  # noqa: E731
    if ia == ib:
        return str(ia) + r"\." + _exact_digits(pad(fa), pad(fb))
    alts = []
    first, last = ia + (fa != 0), ib - (fb != _SCALE - 1)  # integer parts with any fraction
    if fa != 0:
        alts.append(str(ia) + r"\." + _exact_digits(pad(fa), "9" * FRAC_DIGITS))
    if first <= last:
        alts.append(nonneg_range_regex(first, last) + r"\.[0-9]{%d}" % FRAC_DIGITS)
    if fb != _SCALE - 1:
        alts.append(str(ib) + r"\." + _exact_digits("0" * FRAC_DIGITS, pad(fb)))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _exact_digits(lo: str, hi: str) -> str:
    """Digit strings of exactly len(lo) digits between lo and hi (as numbers, inclusive)."""
    r = len(lo)
    if r == 0:
        return ""
    if lo == "0" * r and hi == "9" * r:
        return f"[0-9]{{{r}}}"
    l0, h0 = int(lo[0]), int(hi[0])
    if l0 == h0:
        return lo[0] + _exact_digits(lo[1:], hi[1:])
    # first digits strictly inside [l0, h0] (and the ends whose rest is unconstrained) take
    # any rest; the tight ends recurse
    free_lo = l0 if lo[1:] == "0" * (r - 1) else l0 + 1
    free_hi = h0 if hi[1:] == "9" * (r - 1) else h0 - 1
    alts = []
    if free_lo > l0:
        alts.append(lo[0] + _exact_digits(lo[1:], "9" * (r - 1)))
    if free_lo <= free_hi:
        head = str(free_lo) if free_lo == free_hi else f"[{free_lo}-{free_hi}]"
        alts.append(head + ("" if r == 1 else f"[0-9]{{{r - 1}}}"))
    if free_hi < h0:
        alts.append(hi[0] + _exact_digits("0" * (r - 1), hi[1:]))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _fraction_regex(lo: int, hi: int) -> str:
    """An optional ``.F`` whose digits, padded to FRAC_DIGITS, are in [lo, hi]."""
    if lo == 0 and hi == _SCALE - 1:
        return _FRAC_ANY
    body = r"\." + _digits(str(lo).zfill(FRAC_DIGITS), str(hi).zfill(FRAC_DIGITS))
    return f"(?:{body})?" if lo == 0 else body


def _digits(lo: str, hi: str) -> str:
    """Digit strings t, 1 <= len(t) <= len(lo), with lo <= t padded with zeros <= hi."""
    r = len(lo)
    if lo == hi == "0" * r:
        return "0" if r == 1 else f"0{{1,{r}}}"
    l0, h0 = int(lo[0]), int(hi[0])
    if l0 == h0:
        return lo[0] + _rest(lo[1:], hi[1:])
    # First digits strictly inside [l0, h0] (and the ends whose rest is unconstrained)
    # take any rest; the tight ends recurse.
    free_lo = l0 if lo[1:] == "0" * (r - 1) else l0 + 1
    free_hi = h0 if hi[1:] == "9" * (r - 1) else h0 - 1
    alts = []
    if free_lo > l0:
        alts.append(lo[0] + _rest(lo[1:], "9" * (r - 1)))
    if free_lo <= free_hi:
        head = str(free_lo) if free_lo == free_hi else f"[{free_lo}-{free_hi}]"
        alts.append(head + ("" if r == 1 else f"[0-9]{{0,{r - 1}}}"))
    if free_hi < h0:
        alts.append(hi[0] + _rest("0" * (r - 1), hi[1:]))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _rest(lo: str, hi: str) -> str:
    """Like ``_digits`` but the empty string too when it qualifies (it pads to zeros)."""
    r = len(lo)
    if r == 0:
        return ""
    if lo == "0" * r and hi == "9" * r:
        return f"[0-9]{{0,{r}}}"
    body = _digits(lo, hi)
    return f"(?:{body})?" if lo == "0" * r else body


def number_literal_regex(value: int | float) -> str:
    """The spellings of one JSON number that JSON Schema's equality treats as ``value``.

    ``const: 1`` also matches "1.0" and ``const: 0.5`` "0.50": the same number, parsing to
    the same double. Integers beyond 2**53 keep their digits only (a ".0" spelling would
    parse to a different double); a float there whose double is not its decimal (1.5e300)
    keeps its fraction ("1500...0.0", never the integer "1500...0"). Besides ``json.dumps``'s own form, no exponent spelling.
    """
    assert isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
    own = json.dumps(value).replace(".", r"\.").replace("+", r"\+")
    exact = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    sign = "-" if exact < 0 else ""
    if exact.denominator != 1:
        # A terminating decimal (it came from repr): plain notation, trailing zeros allowed.
        plain = format(abs(Decimal(repr(value))), "f")
        spelled = sign + plain.replace(".", r"\.") + "0{0,6}"
    elif isinstance(value, int) and abs(value) > 2**53:
        spelled = sign + str(abs(value))
    elif isinstance(value, float) and Fraction(value) != exact:
        # a double past 2**53 whose decimal is not its value (1.5e300): the digits alone parse
        # to that integer, which equality (exact, as Python compares an int and a float) finds
        # different; with a fraction they parse to the double
        spelled = sign + str(abs(exact.numerator)) + r"\.0{1,6}"
    else:
        spelled = sign + str(abs(exact.numerator)) + ZERO_FRACTION
    if re.fullmatch(spelled, json.dumps(value)):
        return spelled
    return f"(?:{spelled}|{own})"


MAX_SUFFIXES = 1000  # a whole multipleOf m dividing 10**k is written exactly where 10**k / m <= this


def decimal_multiples_regex(lo: int | None, hi: int | None, m: int) -> str | None:
    """Canonical decimal integers in ``[lo, hi]`` that are multiples of the whole ``m`` (a side
    left open stops where ``int_range_regex``'s does), exactly, where ``m`` divides a power of
    ten 10**k with at most ``MAX_SUFFIXES`` multiples below it (2, 5, 16, 25, 100, 1000, ...):
    whether n is a multiple is decided by its last k digits. None for another ``m`` (3, 7, 64);
    "" where no multiple lies within the bounds."""
    k, rest = 0, m
    for p in (2, 5):
        e = 0
        while rest % p == 0:
            rest, e = rest // p, e + 1
        k = max(k, e)
    if rest != 1 or 10**k // m > MAX_SUFFIXES:
        return None
    if lo is None:
        lo = -max(INT_LIMIT, 10 ** len(str(abs(hi))) - 1) if hi is not None and hi < -INT_LIMIT else -INT_LIMIT
    if hi is None:
        hi = max(INT_LIMIT, 10 ** len(str(abs(lo))) - 1) if lo > INT_LIMIT else INT_LIMIT
    parts = []
    if lo < 0 and max(1, -hi) <= -lo:
        neg = _nonneg_multiples(max(1, -hi), -lo, m, k)
        if neg:
            parts.append("-" + neg)
    if hi >= 0 and max(0, lo) <= hi:
        pos = _nonneg_multiples(max(0, lo), hi, m, k)
        if pos:
            parts.append(pos)
    return "(?:" + "|".join(parts) + ")" if parts else ""


def _nonneg_multiples(lo: int, hi: int, m: int, k: int) -> str:
    """The multiples of ``m`` in ``[lo, hi]`` (0 <= lo <= hi; m divides 10**k): those below 10**k
    listed, the others a prefix p (a range of integers) then k digits s, n = p * 10**k + s."""
    size = 10**k

    def suffixes(a: int, b: int) -> str:
        """The k-digit (zero-padded) multiples of m in [a, b], as one group; "" for none."""
        texts = [str(s).zfill(k) if k else "" for s in range(-(-a // m) * m, b + 1, m)]
        return "(?:" + "|".join(texts) + ")" if texts else ""

    alts = []
    if lo < size:  # below 10**k: the multiples themselves
        alts += [str(s) for s in range(-(-lo // m) * m, min(hi, size - 1) + 1, m)]
    p_lo, p_hi = max(lo // size, 1), hi // size
    if p_lo <= p_hi:
        a = lo % size if p_lo == lo // size else 0  # the first prefix starts within its block
        if p_lo == p_hi:
            tail = suffixes(a, hi % size)
            if tail:
                alts.append(str(p_lo) + tail)
        else:
            first, last = p_lo, p_hi
            if a:  # the first prefix with the suffixes from a
                tail = suffixes(a, size - 1)
                if tail:
                    alts.append(str(p_lo) + tail)
                first += 1
            if hi % size < size - m:  # the last prefix with the suffixes up to hi's
                tail = suffixes(0, hi % size)
                if tail:
                    alts.append(str(p_hi) + tail)
                last -= 1
            if first <= last:
                alts.append(nonneg_range_regex(first, last) + suffixes(0, size - 1))
    return "(?:" + "|".join(alts) + ")" if alts else ""

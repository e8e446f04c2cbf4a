"""Standard schemas that were refused or read as unsatisfiable (helper-65's findings of session
41), each written now: every output random walks over SmolLM2's vocabulary write validates with
``jsonschema`` (formats checked), and example strings fullmatch the regex."""

from __future__ import annotations

import ipaddress
import json
import random
import re
import zlib

import jsonschema
import pytest

from treadle.constrained import GrammarSpec, allocate_token_bitmask, build_compiled_grammar, token_bytes_table
from treadle.constrained.index.json_any import JsonPushdown
from treadle.constrained.schema.json_schema import json_schema_to_regex
from treadle.constrained.schema.json_schema_parts import Unsatisfiable, UnsupportedSchemaError

from json_checks import random_walk

EOS = 2
V = 49152
CHECKER = jsonschema.FormatChecker()


@pytest.fixture(scope="module")
def vocab(smol):
    table = token_bytes_table(smol)
    return table, JsonPushdown(table, len(table), V, (EOS,))


def _walks(smol, vocab, schema: dict, n: int = 6, steps: int = 300) -> list:
    """The instances of the random walks of ``schema``'s grammar that ended (at least half)."""
    table, pda = vocab
    spec = GrammarSpec.from_params(json_schema=json.dumps(schema))
    g = build_compiled_grammar(spec.to_regex(holes=True), smol, [EOS], vocab_size=V, spec=spec, pda=pda)
    rng = random.Random(zlib.crc32(json.dumps(schema).encode()))
    bm = allocate_token_bitmask(1, V)
    done = []
    for _ in range(n):
        m = g.matcher()
        out = random_walk(m, bm, table, EOS, rng, steps=steps, stop_p=0.3, free_steps=40, steer_after=80)
        if m.is_terminated():
            done.append(json.loads(out.decode()))
    assert len(done) >= n // 2, (schema, done)
    for inst in done:
        jsonschema.validate(inst, schema, format_checker=CHECKER)
    return done


# ---------------------------------------------------------------- 1. format lengths


@pytest.mark.parametrize("lo, hi, examples", [
    (None, 10, ["::1", "fe80::1", "::", "1:2::3"]),
    (None, 2, ["::"]),
    (3, 14, ["::1", "2001:db8::1"]),
    (2, 5, ["::", "a::b", "::ff"]),
])
def test_ipv6_under_a_max_length_below_fifteen_writes_compressed_addresses(smol, vocab, lo, hi, examples):
    """'ipv6' under maxLength 10 was Unsatisfiable ("'ipv6' strings have 15 to 39 characters"):
    the eight-group subset's lengths, but "::1" is an IPv6 address. Each string written is one."""
    schema = {"type": "string", "format": "ipv6", "maxLength": hi}
    if lo is not None:
        schema["minLength"] = lo
    rx = json_schema_to_regex(schema)
    for ex in examples:
        assert re.fullmatch(rx, json.dumps(ex)), ex
    for bad in ["1::2::3", ":::", "12345::", ":1"]:
        assert not re.fullmatch(rx, json.dumps(bad)), bad
    for inst in _walks(smol, vocab, schema):
        ipaddress.IPv6Address(inst)
        assert (lo or 0) <= len(inst) <= hi


@pytest.mark.parametrize("schema, why", [
    ({"type": "string", "format": "ipv6", "maxLength": 1}, "'ipv6' strings have 2 to 45"),
    ({"type": "string", "format": "ipv4", "maxLength": 6}, "'ipv4' strings have 7 to 15"),
    ({"type": "string", "format": "ipv4", "minLength": 16}, "'ipv4' strings have 7 to 15"),
    ({"type": "string", "format": "uuid", "maxLength": 35}, "'uuid' strings have 36 to 36"),
    ({"type": "string", "format": "date", "minLength": 11}, "'date' strings have 10 to 10"),
    ({"type": "string", "format": "date-time", "maxLength": 19}, "'date-time' strings have 20 to any"),
    ({"type": "string", "format": "hostname", "minLength": 254}, "'hostname' strings have 1 to 253"),
])
def test_a_format_is_unsatisfiable_only_outside_its_real_lengths(schema, why):
    with pytest.raises(Unsatisfiable, match=why):
        json_schema_to_regex(schema)


@pytest.mark.parametrize("schema, valid", [
    # real strings of these lengths exist; the subsets written have none: a refusal by name
    ({"type": "string", "format": "hostname", "minLength": 200}, "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + ".d" * 5),
    ({"type": "string", "format": "date-time", "minLength": 40}, "2020-01-01T00:00:00.12345678901234567890Z"),
    ({"type": "string", "format": "email", "maxLength": 4}, "a@b"),
    ({"type": "string", "format": "duration", "minLength": 40}, "P" + "1" * 38 + "D"),
])
def test_a_format_whose_written_subset_misses_the_lengths_is_refused_not_unsatisfiable(schema, valid):
    """Before: Unsatisfiable naming the subset's lengths ('hostname' 1 to 167), though the
    example (of those lengths, valid for jsonschema) exists."""
    jsonschema.validate(valid, schema, format_checker=CHECKER)
    with pytest.raises(UnsupportedSchemaError, match="subset of the format"):
        json_schema_to_regex(schema)


# ---------------------------------------------------------------- 2. patterns in allOf


@pytest.mark.parametrize("schema, good, bad", [
    ({"allOf": [{"type": "string", "pattern": "^[a-z0-9]{2,6}$"}, {"pattern": "[0-9]"}]},
     ["a1", "zz9", "123456"], ["ab", "a1234567", "1", "A1"]),
    ({"type": "string", "allOf": [{"pattern": "a"}, {"pattern": "b"}, {"pattern": "c"}], "maxLength": 5},
     ["abc", "cxba", "bbcaa"], ["ab", "abcabc", "xyz"]),
    # the password rule said as allOf: the joint automaton's regex is too long, one pattern of them all is not
    ({"type": "string", "allOf": [{"pattern": "^[A-Za-z0-9]{8,64}$"}, {"pattern": "[A-Z]"}, {"pattern": "[0-9]"}]},
     ["abcdefA1"], ["abcdefgh", "A1", "abcdefg1"]),
    ({"allOf": [{"type": "string", "pattern": "^[a-z0-9]{2,6}$"}, {"pattern": "[0-9]"}, {"not": {"pattern": "7"}}]},
     ["a1", "zz9"], ["a7", "ab"]),
    ({"allOf": [{"type": "string", "format": "date"}, {"pattern": "^2"}, {"pattern": "-12-"}]},
     ["2024-12-31"], ["2024-11-30", "1999-12-31"]),
])
def test_patterns_in_allof_are_intersected(smol, vocab, schema, good, bad):
    """Two patterns on one string were refused ("keyword 'pattern' combined in allOf ... is not
    supported"): a string matching both is written."""
    rx = json_schema_to_regex(schema)
    for s in good:
        jsonschema.validate(s, schema, format_checker=CHECKER)
    for s in bad:
        assert not re.fullmatch(rx, json.dumps(s)), s
    assert any(re.fullmatch(rx, json.dumps(s)) for s in good), (good, rx[:200])
    _walks(smol, vocab, schema)


def test_patterns_in_allof_with_no_common_string_written_are_refused_not_unsatisfiable():
    """Where the narrow readings meet nowhere but the wide ones (which take Unicode digits and
    letters) might, the refusal names the keyword."""
    with pytest.raises(UnsupportedSchemaError, match="'pattern' combined in allOf"):
        json_schema_to_regex({"type": "string", "allOf": [{"pattern": "^[a-z]+$"}, {"pattern": "^[0-9]+$"}]})


# ---------------------------------------------------------------- 3. uniqueItems over an integer range


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 10}, "uniqueItems": True, "minItems": 3},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 10}, "uniqueItems": True, "minItems": 2,
     "maxItems": 4},
    {"type": "array", "items": {"type": "integer", "exclusiveMinimum": 0, "maximum": 40, "multipleOf": 2},
     "uniqueItems": True, "minItems": 3},
    # 64 values: their subsets of 3 in order pass the regex cap, those of the first 32 do not
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 64}, "uniqueItems": True, "minItems": 3},
    # at most 6 values: every order (spec mode too)
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "uniqueItems": True, "minItems": 3},
])
def test_unique_items_over_a_small_integer_range_are_written(smol, vocab, schema):
    """Before: "'uniqueItems' ... at most 6 listed scalar values", though a bounded integer range is
    a few listed values: each written array validates, its values distinct."""
    rx = json_schema_to_regex(schema)
    assert not re.fullmatch(rx, "[2,2,4]") and not re.fullmatch(rx, "[2]")
    for inst in _walks(smol, vocab, schema, steps=200):
        assert len(set(inst)) == len(inst) >= schema["minItems"]


def test_unique_items_over_at_most_six_range_values_in_spec_mode_take_every_order():
    schema = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "uniqueItems": True,
              "minItems": 3}
    rx = json_schema_to_regex(schema, mode="spec")
    assert re.fullmatch(rx, "[5,1,3]") and re.fullmatch(rx, "[2,4,1,5,3]") and not re.fullmatch(rx, "[1,1,2]")


@pytest.mark.parametrize("items", [
    {"type": "integer", "minimum": 100, "maximum": 999},  # 900 values
    {"type": "integer", "minimum": 1000, "maximum": 9999},  # 9,000 values, past the listing's look
])
def test_unique_items_over_a_range_too_large_to_list_is_refused_by_name(items):
    with pytest.raises(UnsupportedSchemaError, match="'uniqueItems'.*an integer range"):
        json_schema_to_regex({"type": "array", "items": items, "uniqueItems": True, "minItems": 3})

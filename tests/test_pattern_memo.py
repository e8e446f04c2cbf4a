"""regex_ecma.pattern_subset_body is remembered per pattern: a schema that repeats a pattern
(CloudFormation's '^[a-zA-Z0-9]+$', 1,930 times in one template schema) builds its FSMs once;
the same body comes back, and a pattern it refuses is refused again with the same message."""
from __future__ import annotations

import interegular
import pytest

from treadle.constrained.regex import regex_ecma, regex_text
from treadle.constrained.regex.regex_ecma import pattern_subset_body
from treadle.constrained.regex.regex_text import RegexDialectError


def _counting(monkeypatch) -> list:
    calls: list = []
    real = interegular.parse_pattern

    def parse(p):
        calls.append(p)
        return real(p)

    monkeypatch.setattr(interegular, "parse_pattern", parse)
    for mod in (regex_ecma, regex_text):
        if hasattr(mod, "interegular"):
            monkeypatch.setattr(mod.interegular, "parse_pattern", parse)
    return calls


def test_a_pattern_seen_again_builds_no_fsm(monkeypatch):
    calls = _counting(monkeypatch)
    # a lookahead keeps it on interegular's automata (a plain pattern is read off its parse tree)
    pattern = "^(?!x)[a-zA-Z0-9]+(?:-[a-z]{2,4})?_repeat_memo$"
    first = pattern_subset_body(pattern)
    assert calls  # the first time: its FSMs (the check that JSON may hold its characters raw)
    n = len(calls)
    assert pattern_subset_body(pattern) == first
    assert len(calls) == n
    # unanchored: the pad characters around it, the same text again
    other = "[0-9]{3}memo"
    assert pattern_subset_body(other) == pattern_subset_body(other)


def test_a_refused_pattern_is_refused_again_alike():
    bad = "^(?<name>[a-z]+)\\k<other>memo$"
    with pytest.raises(RegexDialectError) as one:
        pattern_subset_body(bad)
    with pytest.raises(RegexDialectError) as two:
        pattern_subset_body(bad)
    assert str(one.value) == str(two.value) and one.value is not two.value


def _fsm(body: str):
    return interegular.parse_pattern(body).to_fsm()


def _same(a, b) -> bool:
    return (a - b).empty() and (b - a).empty()


@pytest.mark.parametrize("pattern", ["[A-Za-z0-9][A-Za-z0-9\\-_]{2,7}", "x{2,5}ab", "^ab{2,4}", "a{2,}", "(?:ab|c){1,3}z",
                                     "a|b{2,3}", "[0-9]{1,4}-[a-c]{0,3}", "q\\{1,3}", "^x{1,3}$", "(?:a?){2,4}b"])
def test_a_count_next_to_the_padding_is_written_at_its_least_the_same_strings(pattern):
    # pad* X{m,n} ... and ... X{m,n} pad*: the copies past m are raw JSON characters the pad
    # takes, so X{m} writes the same strings
    written = pattern_subset_body(pattern)
    spelt = regex_ecma._pattern_subset_body(pattern)
    assert _same(_fsm(written), _fsm(spelt)), (written, spelt)


def test_an_unanchored_name_pattern_with_a_long_count_compiles_and_validates(smol):
    # CloudFormation AWS::AppRunner::AutoScalingConfiguration's name: the count of 3..31 after
    # padding made json_schema's automaton of the pattern track every count at once (~2^28
    # states, past the 30 s compile limit)
    import sys
    import os

    sys.path.insert(0, os.path.dirname(__file__))
    from json_checks import compiled_walks
    from jsonschema import Draft7Validator

    pattern = "[A-Za-z0-9][A-Za-z0-9\\-_]{3,31}"
    body = pattern_subset_body(pattern)
    assert "{3,31}" not in body and "{3}" in body
    schema = {"type": "object", "required": ["Name"], "additionalProperties": False,
              "properties": {"Name": {"type": "string", "pattern": pattern, "minLength": 4, "maxLength": 32}}}
    assert compiled_walks(smol, schema, Draft7Validator(schema), walks=6, steps=60, seed=1, timeout_s=60) >= 3

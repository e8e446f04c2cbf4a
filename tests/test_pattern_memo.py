"""regex_ecma.pattern_subset_body is remembered per pattern: a schema that repeats a pattern
(CloudFormation's '^[a-zA-Z0-9]+$', 1,930 times in one template schema) builds its FSMs once;
the same body comes back, and a pattern it refuses is refused again with the same message."""
from __future__ import annotations

import interegular
import pytest

from treadle.constrained import regex_ecma, regex_text
from treadle.constrained.regex_ecma import pattern_subset_body
from treadle.constrained.regex_text import RegexDialectError


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
    pattern = "^[a-zA-Z0-9]+(?:-[a-z]{2,4})?_repeat_memo$"
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

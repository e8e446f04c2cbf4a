"""The password rule (four lookaheads, one for each class of character, a common `pattern`): its
exact automaton is too large to write back as a regex (over 20,000 characters), so it was
refused; it is now written as the strings that begin with one character of each asked class
(constrained/regex/required_first.py), a subset of the pattern's: every string it writes
matches the pattern, and one that breaks it (a class missing) is never written."""

from __future__ import annotations

import re

import pytest

from treadle.constrained import GrammarSpec

PASSWORD = r"^(?=.*[a-z])(?=.*[A-Z])(?=.*\d)(?=.*[@$!%*?&])[A-Za-z\d@$!%*?&]{8,}$"
BOUNDED = r"^(?=.*[A-Z])(?=.*[a-z])(?=.*\d)(?=.*[@$!%*?&])[A-Za-z\d@$!%*?&]{8,16}$"


@pytest.mark.parametrize("pattern", [PASSWORD, BOUNDED])
def test_the_password_rule_is_written_as_a_subset_of_its_strings(pattern):
    rx = re.compile(GrammarSpec.from_params(json_schema={"type": "string", "pattern": pattern}).to_regex())
    rule = re.compile(pattern)
    # the strings the regex writes: a character of each class first, in the pattern's order
    order = [c for c in re.findall(r"\(\?=\.\*(\[[^\]]*\]|\\d)\)", pattern)]
    firsts = {"[a-z]": "q", "[A-Z]": "Q", "\\d": "7", "[@$!%*?&]": "&"}
    head = "".join(firsts[c] for c in order)
    for tail in ("abcd", "ZZZZZZZZZZZZ"[:12 if pattern == PASSWORD else 4], "1!aA"):
        s = head + tail
        assert rule.fullmatch(s), s
        assert rx.fullmatch(f'"{s}"'), (s, rx.pattern[:200])
    # nothing it writes breaks the rule: no class missing, no other character, no bad length
    for s in ("qQ7&abc", "qQ7&" + "a" * 13 if pattern == BOUNDED else "qQ7-abcd", "qqqqqqqq", "qQ7&abc#",
              "QQ7&abcd", "abcdQq7&"):
        if not rule.fullmatch(s):
            assert not rx.fullmatch(f'"{s}"'), s


def test_the_password_rule_inside_an_object_compiles():
    schema = {"type": "object", "properties": {"password": {"type": "string", "pattern": PASSWORD, "maxLength": 64}},
              "required": ["password"]}
    rx = re.compile(GrammarSpec.from_params(json_schema=schema).to_regex())
    assert rx.fullmatch('{"password":"qQ7&secret"}') or rx.fullmatch('{"password": "qQ7&secret"}')

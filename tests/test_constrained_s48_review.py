"""Adversarial review of session 48's constrained-decoding changes: inputs where the served
grammar could take what Python's ``re`` (or jsonschema) refuses."""

from __future__ import annotations

import re

import pytest

from treadle.constrained.regex.regex_text import translate_regex


@pytest.mark.parametrize("regex", [r"[\d-z]", r"(?i)[\d-z]", r"[\w-a]"])
def test_a_regex_python_refuses_is_refused(regex: str) -> None:
    """Python's re refuses a range from a shorthand ('bad character range \\d-z'), so it matches
    nothing there; the translation wrote '[0-9-z]' and served '-', 'z' and the digits."""
    with pytest.raises(re.error):
        re.compile(regex)
    with pytest.raises(ValueError, match="does not compile with Python re"):
        translate_regex(regex)


def test_regexes_python_takes_are_still_served() -> None:
    for regex, text in [(r"a\z", "a"), ("(?x)a b # c", "ab"), (r"[a-]{2}", "a-"), (r"[\d-]", "-")]:
        assert re.fullmatch(translate_regex(regex), text)


def test_a_dotnet_named_group_is_still_served() -> None:
    assert re.fullmatch(translate_regex(r"(?<word>[a-z]{1,8}) (?P<n>\d{1,3})"), "ab 12")
    with pytest.raises(ValueError, match="does not compile with Python re"):
        translate_regex(r"(?<w>[\d-z])")


@pytest.mark.parametrize("regex", [r"(?i)[^\Wk]", r"(?i)[^\W]", r"(?i)[^\d\W]", r"(?ai)[^\Wk]", r"(?i:[^\Wk])x"])
def test_a_folded_class_with_shorthands_takes_only_what_python_takes(regex: str) -> None:
    """Under 'i' a class holding \\W was written from its unfolded reading and folded after:
    '(?i)[^\\Wk]' took 'K', 'k' and '\\u212a' (Python folds them onto the 'k' it leaves out), and
    '(?i)[^\\W]' took '\\u0345' (it folds onto a letter, but is not a word character itself)."""
    written = re.compile(translate_regex(regex))
    tail = "x" if regex.endswith("x") else ""
    for text in ["k", "K", "\u212a", "\u0345", "\u03b9", "a", "5", "\u0663", "_", " ", "\xe9"]:
        assert bool(written.fullmatch(text + tail)) == bool(re.fullmatch(regex, text + tail)), (regex, text)


@pytest.mark.parametrize("regex", [r"(?i)(?!\W).", r"(?i)\W", r"(?i)(?<!\W)a?.", r"(?i)(?!\D)."])
def test_a_negated_shorthand_is_not_folded(regex: str) -> None:
    """Python's 'i' leaves \\W as it is ('\\u0345' is a non-word character); \\W was folded as a
    class, lost '\\u0345', and '(?i)(?!\\W).' then took it."""
    written = re.compile(translate_regex(regex))
    for text in ["\u0345", "\u03b9", "k", "\u212a", " ", "a\u0345", "5", "\u0663"]:
        if written.fullmatch(text):
            assert re.fullmatch(regex, text), (regex, text)

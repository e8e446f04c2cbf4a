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

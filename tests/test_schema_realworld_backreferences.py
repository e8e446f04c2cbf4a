"""A pattern with a backreference (a quoted value: ``^(["'])(.*)\\1$``) is refused, rightly: what
``\\1`` matches depends on what its group matched, which no automaton can check. The 400 said
"escape '\\1' ... differs between Python re and Rust regex; use an explicit class like [0-9]",
advice that reads it as a digit class. It now names the backreference."""

from __future__ import annotations

import pytest

from treadle.constrained.regex.regex_text import translate_regex
from treadle.constrained.schema.json_schema import json_schema_to_regex


@pytest.mark.parametrize("pattern,ref", [(r"""^(["'])(.*)\1$""", r"\1"), (r"(a)(b)\2", r"\2"),
                                         (r"^(x)-\1-\1$", r"\1")])
def test_a_pattern_backreference_is_refused_by_that_name(pattern: str, ref: str) -> None:
    with pytest.raises(ValueError) as e:
        json_schema_to_regex({"type": "string", "pattern": pattern})
    msg = str(e.value)
    assert "keyword 'pattern'" in msg and f"backreference '{ref}'" in msg, msg
    assert "explicit class" not in msg, msg


@pytest.mark.parametrize("regex,ref", [(r"(a)\1", r"\1"), (r"(?P<x>a)(?P=x)", "(?P=x)")])
def test_a_regex_constraint_backreference_is_refused_by_that_name(regex: str, ref: str) -> None:
    with pytest.raises(ValueError) as e:
        translate_regex(regex)
    msg = str(e.value)
    assert f"backreference '{ref}'" in msg and "explicit class" not in msg, msg


def test_escapes_that_are_no_backreference_still_read() -> None:
    assert json_schema_to_regex({"type": "string", "pattern": r"^\d{3}\.\w$"})
    assert translate_regex(r"[a-z]\d+\s?")

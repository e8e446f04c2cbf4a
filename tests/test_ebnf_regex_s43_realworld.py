"""Session 43: EBNF (GBNF) grammars and regexes as users write them (llama.cpp's grammars
folder, xgrammar's dialect, regexes copied from the web), compiled with the real SmolLM2
vocabulary: what is refused is refused by name and with an accurate reason, and what is
accepted is checked against an independent reading (the test_ebnf recognizer, Python's
``re``)."""

from __future__ import annotations

import re

import pytest

from treadle.constrained.ebnf.ebnf import EbnfError, ebnf_to_regex


# ------------------------------------------------------------------ EBNF refusals say what is wrong


def _chain(n: int) -> str:
    """A grammar of ``n`` rules, each used inside the one before: no recursion at all."""
    return ("root ::= r0\n" + "\n".join(f'r{i} ::= "x" r{i + 1} | "y"' for i in range(n))
            + f'\nr{n} ::= "z"')


def test_a_long_chain_of_rules_is_refused_without_blaming_recursion():
    """A grammar with no recursion whose rules nest some hundreds deep is refused (a Python
    recursion limit), naming the chain's depth; it was 'with recursion unrolled 3 levels;
    lower the recursion depth', which the grammar has none of."""
    assert ebnf_to_regex(_chain(100), calls=True).count("x") == 100
    for calls in (True, False):
        with pytest.raises(EbnfError) as info:
            ebnf_to_regex(_chain(300), calls=calls)
        msg = str(info.value)
        assert "301 references deep" in msg and "recursion" not in msg, msg


@pytest.mark.parametrize("text", [
    'root ::= "' + "a" * 250_000 + '"',
    "root ::= r0\n" + "\n".join(f"r{i} ::= r{i + 1} r{i + 1}" for i in range(30)) + '\nr30 ::= "a" | "b"',
])
def test_a_grammar_too_long_without_recursion_is_refused_without_blaming_recursion(text):
    for calls in (True, False):
        with pytest.raises(EbnfError) as info:
            ebnf_to_regex(text, calls=calls)
        msg = str(info.value)
        assert "over the 200000 supported" in msg and "recursion" not in msg, msg

"""EBNF grammars as SGLang users write them for xgrammar (session 47's sweep): its extras that
treadle does not run are refused by name at their position, never with a bare "unexpected"
that leaves the user guessing. Parser-level only (no tokenizer, no server)."""

from __future__ import annotations

import pytest

from treadle.constrained.ebnf.ebnf import EbnfError, ebnf_to_regex

# xgrammar's builtin JSON grammar ends its string rule with a lookahead (as users copy it)
XGRAMMAR_STRING = r'''root ::= "[" basic_string ("," basic_string)* "]"
basic_string ::= "\"" basic_string_sub
basic_string_sub ::= ("\"" | [^"\\\r\n] basic_string_sub | "\\" ["\\/bfnrt] basic_string_sub) (= [ \n\t]* [,}\]:])
'''

# a tool-calling grammar with xgrammar's TagDispatch macro
TAG_DISPATCH = r'''root ::= TagDispatch(("<tool_call>", call), stop_eos=true, loop_after_dispatch=true)
call ::= "{" [^}]* "}" "</tool_call>"
'''


@pytest.mark.parametrize("text,where", [
    (XGRAMMAR_STRING, "line 3 col 95"),
    ('root ::= item\nitem ::= [a-z]+ (  = ",")', "line 2 col 17"),
    ('root ::= "a" (=\n "b")', "line 1 col 14"),
])
def test_a_lookahead_assertion_is_refused_naming_it_where_it_opens(text, where):
    """xgrammar's ``rule ::= body (= follow)`` restricts what may follow the rule; treadle
    cannot enforce it, so the grammar is refused: the error names ``(= ...)`` at its ``(``
    (it used to point at the ``=`` inside and call it just "unexpected")."""
    with pytest.raises(EbnfError, match=r"lookahead assertion '\(= \.\.\.\)' is not supported") as e:
        ebnf_to_regex(text)
    assert where in str(e.value)


def test_xgrammars_tag_dispatch_macro_is_refused_by_name():
    """``TagDispatch((tag, rule), ...)`` is xgrammar's macro for tool calls; it used to fail
    with "unexpected ','" at its first comma. Only the macro's call form is refused: a rule of
    that name, or a reference to it followed by a group after a space, is plain GBNF."""
    with pytest.raises(EbnfError, match=r"line 1 col 10: xgrammar's TagDispatch\(\.\.\.\) macro is not supported"):
        ebnf_to_regex(TAG_DISPATCH)
    assert ebnf_to_regex('root ::= TagDispatch\nTagDispatch ::= "x"') == "x"
    assert ebnf_to_regex('root ::= TagDispatch ("a")\nTagDispatch ::= "x"') == "xa"


def test_a_bare_equals_sign_is_not_called_a_lookahead():
    with pytest.raises(EbnfError, match=r"line 1 col 14: unexpected '='$"):
        ebnf_to_regex('root ::= "a" = "b"')

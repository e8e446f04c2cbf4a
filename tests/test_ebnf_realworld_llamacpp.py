"""The grammars of llama.cpp's grammars/ folder (c.gbnf, json_arr.gbnf, list.gbnf, and
json/arithmetic/chess/english/japanese from test_ebnf_realworld.py) compiled as the server
compiles them, then walked at random over the SmolLM2 vocabulary: every text a walk ends with
is checked by a checker of its own (a Python regex written from the grammar for the regular
ones, ``json.loads`` for JSON, a recursive-descent parser for arithmetic, the fixpoint
recognizer of test_ebnf.py for all). c.gbnf used to be refused (its calls' boundaries let
~47k tokens cross mid-token, and unrolled it passed MAX_REGEX_CHARS). Lark grammars (vLLM's
``guided_grammar``) are refused with an error that says so. Matcher-level only."""

from __future__ import annotations

import json
import random
import re

import pytest

from json_checks import allowed_ids
from test_ebnf import recognizes
from test_ebnf_realworld import ARITHMETIC_GBNF, CHESS_GBNF, ENGLISH_GBNF, JAPANESE_GBNF, JSON_GBNF
from treadle.constrained import GrammarSpec
from treadle.constrained.ebnf.ebnf import EbnfError, call_boundaries, ebnf_to_regex, parse_ebnf
from treadle.constrained.index.lazy_index import LazyIndex

C_GBNF = r'''
root ::= (declaration)*

declaration ::= dataType identifier "(" parameter? ")" "{" statement* "}"

dataType  ::= "int" ws | "float" ws | "char" ws
identifier ::= [a-zA-Z_] [a-zA-Z_0-9]*

parameter ::= dataType identifier

statement ::=
    ( dataType identifier ws "=" ws expression ";" ) |
    ( identifier ws "=" ws expression ";" ) |
    ( identifier ws "(" argList? ")" ";" ) |
    ( "return" ws expression ";" ) |
    ( "while" "(" condition ")" "{" statement* "}" ) |
    ( "for" "(" forInit ";" ws condition ";" ws forUpdate ")" "{" statement* "}" ) |
    ( "if" "(" condition ")" "{" statement* "}" ("else" "{" statement* "}")? ) |
    ( singleLineComment ) |
    ( multiLineComment )

forInit ::= dataType identifier ws "=" ws expression | identifier ws "=" ws expression
forUpdate ::= identifier ws "=" ws expression

condition ::= expression relationOperator expression
relationOperator ::= ("<=" | "<" | "==" | "!=" | ">=" | ">")

expression ::= term (("+" | "-") term)*
term ::= factor(("*" | "/") factor)*

factor ::= identifier | number | unaryTerm | funcCall | parenExpression
unaryTerm ::= "-" factor
funcCall ::= identifier "(" argList? ")"
parenExpression ::= "(" ws expression ws ")"

argList ::= expression ("," ws expression)*

number ::= [0-9]+

singleLineComment ::= "//" [^\n]* "\n"
multiLineComment ::= "/*" ( [^*] | ("*" [^/]) )* "*/"

ws ::= ([ \t\n]+)
'''

JSON_ARR_GBNF = r'''
# This is the same as json.gbnf but we restrict whitespaces at the end of the root array
# Useful for generating JSON arrays

root   ::= arr
value  ::= object | array | string | number | ("true" | "false" | "null") ws

arr  ::=
  "[\n" ws (
            value
    (",\n" ws value)*
  )? "]"

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [1-9] [0-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''

LIST_GBNF = r'''
root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
'''

# xgrammar's built-in JSON grammar (as SGLang users copy it): right-recursive strings, ws
# between every token
XGRAMMAR_JSON = r'''
root ::= basic_array | basic_object
basic_any ::= basic_number | basic_string | basic_boolean | basic_null | basic_array | basic_object
basic_integer ::= ("0" | "-"? [1-9] [0-9]*) ".0"?
basic_number ::= ("0" | "-"? [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+-]? [0-9]+)?
basic_string ::= (([\"] basic_string_1 [\"]))
basic_string_1 ::= "" | [^"\\\x00-\x1F] basic_string_1 | "\\" escape basic_string_1
escape ::= ["\\/bfnrt] | "u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]
basic_boolean ::= "true" | "false"
basic_null ::= "null"
basic_array ::= "[" ("" | ws basic_any (ws "," ws basic_any)*) ws "]"
basic_object ::= "{" ("" | ws basic_string ws ":" ws basic_any ( ws "," ws basic_string ws ":" ws basic_any)*) ws "}"
ws ::= [ \n\t]*
'''

# ------------------------------------------------------------------ checkers of their own

_LIST_RE = re.compile("(?:- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+")
_MOVE = r"(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?"
_CHESS_RE = re.compile(rf"1\. {_MOVE} {_MOVE}\n(?:[1-9][0-9]?\. {_MOVE} {_MOVE}\n)+")
_EN_CHAR = r"""[a-zA-Z0-9!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]"""
_ENGLISH_RE = re.compile(rf"{_EN_CHAR}+(?:[ \t\n]{_EN_CHAR}+)*")
_JP_CHAR = "[\u3041-\u309f\u30a1-\u30ff\u3001-\u303e\u4e00-\u9fff]"
_JAPANESE_RE = re.compile(rf"{_JP_CHAR}+(?:[ \t\n]{_JP_CHAR}+)*")


def _json_value(s: str, leading: str) -> bool:
    """Whether ``s`` (after ``leading``) is one JSON document of llama.cpp's json grammars:
    ``json.loads`` reads it, and its top level is what the root asks."""
    if not s.startswith(leading):
        return False
    try:
        v = json.loads(s)
    except ValueError:
        return False
    return isinstance(v, dict if leading == "{" else list)


def _arithmetic(s: str) -> bool:
    """A recursive-descent parser of arithmetic.gbnf: ``(expr "=" ws term "\\n")+``."""
    i = 0

    def ws() -> None:
        nonlocal i
        while i < len(s) and s[i] in " \t\n":
            i += 1

    def term() -> bool:
        nonlocal i
        if i < len(s) and "a" <= s[i] <= "z":
            i += 1
            while i < len(s) and (s[i].isascii() and (s[i].isalnum() and not s[i].isupper() or s[i] == "_")):
                i += 1
            ws()
            return True
        if i < len(s) and s[i].isdigit() and s[i].isascii():
            while i < len(s) and s[i].isdigit() and s[i].isascii():
                i += 1
            ws()
            return True
        if i < len(s) and s[i] == "(":
            i += 1
            ws()
            if not expr() or i >= len(s) or s[i] != ")":
                return False
            i += 1
            ws()
            return True
        return False

    def expr() -> bool:
        nonlocal i
        if not term():
            return False
        while i < len(s) and s[i] in "-+*/":
            i += 1
            if not term():
                return False
        return True

    lines = 0
    while i < len(s):
        # a line's last term may end with a newline of its ws: that newline is the line's end
        if not expr() or i >= len(s) or s[i] != "=":
            return False
        i += 1
        ws()
        start = i
        if not term():
            return False
        if not s[start:i].endswith("\n"):
            return False
        lines += 1
    return lines > 0


CHECKERS = {
    "c": (C_GBNF, None),
    "json": (JSON_GBNF, lambda s: _json_value(s.rstrip(" \t\n"), "{")),
    "json_arr": (JSON_ARR_GBNF, lambda s: _json_value(s, "[\n")),
    "xgrammar_json": (XGRAMMAR_JSON, lambda s: _json_value(s, "{") or _json_value(s, "[")),
    "list": (LIST_GBNF, _LIST_RE.fullmatch),
    "arithmetic": (ARITHMETIC_GBNF, None),
    "chess": (CHESS_GBNF, _CHESS_RE.fullmatch),
    "english": (ENGLISH_GBNF, _ENGLISH_RE.fullmatch),
    "japanese": (JAPANESE_GBNF, _JAPANESE_RE.fullmatch),
}

# ------------------------------------------------------------------ random walks


@pytest.fixture(scope="module")
def compiler(smollm2_compiler):
    return smollm2_compiler


@pytest.fixture(scope="module")
def single_bytes(smollm2_tokenizer):
    """(ids of one-byte tokens, those of them that close something in these grammars): a walk
    past its first third goes on in them, so that it can end."""
    tok = smollm2_tokenizer
    one = [i for i in range(len(tok)) if i != tok.eos_token_id and len(tok.decode([i]).encode()) == 1]
    return frozenset(one), frozenset(i for i in one if tok.decode([i]) in ")}];\n\"=")


def _walk(cg, tok, single_bytes, rng: random.Random, steps: int) -> str | None:
    """A random walk over the matcher's masks to EOS: the text, or None when it did not end.
    Past a third of ``steps`` it takes a token that lets the text end where one of those it
    tries does, else one byte at a time, a closer half the time."""
    from treadle.constrained.decode.bitmask import allocate_token_bitmask

    one, closing = single_bytes
    eos = tok.eos_token_id
    bitmask = allocate_token_bitmask(1, len(tok))
    m = cg.matcher()
    out = bytearray()
    for step in range(steps):
        m.fill_next_token_bitmask(bitmask, 0)
        allowed = sorted(allowed_ids(bitmask[0].numpy()))
        assert allowed, ("empty mask", out.decode("utf-8", "replace"))
        if eos in allowed and (len(allowed) == 1 or step > steps // 3 or rng.random() < 0.05):
            assert m.accept_token(eos)
            return out.decode("utf-8")
        pick = rng.choice([a for a in allowed if a != eos])
        if step > steps // 3:  # steer to an end
            for a in rng.sample(allowed, min(len(allowed), 100)):
                if a != eos and m.accept_token(a):
                    done = m.can_terminate()
                    m.rollback(1)
                    if done:
                        pick = a
                        break
            else:
                small = [a for a in allowed if a in one]
                close = [a for a in small if a in closing]
                pick = rng.choice(close if close and rng.random() < 0.5 else small or [pick])
        assert m.accept_token(pick), (out.decode("utf-8", "replace"), pick)
        out += cg.token_bytes[pick]
    return None


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_random_walks_over_llamacpp_grammars_are_in_their_language(compiler, smollm2_tokenizer, single_bytes, name):
    text, check = CHECKERS[name]
    g = parse_ebnf(text)
    cg = compiler.compile(GrammarSpec("ebnf", text))
    # realistic grammars compile in about a second. Work, not seconds: no index over the whole
    # vocabulary is built (the lazy one makes its states as matchers reach them; an eager build
    # takes seconds to minutes), over a small automaton (unrolled, c.gbnf passed 200,000
    # regex characters; with calls the largest here is 14,000 characters, 9,400 NFA states)
    assert isinstance(cg.index, LazyIndex), (name, type(cg.index))
    assert len(cg.regex) <= 30_000 and cg.index.nfa.num_states <= 20_000, (name, len(cg.regex))
    rng = random.Random(name)
    ended = 0
    for _ in range(25):
        s = _walk(cg, smollm2_tokenizer, single_bytes, rng, steps=150)
        if s is None:
            continue
        ended += 1
        if check is not None:
            assert check(s), (name, s)
        elif name == "arithmetic":
            assert _arithmetic(s), (name, s)
        if len(s) <= 200:  # the fixpoint recognizer is slow on long texts
            assert recognizes(g, s), (name, s)
    assert ended >= 10, (name, ended)


def test_the_arithmetic_checker_is_a_checker():
    assert _arithmetic("1+2= 3\n") and _arithmetic("(a1 *(b-2))= x\n(((1)))=1\n")
    assert not _arithmetic("1+2=3") and not _arithmetic("(1= 2\n") and not _arithmetic("A=1\n")
    assert _LIST_RE.fullmatch("- a\n- b c\n") and not _LIST_RE.fullmatch("- a\n-b\n")


# ------------------------------------------------------------------ c.gbnf


def test_c_gbnf_runs_its_nesting_as_calls_bounded_by_brackets(compiler):
    """c.gbnf's nesting is called at its brackets: ``"{" statement* "}"`` (written after
    ``while``, ``for``, ``if`` and inside the optional ``else`` group, one rule for all four)
    and the parentheses of calls and groups; ``unaryTerm ::= "-" factor`` is a loop in
    ``factor``, not a call ending in an identifier. So few tokens cross a call's boundary and
    the compiler keeps the calls, where it used to fall back to unrolling and refuse the
    grammar (a regex of 348k characters)."""
    before, first, last, after = call_boundaries(C_GBNF)
    assert first == frozenset(b"({") and last == frozenset(b")}")
    cg = compiler.compile(GrammarSpec("ebnf", C_GBNF))
    assert cg.holes is not None
    doc = ("int main(){int x = -( -y+f(1, g(2)*-3) );while(x<10){if(x==2){x = x+1;}else{return -x;}}"
           "for(i = 0; i<n; i = i+1){print (i);}/* a */// b\n}")
    assert recognizes(parse_ebnf(C_GBNF), doc)
    m = cg.matcher()
    assert all(m.accept_token(b) for b in _one_byte_ids(cg, doc)) and m.can_terminate()
    m = cg.matcher()
    assert not all(m.accept_token(b) for b in _one_byte_ids(cg, doc.replace("else{", "else {")))


def _one_byte_ids(cg, text: str) -> list[int]:
    one = {b[0]: i for i, b in reversed(list(enumerate(cg.token_bytes))) if b and len(b) == 1}
    return [one[b] for b in text.encode()]


@pytest.mark.parametrize("text,doc", [
    # a bracketed stretch shared by several alternatives, one of them in a trailing group
    ('root ::= s+\ns ::= "x;" | "w" "{" s* "}" | "i" "{" s* "}" ("e" "{" s* "}")?', "i{w{x;}}e{i{}x;}x;"),
    # recursion at the end of another rule's only alternative
    ('root ::= f\nf ::= [a-z] | u | "(" f ")"\nu ::= "-" f', "--(-(a))"),
    ('root ::= f\nf ::= [0-9] | u\nu ::= f "!" | "~" f', "~~3!!"),
])
def test_rewrites_keep_the_language(text, doc):
    """The grammars above, compiled with calls, accept exactly what the recognizer does on
    mutations of a document (the rewrites above are the same language)."""
    from json_checks import HoleOracle
    from test_ebnf import mutations

    g = parse_ebnf(text)
    rx = ebnf_to_regex(text, calls=True)
    rng = random.Random(text)
    assert recognizes(g, doc)
    inside = 0
    for t in [doc, *mutations(doc, rng, "xwie{};()-a!~03", 60)]:
        want = recognizes(g, t)
        o = HoleOracle(rx)
        assert (o.feed(t.encode()) and o.final()) == want, t
        inside += want
    assert inside >= 2


# ------------------------------------------------------------------ Lark grammars


@pytest.mark.parametrize("text", [
    '?start: value\n?value: "a" | NUMBER\n%import common.NUMBER',
    'start: expr\nexpr: NUMBER ("+" NUMBER)*\n%import common.NUMBER\n%ignore " "',
    'root: "yes" | "no"',
    'root ::= word+\nword ::= /[a-z]+/ " "',
])
def test_lark_grammars_are_refused_naming_the_dialect(text):
    """vLLM's ``guided_grammar`` may be Lark; treadle takes GBNF (docs/structured-output.md):
    the error says the grammar looks like Lark and how a GBNF rule is written."""
    with pytest.raises(EbnfError, match=r"Lark.*GBNF.*::="):
        ebnf_to_regex(text)

"""EBNF grammars as users write them (llama.cpp's grammars/ folder, xgrammar's dialect, as
SGLang users send them): the syntax they use parses, the compiled grammar accepts real
documents in the model's own tokens, and a grammar whose recursive rules nest in each other's
first expansion (a statement and precedence-climbing expression language) compiles with calls.
Matcher-level only: no model runs."""

from __future__ import annotations

import random
import re

import pytest

from test_ebnf import derive, mutations, recognizes
from treadle.constrained import GrammarSpec
from treadle.constrained.ebnf.ebnf import EbnfError, call_boundaries, ebnf_to_regex, parse_ebnf

# ------------------------------------------------------------------ syntax of the two dialects


@pytest.mark.parametrize("variant,canonical", [
    # llama.cpp skips whitespace after each element, so a quantifier may follow a space
    ('root ::= "a" *', 'root ::= "a"*'),
    ('root ::= [a-z] + "!"', 'root ::= [a-z]+ "!"'),
    ('root ::= "a" {2,3} "b" ?', 'root ::= "a"{2,3} "b"?'),
    ('root ::= (\n  "x"\n  | "y"\n) *\n', 'root ::= ("x" | "y")*'),
    ('root ::= ws "x"\nws ::= [ \\t] * # spaces', 'root ::= ws "x"\nws ::= [ \\t]*'),
    # llama.cpp's rule names may start with a digit
    ('root ::= 2digit ":" 2digit\n2digit ::= [0-9]{2}', 'root ::= d ":" d\nd ::= [0-9]{2}'),
    # xgrammar's C-style escapes
    ('root ::= "\\f\\v\\b\\0\\a\\e\\?" [\\b\\f]', 'root ::= "\\x0c\\x0b\\x08\\x00\\x07\\x1b?" [\\x08\\x0c]'),
])
def test_dialect_spellings_mean_the_same_grammar(variant, canonical):
    assert ebnf_to_regex(variant) == ebnf_to_regex(canonical)


def test_a_class_up_to_the_last_code_point_is_every_character_a_grammar_writes(compiler):
    """[\\x00-\\U0010FFFF] ("any character") stops where the code points no grammar generates
    begin (U+100000, index_markers.py) instead of being refused as naming them; a class or
    literal only inside that range is still refused."""
    text = 'root ::= "<" [\\x00-\\U0010FFFF]+ ">"'
    assert ebnf_to_regex(text) == ebnf_to_regex('root ::= "<" [\\x00-\\U000FFFFF]+ ">"')
    assert compiler.compile(GrammarSpec("ebnf", text)).holes is None
    called = 'root ::= "(" ([\\x00-\\x27\\x2a-\\U0010FFFF] | root)* ")"'  # still runs as calls
    assert call_boundaries(called) is not None and compiler.compile(GrammarSpec("ebnf", called)).holes is not None
    for text in ('root ::= [\\U00100000-\\U0010FFFF]', 'root ::= "\\U0010FFE0"'):
        with pytest.raises(ValueError, match="reserved"):
            compiler.compile(GrammarSpec("ebnf", text))


def test_a_quantifier_still_needs_something_to_repeat():
    for text in ('root ::= * "a"', 'root ::= "a" | + "b"', 'root ::= ( ? )'):
        with pytest.raises(EbnfError, match="unexpected"):
            ebnf_to_regex(text)


# ------------------------------------------------------------------ real grammars, real documents

JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

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
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''

ARITHMETIC_GBNF = r'''
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
'''

CHESS_GBNF = r'''
root    ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")+
move    ::= (pawn | nonpawn | castle) [+#]?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?
castle  ::= "O-O" "-O"?
'''

JAPANESE_GBNF = r'''
root        ::= jp-char+ ([ \t\n] jp-char+)*
jp-char     ::= hiragana | katakana | punctuation | cjk
hiragana    ::= [ぁ-ゟ]
katakana    ::= [ァ-ヿ]
punctuation ::= [、-〾]
cjk         ::= [一-鿿]
'''

ENGLISH_GBNF = r'''
root        ::= en-char+ ([ \t\n] en-char+)*
en-char     ::= letter | digit | punctuation
letter      ::= [a-zA-Z]
digit       ::= [0-9]
punctuation ::= [!"#$%&'()*+,-./:;<=>?@[\\\]^_`{|}~]
'''

# statements and a precedence-climbing expression language: the parentheses, call arguments
# and array items nest an expr, whose every level repeats the one below, so expanding each
# called rule in place once (inside every other's first expansion) is a regex of ~730k
# characters; calling them wherever they are referenced is ~12k
PREC = r'''
root ::= stmt+
stmt ::= "let " ident " = " expr ";\n" | "if (" expr ") {\n" stmt* "}\n"
expr ::= or
or ::= and (" || " and)*
and ::= cmp (" && " cmp)*
cmp ::= sum ((" == " | " < ") sum)?
sum ::= prod ((" + " | " - ") prod)*
prod ::= unary ((" * " | " / ") unary)*
unary ::= "!" unary | atom
atom ::= ident | [0-9]+ | "(" expr ")" | ident "(" (expr (", " expr)*)? ")" | "[" (expr (", " expr)*)? "]"
ident ::= [a-z_] [a-z0-9_]*
'''

DOCUMENTS = {
    "json": (JSON_GBNF, ['{"name": "Tom", "tags": ["cat", "black"], "age": 3.5e2, "x": {"y": [null, true, -0]}}',
                         '{\n  "a": "caf\\u00e9 \\"q\\"\\n",\n  "b": []\n}', "{}"]),
    "arithmetic": (ARITHMETIC_GBNF, ["1+2= 3\n", "(a1 *(b-2))= x\n(((1)))=1\n"]),
    "chess": (CHESS_GBNF, ["1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n", "1. d4 d5\n12. O-O-O exd8=Q#\n"]),
    "japanese": (JAPANESE_GBNF, ["こんにちは、世界。", "日本語 カタカナ\nひらがな"]),
    "english": (ENGLISH_GBNF, ["Hello, world! It's 5 o'clock [really] {ok} a\\b."]),
    "prec": (PREC, ["let x = 1;\n",
                    "if (a && !b || f(1, [2, (3 + x) * 4]) == 5) {\nlet y = g();\nif (y < 2) {\n}\n}\n",
                    "let z = ((((((1))))));\n", "let w = h(h(h(h(h(h([])))))) / !!k;\n"]),
}


@pytest.fixture(scope="module")
def compiler(smollm2_compiler):
    return smollm2_compiler


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_real_grammars_accept_real_documents(compiler, smollm2_tokenizer, name):
    """Each document is in the grammar (the recognizer says so) and the compiled grammar
    accepts it in the tokenizer's own tokens and one byte a token, then EOS."""
    tok = smollm2_tokenizer
    text, docs = DOCUMENTS[name]
    g = parse_ebnf(text)
    cg = compiler.compile(GrammarSpec("ebnf", text))
    one = {b[0]: i for i, b in reversed(list(enumerate(cg.token_bytes))) if b and len(b) == 1
           and i != tok.eos_token_id}
    for doc in docs:
        assert recognizes(g, doc), (name, doc)
        for ids in (tok.encode(doc, add_special_tokens=False), [one[b] for b in doc.encode()]):
            m = cg.matcher()
            for k, t in enumerate(ids):
                assert m.accept_token(t), (name, doc, tok.decode(ids[:k]), tok.decode([t]))
            assert m.accept_token(tok.eos_token_id), (name, doc)


def test_rules_nesting_in_each_other_call_wherever_referenced(compiler):
    """PREC's called rules, each expanded in place at its first entry, are a regex past
    MAX_REGEX_CHARS: every reference to them is then a call, and the grammar runs at any
    depth, exactly (an oracle that runs the calls, against the recognizer)."""
    from json_checks import HoleOracle

    rx = ebnf_to_regex(PREC, calls=True)
    assert call_boundaries(PREC) is not None and len(rx) < 50_000
    assert compiler.compile(GrammarSpec("ebnf", PREC)).holes is not None
    g = parse_ebnf(PREC)
    rng = random.Random(5)
    checked_out = 0
    for s in [*DOCUMENTS["prec"][1], *(derive(g, rng, budget=8) for _ in range(20))]:
        if len(s) > 120:
            continue
        for t in [s, *mutations(s, rng, "()[]!, =;\nabx1", 3)]:
            inside = recognizes(g, t)
            o = HoleOracle(rx)
            assert (o.feed(t.encode()) and o.final()) == inside, t
            checked_out += not inside
    assert checked_out >= 10
    assert re.search("over the 200000 supported", _unrolled_error(PREC))


def _unrolled_error(text: str) -> str:
    with pytest.raises(EbnfError) as info:
        ebnf_to_regex(text)  # unrolled 3 levels: too large, as before
    return str(info.value)


# left recursion written with a leading group (ISO-EBNF style lists and expressions): a loop,
# like 'list ::= list "," item | item', not three unrolled levels
LEFT_GROUPS = {
    "optional": ('root ::= list\nlist ::= (list ",")? item\nitem ::= [0-9]+', ",".join(["12"] * 40)),
    "operators": ('root ::= expr\nexpr ::= (expr ("+" | "-"))? term\nterm ::= [0-9]+ | "(" expr ")"',
                  "+".join(["1"] * 30) + "-(2+3+4+5+6+7)"),
    "alternative": ('root ::= r\nr ::= ("a" | r) "b" | "c"', "c" + "b" * 30),
    "nested_group": ('root ::= r\nr ::= ((r "x") "y")? "z"', "z" + "xyz" * 20),
}


@pytest.mark.parametrize("name", sorted(LEFT_GROUPS))
def test_left_recursion_through_a_leading_group_is_a_loop(compiler, smollm2_tokenizer, name):
    text, doc = LEFT_GROUPS[name]
    g = parse_ebnf(text)
    assert recognizes(g, doc)
    m = compiler.compile(GrammarSpec("ebnf", text)).matcher()
    assert all(m.accept_token(t) for t in smollm2_tokenizer.encode(doc, add_special_tokens=False)), doc
    assert m.accept_token(smollm2_tokenizer.eos_token_id)
    if name != "operators":  # no nesting left: the regex is exactly the grammar
        rx = re.compile(ebnf_to_regex(text))
        rng = random.Random(name)
        for _ in range(30):
            s = derive(g, rng, budget=10)
            for t in [s, *mutations(s, rng, ",+-()abcxyz12", 3)]:
                assert bool(rx.fullmatch(t)) == recognizes(g, t), t

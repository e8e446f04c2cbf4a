"""EBNF grammars (constrained/ebnf/ebnf.py): the parser, the regex each grammar becomes checked
against an independent recognizer of the grammar itself, clear errors, and token-level walks
through the compiled grammar with the real SmolLM2 vocabulary."""

from __future__ import annotations

import random
import re

import interegular
import pytest

from treadle.constrained import GrammarSpec
from treadle.constrained.ebnf.ebnf import (
    Alt, Cls, EbnfError, Lit, Ref, Rep, Seq, ebnf_to_regex, parse_ebnf,
)
from json_checks import allowed_ids

# ------------------------------------------------------------------ an independent recognizer


def recognizes(grammar, s: str) -> bool:
    """Whether ``s`` is in the language of the parsed grammar, with unbounded recursion: the
    least fixpoint of "rule r at position i can end at j", iterated to convergence (left
    recursion included). Shares nothing with the regex emitter but the parsed tree."""
    n = len(s)
    ends: dict[tuple[str, int], frozenset[int]] = {}

    def run(node, i: int) -> set[int]:
        if isinstance(node, Lit):
            return {i + len(node.text)} if s.startswith(node.text, i) else set()
        if isinstance(node, Cls):
            if i >= n:
                return set()
            cp = ord(s[i])
            inside = any(lo <= cp <= hi for lo, hi in node.ranges)
            return {i + 1} if inside != node.negated else set()
        if isinstance(node, Ref):
            return set(ends.get((node.name, i), ()))
        if isinstance(node, Seq):
            cur = {i}
            for item in node.items:
                cur = {k for j in cur for k in run(item, j)}
            return cur
        if isinstance(node, Alt):
            return {k for item in node.items for k in run(item, i)}
        if isinstance(node, Rep):
            cur, out = {i}, set()
            for _ in range(node.min):
                cur = {k for j in cur for k in run(node.item, j)}
            if node.max is None:
                seen, todo = set(cur), list(cur)
                while todo:
                    j = todo.pop()
                    for k in run(node.item, j):
                        if k not in seen:
                            seen.add(k)
                            todo.append(k)
                return seen
            out |= cur
            for _ in range(node.max - node.min):
                cur = {k for j in cur for k in run(node.item, j)}
                out |= cur
            return out
        raise TypeError(node)

    changed = True
    while changed:
        changed = False
        for name in _rules_bottom_up(grammar):
            body = grammar.rules[name]
            for i in range(n + 1):
                new = frozenset(run(body, i))
                if new != ends.get((name, i), frozenset()):
                    ends[(name, i)] = new
                    changed = True
    return n in ends.get((grammar.root, 0), ())


def _rules_bottom_up(grammar) -> list[str]:
    """The rule names, each after the rules it refers to (recursion aside): the fixpoint above
    is the same in any order, and this one needs fewer rounds to reach it."""
    order: list[str] = []
    seen: set[str] = set()

    def refs(node):
        if isinstance(node, Ref):
            yield node.name
        elif isinstance(node, (Seq, Alt)):
            for item in node.items:
                yield from refs(item)
        elif isinstance(node, Rep):
            yield from refs(node.item)

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for r in refs(grammar.rules[name]):
            visit(r)
        order.append(name)

    for name in grammar.rules:
        visit(name)
    return order


def derive(grammar, rng: random.Random, budget: int = 6) -> str:
    """A random sentence of the grammar; recursion stops choosing recursive options once the
    budget of rule entries along a path runs out (so sentences stay short)."""

    def gen(node, depth: int) -> str:
        if isinstance(node, Lit):
            return node.text
        if isinstance(node, Cls):
            if node.negated:
                pool = [c for c in "azAZ09 ,.\n\"é[]" if not any(lo <= ord(c) <= hi for lo, hi in node.ranges)]
                return rng.choice(pool)
            lo, hi = rng.choice(node.ranges)
            return chr(rng.randint(lo, min(hi, lo + 40)))
        if isinstance(node, Ref):
            return gen(grammar.rules[node.name], depth + 1)
        if isinstance(node, Seq):
            return "".join(gen(x, depth) for x in node.items)
        if isinstance(node, Alt):
            options = list(node.items)
            if depth >= budget:
                options.sort(key=lambda x: _size(grammar, x, set()))
                options = options[:1]
            return gen(rng.choice(options), depth)
        if isinstance(node, Rep):
            hi = node.min + 3 if node.max is None else node.max
            k = node.min if depth >= budget else rng.randint(node.min, min(hi, node.min + 3))
            return "".join(gen(node.item, depth) for _ in range(k))
        raise TypeError(node)

    return gen(grammar.rules[grammar.root], 0)


def _size(grammar, node, seen: set) -> int:
    """How much a node expands (references count heavily): picks the least recursive option."""
    if isinstance(node, Ref):
        if node.name in seen:
            return 1000
        return 10 + _size(grammar, grammar.rules[node.name], seen | {node.name})
    if isinstance(node, Seq):
        return sum(_size(grammar, x, seen) for x in node.items)
    if isinstance(node, Alt):
        return min(_size(grammar, x, seen) for x in node.items)
    if isinstance(node, Rep):
        return 0 if node.min == 0 else node.min * _size(grammar, node.item, seen)
    return 1


def mutations(s: str, rng: random.Random, alphabet: str, count: int) -> list[str]:
    out = []
    for _ in range(count):
        t = list(s)
        op = rng.randrange(3)
        if op == 0 and t:
            del t[rng.randrange(len(t))]
        elif op == 1:
            t.insert(rng.randrange(len(t) + 1), rng.choice(alphabet))
        elif t:
            t[rng.randrange(len(t))] = rng.choice(alphabet)
        out.append("".join(t))
    return out


def nesting(s: str, open_: str, close: str) -> int:
    d = best = 0
    for c in s:
        d += c == open_
        d -= c == close
        best = max(best, d)
    return best


# Grammars whose recursion is a loop (or absent): the regex is exact.
EXACT = {
    "words": 'root ::= word (" " word)*\nword ::= [a-z]+',
    "right_list": 'root ::= "[" list "]"\nlist ::= item ", " list | item\nitem ::= [a-c]+ | "\\"" [^"]* "\\""',
    "left_sum": 'root ::= sum\nsum ::= sum "+" num | sum "-" num | num\nnum ::= "0" | [1-9] [0-9]{0,2}',
    "both_ends": 'root ::= "<" r ">"\nr ::= "a" r | r "b" | "c" # a* c b*',
    "escapes": 'root ::= "\\t" [\\x41-\\x43] "\\u00e9"? [^\\n\\]]{2,3} "\\\\"',
    "empty_alt": 'root ::= "x" ( "-" | ) "y"{1,2} ("z" | "w")?',
    "any_char": 'root ::= "<" . . ">"',
    "empty_first": 'root ::= "[" ws item (ws "," ws item)* ws "]"\nws ::= | " " | "\\n"\nitem ::= [a-z]+',
    "multiline": '''# a key=value config
root ::= line
         ("\\n" line)*
line ::= key "=" value   # a comment after a rule
key ::= [a-z_]+
value ::= "\\"" [^"\\n]* "\\"" | [0-9]+ | "true"
        | "false"''',
}
# Grammars that nest: unrolled 3 levels, the regex accepts a subset: every sentence whose
# brackets nest at most 3 deep where the last field is True (for "binary" a right-nested
# "+" also costs a level, so only soundness is checked).
NESTED = {
    "arith": ('root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\n'
              'factor ::= [0-9] | "(" expr ")"', "(", ")", True),
    "mutual": ('root ::= a\na ::= "[" b "]" | "x"\nb ::= a ("," a)*', "[", "]", True),
    "dyck": ('root ::= "<" e ">"\ne ::= "(" e ")" e | ""', "(", ")", True),
    "binary": ('root ::= e\ne ::= e "+" e | "(" e ")" | "1"', "(", ")", False),
    "spaced_lists": ('root ::= value\nvalue ::= "[" ws (value (ws "," ws value)*)? ws "]" | [0-9]\n'
                     'ws ::= | " "', "[", "]", True),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_grammars_equal_the_recognizer(name):
    text = EXACT[name]
    g = parse_ebnf(text)
    rx = re.compile(ebnf_to_regex(text))
    rng = random.Random(name)
    alphabet = "".join(sorted(set("".join(derive(g, rng) for _ in range(30))))) or "a"
    checked_in = checked_out = 0
    for _ in range(60):
        s = derive(g, rng)
        assert recognizes(g, s), (name, s)  # the generator and the recognizer agree
        assert rx.fullmatch(s), (name, s)
        checked_in += 1
        for t in mutations(s, rng, alphabet, 4):
            assert bool(rx.fullmatch(t)) == recognizes(g, t), (name, t)
            checked_out += not recognizes(g, t)
    assert checked_in == 60 and checked_out >= 10, checked_out


@pytest.mark.parametrize("name", sorted(NESTED))
def test_nested_grammars_unroll_soundly(name):
    text, open_, close, complete = NESTED[name]
    g = parse_ebnf(text)
    rx = re.compile(ebnf_to_regex(text, max_recursion_depth=3))
    rng = random.Random(name)
    alphabet = "".join(sorted(set("".join(derive(g, rng) for _ in range(30)))))
    shallow = 0
    for _ in range(80):
        s = derive(g, rng, budget=9)
        assert recognizes(g, s), (name, s)
        if nesting(s, open_, close) <= 3 and complete:
            assert rx.fullmatch(s), (name, s)  # within the unrolled depth: allowed
        shallow += bool(rx.fullmatch(s))
        for t in [s, *mutations(s, rng, alphabet, 4)]:
            if rx.fullmatch(t):
                assert recognizes(g, t), (name, t)  # never outside the grammar
                assert nesting(t, open_, close) <= 4, (name, t)
    assert shallow > 10
    inner = {"binary": "1", "mutual": "x", "dyck": "", "arith": "7", "spaced_lists": "1"}[name]
    deeper = open_ * 5 + inner + close * 5
    if name == "dyck":
        deeper = "<" + deeper + ">"
    assert recognizes(g, deeper) and not rx.fullmatch(deeper)
    assert re.fullmatch(ebnf_to_regex(text, max_recursion_depth=5), deeper)


def test_loop_rewrite_has_no_depth_limit():
    rx = ebnf_to_regex('root ::= "[" list "]"\nlist ::= item "," list | item\nitem ::= [0-9]+')
    assert re.fullmatch(rx, "[" + ",".join(str(i) for i in range(200)) + "]")
    rx = ebnf_to_regex('root ::= root "+" n | n\nn ::= [0-9]')
    assert re.fullmatch(rx, "+".join("7" * 300))
    assert len(rx) < 40, rx


def test_parse_tree():
    g = parse_ebnf('root ::= "ab" [^x-z] | ( r )* r{2,}\nr ::= .?')
    assert g.root == "root" and set(g.rules) == {"root", "r"}
    body = g.rules["root"]
    assert isinstance(body, Alt) and len(body.items) == 2
    first, second = body.items
    assert first == Seq((Lit("ab"), Cls(True, ((ord("x"), ord("z")),))))
    assert isinstance(second, Seq) and second.items[0] == Rep(Ref("r", 1, 26), 0, None)
    assert second.items[1].min == 2 and second.items[1].max is None
    assert g.rules["r"] == Rep(Cls(True, ()), 0, 1)


def test_regexes_are_in_the_shared_dialect():
    """Every regex parses in Python re and interegular (Rust's reading is checked by the
    token-level tests, whose index outlines-core builds from it)."""
    for text in [*EXACT.values(), *(v[0] for v in NESTED.values())]:
        rx = ebnf_to_regex(text)
        re.compile(rx)
        interegular.parse_pattern(rx).to_fsm()


@pytest.mark.parametrize("text,needle", [
    ("", "empty"),
    ("   # only a comment\n", "empty"),
    ('start ::= "a"', "no rule named 'root'"),
    ('root ::= item', "'item' is used in 'root' but never defined"),
    ('root ::= "a"\nroot ::= "b"', "line 2 col 1: rule 'root' is defined twice"),
    ('root ::= "abc', "line 1 col 10: unterminated string literal"),
    ('root ::= [abc', "unterminated character class"),
    ('root ::= []', "empty character class"),
    ('root ::= [z-a]', "reversed"),
    ('root ::= ("a" | "b"', "expected ')'"),
    ('root ::= "a"{3,2}', "maximum is below the minimum"),
    ('root ::= "a"{1000}', "counts above 256"),
    ('root ::= "a"{x}', "bad quantifier"),
    ("root ::= 'a'", "double quotes"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\ud800"', "not a Unicode scalar value"),
    ('root ::= "\\x4"', "needs 2 hex digits"),
    ('root ::= "a" (= "b")', "lookahead"),
    ('root = "a"', "expected '::='"),
    ('root ::= "(" root ")"', "matches nothing within 3 levels"),
    ('root ::= ""', "only the empty string"),
    ('root ::= "a" @', "unexpected '@'"),
])
def test_errors_name_the_problem(text, needle):
    with pytest.raises(EbnfError) as info:
        ebnf_to_regex(text)
    assert needle in str(info.value), str(info.value)
    assert isinstance(info.value, ValueError)


def test_blow_up_is_refused():
    # each level doubles: 2^k copies, refused rather than built for minutes
    text = 'root ::= a\na ::= "(" a a ")" | "x"'
    assert re.fullmatch(ebnf_to_regex(text, max_recursion_depth=2), "((xx)(xx))")
    with pytest.raises(EbnfError, match="over the 200000 supported"):
        ebnf_to_regex(text, max_recursion_depth=20)


def test_spec_from_params():
    assert GrammarSpec.from_params(ebnf='root ::= "a"') == GrammarSpec("ebnf", 'root ::= "a"')
    with pytest.raises(ValueError, match="at most one"):
        GrammarSpec.from_params(regex="a", ebnf='root ::= "a"')
    with pytest.raises(ValueError, match="non-empty string"):
        GrammarSpec.from_params(ebnf="  ")
    with pytest.raises(ValueError, match="never defined"):
        GrammarSpec.from_params(ebnf="root ::= x").to_regex()


# ------------------------------------------------------------------ token level, real vocabulary


@pytest.fixture(scope="module")
def compiler(smollm2_compiler):
    return smollm2_compiler


@pytest.fixture(scope="module")
def closers(smollm2_tokenizer):
    """The ids whose text is one of the closers the walks below steer to: decoded once, not the
    whole allowed list at every step (~5M decodes, most of the walks' time)."""
    tok = smollm2_tokenizer
    return frozenset(i for i in range(len(tok)) if tok.decode([i]) in (")", "]", ">", '"'))


@pytest.mark.parametrize("name", ["right_list", "left_sum", "multiline", "arith", "mutual", "dyck"])
def test_random_token_walks_end_in_the_grammar(compiler, smollm2_tokenizer, closers, name):
    from treadle.constrained.decode.bitmask import allocate_token_bitmask

    text = EXACT[name] if name in EXACT else NESTED[name][0]
    g = parse_ebnf(text)
    tok = smollm2_tokenizer
    eos = tok.eos_token_id
    cg = compiler.compile_async(GrammarSpec("ebnf", text)).result(timeout=120)
    bitmask = allocate_token_bitmask(1, len(tok))
    rng = random.Random(name)
    ended = 0
    for _ in range(12):
        m = cg.matcher()
        ids: list[int] = []
        for step in range(80):
            m.fill_next_token_bitmask(bitmask, 0)
            allowed = sorted(allowed_ids(bitmask[0].numpy()))
            assert allowed, tok.decode(ids)
            if eos in allowed and (step > 20 or len(allowed) == 1 or rng.random() < 0.15):
                assert m.accept_token(eos)
                ended += 1
                break
            pick = rng.choice([a for a in allowed if a != eos] or allowed)
            if step > 15:  # steer to an end: a token after which the text is complete, or a closer
                for a in rng.sample(allowed, min(len(allowed), 200)):
                    if a != eos and m.accept_token(a):
                        done = m.can_terminate()
                        m.rollback(1)
                        if done:
                            pick = a
                            break
                else:
                    pick = next((a for a in allowed if a in closers), pick)
            assert m.accept_token(pick)
            ids.append(pick)
        else:
            continue
        out = tok.decode(ids)
        assert recognizes(g, out), (name, out)
    assert ended >= 6


def test_natural_tokenization_is_accepted_and_jumps_are_forced(compiler, smollm2_tokenizer):
    tok = smollm2_tokenizer
    text = EXACT["multiline"]
    cg = compiler.compile_async(GrammarSpec("ebnf", text)).result(timeout=120)
    doc = 'name="treadle"\nport=30000\ndebug=false'
    m = cg.matcher()
    for t in tok.encode(doc, add_special_tokens=False):
        assert m.accept_token(t), tok.decode([t])
    assert m.accept_token(tok.eos_token_id)
    # after "debug=f" the value can only be "false": jump-forward offers the rest
    m = cg.matcher()
    for t in tok.encode("debug=f", add_special_tokens=False):
        assert m.accept_token(t)
    assert m.find_jump_forward_string() == "alse"


def test_recursion_depth_is_a_compiler_setting(smollm2_tokenizer):
    from treadle.constrained.compile.compiler import GrammarCompiler
    from treadle.constrained.index.json_holes import ENTRY_CHAR
    from treadle.runtime.engine_args import EngineArgs

    tok = smollm2_tokenizer
    # left recursion through another rule: calls cannot nest it, so this grammar unrolls
    text = 'root ::= a\na ::= b "x" | "(" a ")" | "y"\nb ::= a "z"'
    deep = "((((y))))"  # four levels of parentheses
    with GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok), max_recursion_depth=4) as c4, \
            GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok)) as c3:
        for c, ok in ((c4, True), (c3, False)):
            cg = c.compile(GrammarSpec("ebnf", text))
            assert cg.holes is None and ENTRY_CHAR not in cg.regex
            m = cg.matcher()
            accepted = all(m.accept_token(t) for t in tok.encode(deep, add_special_tokens=False))
            assert accepted == ok and (not ok or m.accept_token(tok.eos_token_id))
    # JSON schema $ref cycles: calls to any depth in compact output (json_holes.py); under a
    # whitespace pattern they unroll, and the setting bounds them too
    tree = {"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                            "required": ["c"]}}, "$ref": "#/$defs/n"}
    doc = '{"c":[{"c":[{"c":[{"c":[{"c":[]}]}]}]}]}'
    for ws, depth, ok in ((None, 3, True), (None, 4, True), ("[ ]?", 3, False), ("[ ]?", 4, True)):
        with GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok), max_recursion_depth=depth,
                             whitespace_pattern=ws) as c:
            m = c.compile(GrammarSpec.from_params(json_schema=tree)).matcher()
            assert all(m.accept_token(t) for t in tok.encode(doc, add_special_tokens=False)) == ok, (ws, depth)
    with pytest.raises(ValueError, match="grammar_max_recursion_depth"):
        EngineArgs(grammar_max_recursion_depth=-1)
    with pytest.raises(ValueError, match="max_recursion_depth must be >= 0"):
        GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok), max_recursion_depth=-2)


def test_any_text_gives_a_regex_or_an_ebnf_error():
    """Fuzz: grammar-ish text either compiles to a regex Python accepts or raises EbnfError
    (a ValueError, so a 400), never another exception."""
    pieces = ['root', ' ::= ', '::=', ' a ', 'b', ' | ', '|', '(', ')', '"x"', '"', '""', '[a-z]', '[^a]', '[',
              ']', '*', '+', '?', '{2}', '{1,3}', '{,2}', '{', '}', '\n', ' ', '.', '#c\n', '\\n', '\\', 'a ::= ',
              'b ::= ', '"\\u00e9"', '[\\x00-\\x1f]', '-', '^', 'root ::= a\n', 'a ::= "(" a ")" | ""\n',
              'b ::= b "x" | ""\n', 'ws ::= | " "\n', 'a ::= "[" a ("," a)* "]" | "x"\n', 'a ::= "{" b a "}" | b\n',
              'b ::= "<" a ws b ">" | "y"\n']
    from treadle.constrained.ebnf.ebnf import call_boundaries
    from treadle.constrained.index.json_holes import ENTRY_CHAR

    rng = random.Random(7)
    compiled = called = 0
    for _ in range(4000):
        start = rng.choice(["", "root ::= ", "root ::= a\na ::= ", "root ::= b\nb ::= \"(\" "])
        text = start + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 14)))
        try:
            re.compile(ebnf_to_regex(text))
            compiled += 1
        except EbnfError:
            pass
        try:  # with calls: a regex with definitions exactly when there are boundaries, else the same errors
            rx = ebnf_to_regex(text, calls=True)
            bounds = call_boundaries(text)
            assert (ENTRY_CHAR in rx) == (bounds is not None), text
            interegular.parse_pattern(rx).to_fsm()
            called += bounds is not None
        except EbnfError:
            pass
    assert compiled > 50 and called > 5, (compiled, called)


def test_too_deep_grammars_are_an_ebnf_error():
    # twelve rules that all call each other, unrolled 16 levels: deeper than Python's stack
    rules = ["root ::= r0"] + [f'r{i} ::= "x" | ' + " | ".join(f'"{chr(97 + j)}" r{j}' for j in range(12) if j != i)
                               for i in range(12)]
    with pytest.raises(EbnfError, match="expands too deeply|over the 200000 supported"):
        ebnf_to_regex("\n".join(rules), max_recursion_depth=16)
    with pytest.raises(EbnfError, match="nest too deeply to parse"):
        ebnf_to_regex("root ::= " + "(" * 5000 + '"a"' + ")" * 5000)
    chain = ["root ::= r0"] + [f"r{i} ::= \"a\" r{i + 1}" for i in range(3000)] + ['r3000 ::= "z"']
    with pytest.raises(EbnfError, match="expands too deeply"):
        ebnf_to_regex("\n".join(chain))


# ------------------------------------------------------------------ nesting recursion as calls

# compact and spaced JSON-like grammars: calls behind ':' '[' ',' and behind optional whitespace
JSON_LIKE = ('root ::= value\nvalue ::= object | array | string | number | "true" | "false" | "null"\n'
             'object ::= "{" (member ("," member)*)? "}"\nmember ::= string ":" value\n'
             'array ::= "[" (value ("," value)*)? "]"\nstring ::= "\\"" [^"\\\\]* "\\""\nnumber ::= "-"? [0-9]+')
JSON_WS = ('root ::= value\nvalue ::= object | array | string | number | "true" | "false" | "null"\n'
           'object ::= "{" ws (member (ws "," ws member)*)? ws "}"\nmember ::= string ws ":" ws value\n'
           'array ::= "[" ws (value (ws "," ws value)*)? ws "]"\nstring ::= "\\"" [^"\\\\]* "\\""\n'
           'number ::= "-"? [0-9]+\nws ::= [ \\t\\n]*')
CALLED = {**{k: v[0] for k, v in NESTED.items()}, "json_like": JSON_LIKE, "json_ws": JSON_WS,
          # right recursion through another rule: tail calls
          "tail": 'root ::= a\na ::= "x" b | "y"\nb ::= "z" a',
          # a class beside a call at one state: the class must not hide the call
          "balanced": 'root ::= "(" ([^()] | root)* ")"',
          # the call is the alternative that nests, '(' ... ')', not sexp (whose atoms would
          # let ~21k tokens such as ' word' cross into it)
          "sexp": ('root ::= sexp\nsexp ::= atom | "(" ws? (sexp (ws sexp)*)? ws? ")"\n'
                   'atom ::= [a-z+*/<>=-]+ | [0-9]+\nws ::= [ \\n]+'),
          # items side by side with no separator ('(ab)' is also '(a b)'): 34 tokens cross a
          # call to the list alternative, ~45k would cross calls to sexp
          "sexp_juxt": 'root ::= sexp\nsexp ::= atom | "(" sexp* ")"\natom ::= [a-z]+',
          # the call is '(' args ')' of one alternative, not the call expression that
          # begins with a name (~21.6k tokens such as ' foo' would cross into that)
          "fn": 'root ::= expr\nexpr ::= name "(" (expr (", " expr)*)? ")" | [0-9]+\nname ::= [a-z_]+',
          # the call is '>' content '</' (tags are literals inside elem's one alternative)
          "xml": 'root ::= elem\nelem ::= "<" name ">" (elem | [^<>]+)* "</" name ">"\nname ::= [a-z]+'}


BRACKETS = ("()", "[]", "{}", "<>")
DEEP = {  # six levels and more: past what the unrolled regex allows
    "arith": "(" * 7 + "1+2" + ")" * 7 + "*(3)", "mutual": "[x,[x,[x,[x,[x,[x]]]]]]",
    "dyck": "<" + "(" * 7 + ")" * 7 + "()>", "binary": "(" * 7 + "1+1" + ")" * 7,
    "spaced_lists": "[ " * 6 + "1" + " ]" * 6, "json_like": '{"a":' * 6 + '[1,"x"]' + "}" * 6,
    "json_ws": '{ "a" : ' * 6 + '[1, "x y"]' + " }" * 6, "tail": "xz" * 20 + "y",
    "balanced": "(a(b c(" + "(" * 5 + "d" + ")" * 5 + "))e)",
    "sexp": "(a (b (c (d (e (f g 1))))) (+ 2 3))",
    "sexp_juxt": "(ab(c(d(e(f(gh)i))))(j))",
    "fn": "f(g(1, h(i(j(k(2), 3)))), m(4))",
    "xml": "<a><b>x<c><d><e><f>y</f>z</e></d></c></b><g>w</g></a>",
}


@pytest.mark.parametrize("name", sorted(CALLED))
def test_calls_are_the_grammar_at_any_depth(name):
    """With calls, the regex and its definitions, run as a stack of calls by an oracle that
    knows nothing of json_holes.py (tests/json_checks.py), accept exactly the grammar's
    sentences, however deep: checked against the recognizer on deep derivations and their
    mutations."""
    from json_checks import HoleOracle

    from treadle.constrained.index.json_holes import CALL_CHARS, ENTRY_CHAR

    text = CALLED[name]
    g = parse_ebnf(text)
    rx = ebnf_to_regex(text, calls=True)
    assert ENTRY_CHAR in rx and CALL_CHARS[0] in rx
    if name in ("arith", "json_like", "json_ws"):
        assert len(rx) * 5 < len(ebnf_to_regex(text)), name  # three levels unrolled
    rng = random.Random(name)
    alphabet = "".join(sorted(set("".join(derive(g, rng) for _ in range(30))))) + " "
    deep = DEEP[name]
    assert recognizes(g, deep) and (name == "tail" or max(nesting(deep, o, c) for o, c in BRACKETS) >= 6
                                    or deep.count("><") >= 5)
    checked_out = 0
    for s in [deep, *(derive(g, rng, budget=9) for _ in range(25))]:
        for t in [s, *mutations(s, rng, alphabet, 3)]:
            o = HoleOracle(rx)
            inside = recognizes(g, t)
            assert (o.feed(t.encode()) and o.final()) == inside, (name, t)
            checked_out += not inside
    assert checked_out >= 10


def _random_grammar(rng: random.Random) -> str:
    """2-3 rules of literals, classes and references to any rule (so recursion of every
    kind: loops, nesting, mutual, left through other rules), with quantifiers and empties."""
    names = ["root", "a", "b"][:rng.randint(2, 3)]

    def item(depth: int) -> str:
        r = rng.random()
        if r < 0.4:
            return rng.choice(['"("', '")"', '"x"', '","', '"ab"', '" "', '""'])
        if r < 0.5:
            return rng.choice(["[0-9]", "[a-c]", "[^()]"])
        if r < 0.8 or depth > 0:
            return rng.choice(names[1:] + names[:1] * (rng.random() < 0.2))
        return "(" + " | ".join(seq(depth + 1) for _ in range(rng.randint(1, 2))) + ")" + rng.choice(["", "*", "?", "+"])

    def seq(depth: int) -> str:
        return " ".join(item(depth) for _ in range(rng.randint(1, 3)))

    return "\n".join(f"{n} ::= " + " | ".join(seq(0) for _ in range(rng.randint(1, 2))) for n in names)


def test_random_grammars_with_calls_equal_the_recognizer(smollm2_tokenizer):
    """Random small grammars: with calls, either an EbnfError, the unrolled regex (calls
    cannot run), or a regex whose calls accept exactly the grammar's sentences, as an
    oracle runs them (tests/json_checks.py) and as the compiled matcher does, one byte a
    token and in the tokenizer's own tokens."""
    from json_checks import HoleOracle

    from treadle.constrained.compile.compiler import build_compiled_grammar
    from treadle.constrained.ebnf.ebnf import call_boundaries

    tok = smollm2_tokenizer
    eos = tok.eos_token_id
    rng = random.Random(11)
    called = checked = 0
    one = None
    for _ in range(150):
        text = _random_grammar(rng)
        try:
            rx = ebnf_to_regex(text, calls=True)
        except EbnfError:
            continue
        if call_boundaries(text) is None:
            continue
        called += 1
        g = parse_ebnf(text)
        cg = build_compiled_grammar(rx, tok, [eos], vocab_size=len(tok), spec=GrammarSpec("ebnf", text))
        if one is None:
            one = {b[0]: i for i, b in reversed(list(enumerate(cg.token_bytes))) if b and len(b) == 1 and i != eos}
        for _ in range(3):
            try:
                s = derive(g, rng, budget=6)
            except RecursionError:  # the generator followed a rule with no finite text
                continue
            if len(s) > 24:
                continue
            for t in [s, *mutations(s, rng, "(),x ab0", 2)]:
                inside = recognizes(g, t)
                o = HoleOracle(rx)
                assert (o.feed(t.encode()) and o.final()) == inside, (text, t)
                for ids in ([one[b] for b in t.encode()], tok.encode(t, add_special_tokens=False)):
                    m = cg.matcher()
                    assert (all(m.accept_token(i) for i in ids) and m.can_terminate()) == inside, (text, t, ids)
                checked += 1
    assert called > 10 and checked > 60, (called, checked)


def test_calls_fall_back_to_unrolling_where_they_cannot_run(compiler):
    from treadle.constrained.ebnf.ebnf import call_boundaries

    # left recursion through another rule: a stack of calls cannot nest it at one position
    left = 'root ::= a\na ::= b "x" | "y"\nb ::= a "z" | "w"'
    assert call_boundaries(left) is None
    assert ebnf_to_regex(left, calls=True) == ebnf_to_regex(left)
    # no recursion, or only loops: nothing to call
    assert call_boundaries(EXACT["right_list"]) is None
    # the boundary bytes of arithmetic: the call is the alternative of factor that nests,
    # '(' expr ')', entered after an operator or '(' and left before one or ')'
    before, first, last, after = call_boundaries(NESTED["arith"][0])
    assert first == {ord("(")} and last == {ord(")")}
    assert before == set(b"(+-*/") and after == set(b")+-*/")
    # the stretch of an alternative between the literals around its nesting: '(' args ')'
    # of a call expression, '>' content '</' of an element
    assert call_boundaries(CALLED["fn"])[1:3] == ({ord("(")}, {ord(")")})
    assert call_boundaries(CALLED["xml"])[1:3] == ({ord(">")}, {ord("/")})
    # where a whole rule nests, it is the call: a digit may start and end it
    assert call_boundaries('root ::= "[" e "]"\ne ::= [0-9] ("," e)* | "(" e ")"')[1] == set(b"(0123456789")
    # a grammar naming the reserved code points of the placeholders never has calls; the
    # compiler refuses it, as before
    reserved = 'root ::= "(" root ")" | "\\U0010FFE0"'
    assert call_boundaries(reserved) is None and ebnf_to_regex(reserved, calls=True) == ebnf_to_regex(reserved)
    with pytest.raises(EbnfError, match="matches nothing \\(does some rule recurse"):
        ebnf_to_regex('root ::= "(" root ")"', calls=True)
    with pytest.raises(ValueError, match="reserved"):
        compiler.compile(GrammarSpec("ebnf", reserved))
    # letters nested in letters: every token of two letters could cross a call, more than
    # MAX_CROSSING to walk per mask row, so the compiler unrolls this one
    letters = 'root ::= w\nw ::= [a-z] w? [a-z]'
    assert call_boundaries(letters) is not None
    cg = compiler.compile(GrammarSpec("ebnf", letters))
    assert cg.holes is None and cg.regex == ebnf_to_regex(letters)
    assert compiler.compile(GrammarSpec("ebnf", CALLED["sexp_juxt"])).holes is not None


CALL_PREFIXES = {
    "arith": ["", "(", "((((", "((((1+(2*", "(1+(2*(3-4)", "((((7))))"],
    "dyck": ["<", "<((()((", "<(()(", "<((()))"],
    "json_ws": ['', '{"a": [1, {"b', '{"a": [1, {"b": [[', '[[[[ 1', '{"a": {"b": {"c": "x y"}, ', '[1 ,[2], [[]'],
    "balanced": ["(x(", "(a (b (c", "(((x)))"],
    "sexp": ["(", "(a (b (c "],
    "sexp_juxt": ["(", "(ab(c(", "((((x)"],
    "fn": ["f(", "f(g(h(1, ", "f(g(h(1))"],
    "xml": ["<a>", "<a><b>x<c>", "<a><b>x</b>", "<a><b>x</"],
}


@pytest.mark.parametrize("name", sorted(CALL_PREFIXES))
def test_call_masks_equal_the_oracle_over_the_whole_vocabulary(compiler, smollm2_tokenizer, name):
    """The compiled grammar's masks, at prefixes inside nested calls, are exactly the tokens
    the oracle accepts (and EOS where it is final), over all 49k tokens: no token that
    crosses a call's boundary mid-token is missed, none is let through. The mask and the
    matcher's own acceptance agree on every token that can cross."""
    from json_checks import HoleOracle, accepted_ids

    from treadle.constrained.decode.bitmask import allocate_token_bitmask
    from treadle.constrained.compile.compiler import build_compiled_grammar
    from treadle.constrained.ebnf.ebnf import call_boundaries

    tok = smollm2_tokenizer
    eos = tok.eos_token_id
    text = CALLED[name]
    cg = compiler.compile(GrammarSpec("ebnf", text))
    assert cg.holes is not None
    table = cg.token_bytes
    one = {b[0]: i for i, b in reversed(list(enumerate(table))) if b and len(b) == 1 and i != eos}
    bm = allocate_token_bitmask(1, len(tok))
    # the same grammar built in this process agrees with the compiler's (the regex and holes)
    assert build_compiled_grammar(cg.regex, tok, [eos], vocab_size=len(tok),
                                  spec=GrammarSpec("ebnf", text)).holes is not None
    for prefix in CALL_PREFIXES[name]:
        data = prefix.encode()
        m = cg.matcher()
        for b in data:
            assert m.accept_token(one[b]), (prefix, bytes([b]))
        o = HoleOracle(cg.regex)
        assert o.feed(data), prefix
        m.fill_next_token_bitmask(bm, 0)
        got = allowed_ids(bm[0].numpy())
        want = ({eos} if o.final() else set()) | accepted_ids(o, table[:len(tok)], skip=(eos,))
        assert got == want, (prefix, sorted(table[i] for i in got - want)[:10],
                             sorted(table[i] for i in want - got)[:10])
        # every crossing token, or 2,000 of those decided in bulk (simple_entries) and all others
        bulk = cg.holes.t.simple_entries(call_boundaries(text))[1]
        cands = [i for i in cg.holes.candidates if not bulk[i]]
        cands += random.Random(prefix).sample([i for i in cg.holes.candidates if bulk[i]],
                                              min(2000, int(bulk[list(cg.holes.candidates)].sum())))
        for i in cands:
            m2 = cg.matcher()
            for b in data:
                m2.accept_token(one[b])
            assert m2.accept_token(i) == (i in got), (prefix, table[i])


def test_deep_documents_in_the_models_own_tokens(compiler, smollm2_tokenizer):
    """Nesting far past the old three unrolled levels, written as the tokenizer writes it
    (tokens such as '((' and '}]}' cross several calls), is accepted and can end; tail calls
    keep the stack flat."""
    tok = smollm2_tokenizer
    docs = {
        "arith": "(" * 12 + "1+2" + ")*3" * 1 + ")" * 11,
        "json_like": '{"a":' * 10 + '[1,{"b":[true,null,"x y"]}]' + "}" * 10,
        "json_ws": '{\n  "a": [\n    {"b": ' * 8 + '"deep"' + "}\n  ]\n}" * 8,
        "mutual": "[" * 15 + "x" + ",x]" * 15,
        "tail": "xz" * 200 + "y",
        "balanced": "(print (map (lambda (x) (* x x)) (list 1 2 3)))",
        "sexp": "(define (fact n)\n  (if (< n 2) 1 (* n (fact (- n (abs (min 1 (max 0 n))))))))",
        "sexp_juxt": "(print(map(lambda(x)(mul(x)(x)))(list(a(b(c(d(e)))))(two))))",
        "fn": "send_email(to(7), subject(greeting(first_name(8), last(name(x(1))))), 42)",
        "xml": "<html><body><div><ul><li><b>one</b> item</li></ul></div><p>text</p></body></html>",
    }
    for name, doc in docs.items():
        assert recognizes(parse_ebnf(CALLED[name]), doc), name
        m = compiler.compile(GrammarSpec("ebnf", CALLED[name])).matcher()
        ids = tok.encode(doc, add_special_tokens=False)
        assert all(m.accept_token(t) for t in ids), name
        assert m.accept_token(tok.eos_token_id), name
        if name == "tail":
            m = compiler.compile(GrammarSpec("ebnf", CALLED[name])).matcher()
            for t in ids[:-1]:
                assert m.accept_token(t)
                assert m.call_depth <= 1
        elif name == "arith":  # one token returns from three calls
            assert "))))" in [tok.decode([t]) for t in ids]

"""Session 43: EBNF (GBNF) grammars and regexes as users write them (llama.cpp's grammars
folder, xgrammar's dialect, regexes copied from the web), compiled with the real SmolLM2
vocabulary: what is refused is refused by name and with an accurate reason, and what is
accepted is checked against an independent reading (the test_ebnf recognizer, Python's
``re``)."""

from __future__ import annotations

import re

import pytest

from treadle.constrained import GrammarSpec
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


# ------------------------------------------------------------------ regex: flags and anchors as Python reads them

@pytest.fixture(scope="module")
def compiler(smollm2_compiler):
    return smollm2_compiler


def _walks(cg, tok, seed: str, n: int = 12, steps: int = 40) -> list[str]:
    """Random walks over the compiled grammar's masks to EOS (one-byte tokens past the first
    third, so that they end): the texts."""
    import random

    from json_checks import allowed_ids
    from treadle.constrained.decode.bitmask import allocate_token_bitmask

    rng = random.Random(seed)
    eos = tok.eos_token_id
    bitmask = allocate_token_bitmask(1, len(tok))
    out_texts = []
    for _ in range(n):
        m, out = cg.matcher(), bytearray()
        for step in range(steps):
            m.fill_next_token_bitmask(bitmask, 0)
            allowed = sorted(allowed_ids(bitmask[0].numpy()))
            assert allowed, (seed, out)
            if eos in allowed and (len(allowed) == 1 or step > steps // 2 or rng.random() < 0.1):
                assert m.accept_token(eos)
                out_texts.append(out.decode("utf-8"))
                break
            cand = [a for a in allowed if a != eos]
            short = [a for a in cand if len(cg.token_bytes[a]) == 1] if step > steps // 3 else []
            pick = rng.choice(short or cand)
            assert m.accept_token(pick)
            out += cg.token_bytes[pick]
    return out_texts


def _accepts(cg, tok, text: str) -> bool:
    m = cg.matcher()
    return all(m.accept_token(t) for t in tok.encode(text, add_special_tokens=False)) and m.accept_token(tok.eos_token_id)


# (regex, texts in its language, texts out of it): each read by Python's re.fullmatch too
FLAGGED = {
    "yes_no_any_case": (r"(?i)(yes|no)", ["YES", "No", "yEs"], ["maybe", "yess"]),
    "scoped": (r"(?i:true|false)", ["TRUE", "False"], ["T"]),
    "scoped_off": (r"(?i)(?-i:ID)-[a-f0-9]{4}", ["ID-BEEF", "ID-00af"], ["id-beef", "Id-0000"]),
    "hex_any_case": (r"(?i)[a-f0-9]{8}", ["DEADBEEF", "deadbeef"], ["DEADBEEG"]),
    "negated_under_i": (r"(?i)[^a-z\n]{3}", ["123", "!?-"], ["1A2", "abc"]),
    "kelvin_and_eszett": (r"(?i)k|straße", ["K", "k", "\u212a", "STRAẞE", "Straße"], ["STRASSE"]),
    "dotall": (r"(?s)<think>.{0,20}</think>", ["<think>a\nb</think>"], ["<think>a"]),
    "multiline_at_the_ends": (r"(?m)^(GET|POST) /[a-z]*$", ["GET /abc"], ["get /abc"]),
    "python_anchors": (r"\A\d{3}-\d{4}\Z", ["555-1234"], ["5551234"]),
    "verbose": (r"(?x) \d{3} - \d{4}   # a local phone number", ["555-1234"], ["555 - 1234"]),
    "verbose_keeps_escaped_spaces": (r"(?ix) [a-c] \  \# x", ["B #X", "a #x"], ["B#X"]),
    "ascii_fold": (r"(?ai)k", ["k", "K"], ["\u212a"]),
    "verbose_braces_with_a_space_are_text": (r"(?x)a{2, 3}", ["a{2,3}"], ["aa", "aaa", "a{2, 3}"]),
}


@pytest.mark.parametrize("name", sorted(FLAGGED))
def test_inline_flags_and_python_anchors_mean_what_python_reads(compiler, smollm2_tokenizer, name):
    """A regex's leading inline flags ('(?i)', '(?s)', '(?m)', '(?x)', '(?a)'), scoped ones
    ('(?i:...)', '(?-i:...)') and '\\A' / '\\Z' at its ends were refused ("no lookaround,
    named groups or inline flags", "use an explicit class like [0-9]" for '\\A'), though an
    automaton checks each exactly. Now they compile: the texts Python's re.fullmatch takes
    are accepted, the others are not, and random walks are in the language."""
    regex, good, bad = FLAGGED[name]
    cg = compiler.compile(GrammarSpec.from_params(regex=regex))
    rx = re.compile(regex)
    for text in good:
        assert rx.fullmatch(text) and _accepts(cg, smollm2_tokenizer, text), (name, text)
    for text in bad:
        assert not rx.fullmatch(text) and not _accepts(cg, smollm2_tokenizer, text), (name, text)
    texts = _walks(cg, smollm2_tokenizer, name)
    assert len(texts) >= 6, (name, texts)
    for text in texts:
        assert rx.fullmatch(text), (name, text)


def test_case_folding_agrees_with_python_on_every_cased_character():
    """'(?i)' widens each character and class by what Python's re.IGNORECASE adds (asked of
    re itself), and narrows a negated class by the same: over every code point below
    U+20000, a one-character regex under the flag matches exactly what Python's does."""
    from treadle.constrained.regex.regex_text import _cased, translate_regex

    atoms = [*"aiksyßıİſµσΣ", "[a-z]", "[^a-z]", "[^k]", "[0-9a-f]", "[À-ÿ]", r"\x41", r"\u00e9", "[^s\\n]"]
    points = [chr(c) for c in _cased()] + [chr(c) for c in range(0x80)]
    for flags in ("(?i)", "(?ai)"):
        for a in atoms:
            ours, ref = re.compile(translate_regex(flags + a)), re.compile(flags + a)
            wrong = [c for c in points if bool(ours.fullmatch(c)) != bool(ref.fullmatch(c))]
            assert not wrong, (flags, a, wrong[:5])


@pytest.mark.parametrize("regex,named", [
    (r"x.\bfoo", "word boundary '\\b'"),  # (served exactly since s48 where the boundary is decided: test_regex_s48_parity)
    (r"^((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.?\b)+$", "repeated"),
    (r"a.\Bb", "word boundary '\\B'"),
    (r"a\Zb", "anchor '\\Z'"),
    (r"\d+(?=px)", "lookahead"),
    (r"(?<=\$)\d+", "lookbehind"),
    (r"((?<!x)y)*", "repeated"),
    (r"a(?i)b", "only at the start"),
    (r"\p{L}+", "Unicode property escape '\\p'"),
    (r"a{,3}", "write {0,3}"),
    (r"(?x)\d+ ?", "multiple repeat"),
])
def test_what_cannot_be_enforced_is_refused_naming_the_construct(regex, named):
    """Before: '\\b', '\\B' and '\\Z' were "not supported (it differs between Python re and Rust
    regex); use an explicit class like [0-9]", lookarounds "(no lookaround, named groups or
    inline flags)" though named groups are read, '{,3}' "not a counted repetition"."""
    with pytest.raises(ValueError) as info:
        GrammarSpec.from_params(regex=regex).to_regex()
    msg = str(info.value)
    assert named in msg and "explicit class like [0-9]" not in msg and "named groups" not in msg, msg


# ------------------------------------------------------------------ end to end through the Engine

# (sampling params' grammar, a checker of the output): each bounded, so that it ends
E2E = [
    ({"regex": r"(?i)(yes|no)"}, lambda s: re.fullmatch(r"(?i)(yes|no)", s)),
    ({"regex": r"\A\d{3}-\d{4}\Z"}, lambda s: re.fullmatch(r"\d{3}-\d{4}", s)),
    ({"regex": r"(?x) (?P<y>\d{4}) - (?P<m>0[1-9]|1[0-2]) - (?P<d>0[1-9]|[12]\d|3[01])"},
     lambda s: re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", s)),
    ({"ebnf": 'root ::= answer "."\nanswer ::= "yes" | "no" # llama.cpp style\n'},
     lambda s: s in ("yes.", "no.")),
    ({"ebnf": 'root ::= first-name " " last-name\nfirst-name ::= [A-Z] [a-z]{1,8}\n'
              'last-name ::= [A-Z] [a-z]{1,8} ("-" [A-Z] [a-z]{1,8})?'},
     lambda s: re.fullmatch(r"[A-Z][a-z]{1,8} [A-Z][a-z]{1,8}(-[A-Z][a-z]{1,8})?", s)),
    ({"ebnf": 'root ::= expr "=" [0-9]{1,3}\nexpr ::= term ([-+*/] term){0,2}\n'
              'term ::= [0-9]{1,3} | "(" expr ")"'},
     lambda s: re.fullmatch(r"[-+*/()0-9]+=[0-9]{1,3}", s) and s.count("(") == s.count(")")),
]


@pytest.fixture(scope="module")
def engine():
    from treadle.runtime import Engine

    with Engine(max_total_tokens=4096) as e:
        yield e


def test_engine_outputs_are_in_the_language_and_bad_grammars_are_value_errors(engine):
    """Through the Engine, at temperature 0 and 1: every output of a regex (with flags, Python
    anchors, verbose named groups) or a GBNF grammar (comments, dashed rule names, counted
    repetition, nesting) is in its language; a regex or grammar that cannot be enforced is a
    ValueError naming the construct, and the engine serves the next request."""
    prompts, params, checks = [], [], []
    for temperature in (0.0, 1.0):
        for grammar, check in E2E:
            prompts.append("Answer: ")
            params.append({**grammar, "temperature": temperature, "max_new_tokens": 48, "seed": 7})
            checks.append(check)
    outs = engine.generate(prompts, params)
    for out, p, check in zip(outs, params, checks):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (p, out)
        assert check(out["text"]), (p, out["text"])
    for bad, named in (({"regex": r"x.\bcat"}, "word boundary"), ({"ebnf": 'root ::= "a" (= "b")'}, "lookahead"),
                       ({"ebnf": "root ::= r0\n" + "\n".join(f'r{i} ::= "x" r{i + 1} | "y"' for i in range(300))
                         + '\nr300 ::= "z"'}, "references deep")):
        with pytest.raises(ValueError, match=named):
            engine.generate("Answer: ", {**bad, "max_new_tokens": 8})
    out = engine.generate("Answer: ", {"regex": "(?i)ok", "max_new_tokens": 8, "temperature": 0})
    assert re.fullmatch("(?i)ok", out["text"]), out


def test_case_folding_work_is_bounded():
    """Each distinct character or class under '(?i)' is folded once (a pass over the cased
    code points): a 20,000-letter regex of ten letters folds ten atoms (it folded all 20,000,
    six seconds); more than MAX_FOLDED distinct ones are a ValueError saying so."""
    from treadle.constrained.regex import regex_text

    regex_text._folded_atom.cache_clear()
    assert regex_text.translate_regex("(?i)" + "abcdefghij" * 2000).startswith("[aA][bB]")
    assert regex_text._folded_atom.cache_info().misses == 10
    many = "(?i)" + "".join(f"[a-\\u{0x100 + i:04x}]" for i in range(regex_text.MAX_FOLDED + 1))
    with pytest.raises(ValueError, match="over 2000 distinct characters and classes under the flag 'i'"):
        regex_text.translate_regex(many)
    assert regex_text._folded_atom.cache_info().misses <= 10 + regex_text.MAX_FOLDED


# ------------------------------------------------------------------ EBNF: hostile recursion is bounded work

def _cycle(n: int) -> str:
    """``n`` rules that each nest the next: one cycle through all of them."""
    return "root ::= r0\n" + "\n".join(f'r{i} ::= "(" r{(i + 1) % n} ")" | "x"' for i in range(n))


def _dense(n: int, step: int) -> str:
    """``n`` rules, each reaching every ``step``-th rule and nesting the next: 2-4 KB."""
    return "root ::= r0\n" + "\n".join(
        f"r{i} ::= " + " | ".join(f'"{j}" r{j}' for j in range(0, n, step)) + f' | "(" r{(i + 1) % n} ")" | "x"'
        for i in range(n))


def test_choosing_call_targets_is_bounded_work():
    """The search for the rules that break every cycle tried every pair of a component's rules,
    a Tarjan pass each: a cycle of 300 rules (8 KB) took four minutes (180,000 pairs). It stops
    at MAX_CUT_WORK, keeping the best cut found (a cycle of 80 still runs as calls)."""
    from treadle.constrained.ebnf import ebnf as ebnf_module
    from treadle.constrained.ebnf.ebnf import call_boundaries

    for n in (80, 300):
        ebnf_module._with_calls.cache_clear()
        before = ebnf_module.cut_work
        try:
            rx = ebnf_to_regex(_cycle(n), calls=True)
        except EbnfError as e:
            assert n == 300 and "expands too deeply" in str(e), e
        else:
            assert n == 80 and rx and call_boundaries(_cycle(n)) is not None
        assert ebnf_module.cut_work - before <= 2 * ebnf_module.MAX_CUT_WORK, (n, ebnf_module.cut_work - before)


def test_expansions_of_call_targets_are_capped_not_out_of_memory():
    """With calls, a target's expansion nested in another's was never measured: 40 rules that
    each reach six others (3.5 KB) built strings until MemoryError (past 6 GB). Each expansion
    is now held to MAX_REGEX_CHARS, and the grammar is an EbnfError saying so."""
    with pytest.raises(EbnfError, match="over the 200000 supported"):
        ebnf_to_regex(_dense(40, 7), calls=True)
    with pytest.raises(EbnfError, match="over the 200000 supported"):
        ebnf_to_regex(_dense(60, 7), calls=True)
    assert ebnf_to_regex(_dense(20, 7), calls=True)  # smaller: runs as calls


@pytest.mark.parametrize("regex,good,bad", [
    (r"^yes$|^no$", ["yes", "no"], ["yesno", "y"]),
    (r"^\d{5}$|^\d{5}-\d{4}$", ["12345", "12345-6789"], ["1234", "12345-"]),
    (r"\Ayes\Z|\Ano\Z", ["yes", "no"], ["maybe"]),
    (r"(?i)^true$|^false$", ["TRUE", "false"], ["yes"]),
    (r"^$|^[a-z]+$", ["abc"], ["ABC"]),
])
def test_anchors_on_each_top_level_branch_are_no_ops(compiler, smollm2_tokenizer, regex, good, bad):
    """'^yes$|^no$' (each alternative anchored, as US ZIP codes and yes/no answers are often
    written) was "anchor '$' at offset 3 is not supported"; under a whole-string match each
    branch's own anchors change nothing, as for the pattern's."""
    cg = compiler.compile(GrammarSpec.from_params(regex=regex))
    rx = re.compile(regex)
    for text in good:
        assert rx.fullmatch(text) and _accepts(cg, smollm2_tokenizer, text), (regex, text)
    for text in bad:
        assert not rx.fullmatch(text) and not _accepts(cg, smollm2_tokenizer, text), (regex, text)
    for text in _walks(cg, smollm2_tokenizer, regex, n=8):
        assert rx.fullmatch(text), (regex, text)


# right recursion written with a trailing group (llama.cpp's older json.gbnf: ws ::= ([ \t\n] ws)?):
# a loop, like 'list ::= item "," list | item', not a call per character
RIGHT_GROUPS = {
    "ws": ('root ::= "[" ws item ("," ws item)* "]"\nitem ::= [0-9]+ ws\nws ::= ([ \\t\\n] ws)?',
           "[" + ",".join(["1  \n  "] * 40) + "]"),
    "list": ('root ::= "(" list ")"\nlist ::= (item ("," list)?)?\nitem ::= [a-z]+', "(" + ",".join(["ab"] * 40) + ")"),
    "alternative": ('root ::= r\nr ::= "a" ("b" | r) | "c"', "a" * 30 + "b"),
    "nested_group": ('root ::= r\nr ::= "z" ("y" ("x" r))?', "zyx" * 20 + "z"),
}


@pytest.mark.parametrize("name", sorted(RIGHT_GROUPS))
def test_right_recursion_through_a_trailing_group_is_a_loop(compiler, smollm2_tokenizer, name):
    """Such a rule ran as calls, one per repetition: every whitespace character of 'ws' a call,
    masks walking the tokens that cross (4x slower per token on a JSON array). It is now a
    loop: no calls, and the regex is exactly the grammar (against the recognizer)."""
    import random

    from test_ebnf import derive, mutations, recognizes
    from treadle.constrained.ebnf.ebnf import call_boundaries, parse_ebnf

    text, doc = RIGHT_GROUPS[name]
    g = parse_ebnf(text)
    assert recognizes(g, doc)
    assert call_boundaries(text) is None, name
    cg = compiler.compile(GrammarSpec("ebnf", text))
    assert cg.holes is None and _accepts(cg, smollm2_tokenizer, doc), name
    rx = re.compile(ebnf_to_regex(text))
    rng = random.Random(name)
    for _ in range(30):
        s = derive(g, rng, budget=10)
        for t in [s, *mutations(s, rng, ",()[]abcxyz1 \n", 3)]:
            assert bool(rx.fullmatch(t)) == recognizes(g, t), (name, t)

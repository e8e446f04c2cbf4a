"""A user's ``regex`` (whole output) served where a JSON Schema ``pattern`` already was: lookarounds
and word boundaries written out exactly (constrained/regex/regex_whole.py), counted repetitions
past 1,000 judged on the token automaton's size, and octal escapes read as Python's ``re`` reads
them. Each served case is checked against ``re.fullmatch`` both ways (the translation takes what
Python takes, on samples and on walks of the compiled token grammar); what cannot be exact stays
a ValueError naming the construct."""

from __future__ import annotations

import random
import re
import zlib

import pytest

from treadle.constrained import GrammarSpec, allocate_token_bitmask, token_bytes_table
from treadle.constrained.regex.regex_text import translate_regex

from json_checks import random_walk

PASSWORD = r"^(?=.*[A-Z])(?=.*\d)[A-Za-z\d]{8,16}$"
IPV4 = r"((25[0-5]|2[0-4]\d|1?\d?\d)\.?\b){4}"


def _ipv4ish(rng: random.Random) -> str:
    parts = [str(rng.choice([rng.randrange(0, 10), rng.randrange(0, 100), rng.randrange(0, 300), "01", "x"]))
             for _ in range(rng.choice([3, 4, 4, 5]))]
    return "".join(p + rng.choice([".", ".", "", ".."]) for p in parts).rstrip(rng.choice([".", ""]))


def _texts(rng: random.Random, alphabet: str, most: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, most + 1)))


CASES = {
    PASSWORD: lambda r: _texts(r, "aZ3bQ9_.é", 18),
    IPV4: _ipv4ish,
    r"\bword\b": lambda r: r.choice(["word", "words", " word", "wor"]),
    r"(?!abc)[a-c]{3}": lambda r: _texts(r, "abc", 4),
    r"[a-z]{2}(?<=ab)c": lambda r: _texts(r, "abc", 4),
    r"[a-z ]{1,4}\b[0-9]": lambda r: _texts(r, "ab 12", 6),
    r"(?ai)\bid\B[a-z]*": lambda r: _texts(r, "iIdD_k\u212a\u0131 ", 5),
    r"x(?<!\d)[a-z]|(?=\d\d)[0-9]{2,3}": lambda r: _texts(r, "x1a2", 4),
    r"^(?=.{4,6}$)(?=.*\d)[a-z0-9]+\n?$": lambda r: _texts(r, "ab1\n", 8),  # '$' in a lookahead
    r"(?=ab$|c)[a-c]+\n?": lambda r: _texts(r, "abc\n", 4),
    r"(?:[^a]|a)(?!b)": lambda r: _texts(r, "ab\n\u00e9", 2),  # an edge over every character
    r"(?=.*[a-z])(?=.*[A-Z])(?=.*\d)(?=.*[@$!%*?&])[A-Za-z\d@$!%*?&]{8,}": lambda r: _texts(r, "aZ3@x!", 12),
}


@pytest.mark.parametrize("regex", list(CASES))
def test_assertions_are_served_exactly_as_python_reads_them(regex: str) -> None:
    """The password rule, the ipv4 pattern and '\\bword\\b' were each a 400 ('lookahead assertion',
    'word boundary') while a schema pattern took them. The regex served instead matches exactly
    the strings re.fullmatch takes."""
    written = re.compile(translate_regex(regex))
    rng = random.Random(zlib.crc32(regex.encode()))
    seen = 0
    for _ in range(3000):
        text = CASES[regex](rng)
        want = re.fullmatch(regex, text) is not None
        assert (written.fullmatch(text) is not None) == want, (regex, text, want)
        seen += want
    assert seen >= 5, regex


@pytest.fixture(scope="module")
def table(smollm2_tokenizer):
    return token_bytes_table(smollm2_tokenizer)


@pytest.mark.parametrize("regex", [PASSWORD, IPV4, r"(?!abc)[a-c]{3}"])
def test_walks_of_the_compiled_grammar_fullmatch_the_regex(smollm2_compiler, smollm2_tokenizer, table,
                                                           regex: str) -> None:
    g = smollm2_compiler.compile(GrammarSpec.from_params(regex=regex))
    rng = random.Random(zlib.crc32(regex.encode()))
    bm = allocate_token_bitmask(1, len(smollm2_tokenizer))
    done = 0
    for _ in range(6):
        m = g.matcher()
        out = random_walk(m, bm, table, smollm2_tokenizer.eos_token_id, rng, steps=60, stop_p=0.3, free_steps=40,
                          steer_after=20)
        if m.is_terminated():
            done += 1
            assert re.fullmatch(regex, out.decode()), (regex, out)
    assert done >= 3


@pytest.mark.parametrize("regex, named", [
    (r"(a\b)*", "repeated"),                 # a boundary under '*': only a subset could be written
    (r"((?<!a)b)+", "repeated"),
    (r"a.\b.b", "outside ASCII"),            # '.' may be a non-ASCII word character next to it
    (r"(?=a)b", "no string"),
    (r"(a)\1", "backreference"),
    (r"(?=(?=a))a", "inside the lookaround"),
])
def test_assertions_that_cannot_be_exact_stay_refused_by_name(regex: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        translate_regex(regex)


@pytest.mark.parametrize("regex, text", [
    (r"\101", "A"), (r"\0", "\x00"), (r"x\012y", "x\ny"), (r"[\101-\132]+", "QZ"), (r"\1011", "A1"),
    (r"[\0-\11]", "\t"), (r"(a)\0101", "a\x081"),
])
def test_octal_escapes_are_read_as_python_reads_them(regex: str, text: str) -> None:
    """'\\101' was refused as a backreference; Python's re reads it (and '\\0', '\\012') as octal."""
    assert re.fullmatch(regex, text)
    written = translate_regex(regex)
    assert re.fullmatch(written, text), (regex, written)
    assert not re.fullmatch(written, text + "#")


def test_octal_past_0o377_and_backreferences_stay_refused() -> None:
    with pytest.raises(ValueError, match="octal"):
        translate_regex(r"\400")
    with pytest.raises(ValueError, match="backreference"):
        translate_regex(r"(a)(b)\2")


def test_a_count_past_1000_compiles_and_holds_exactly(smollm2_compiler, smollm2_tokenizer) -> None:
    """'[^"]{1,5000}' was refused ('repetition count above 1000', then too large by the
    outlines-core estimate) though the lazy index builds it in milliseconds; past its state cap
    ('{1,100000}') it is a ValueError naming the size."""
    g = smollm2_compiler.compile(GrammarSpec.from_params(regex='[^"]{1,5000}'))
    m = g.matcher()
    ids = smollm2_tokenizer.encode("ab" * 2500, add_special_tokens=False)
    assert all(m.accept_token(t) for t in ids)
    assert m.can_terminate()
    assert not m.accept_token(smollm2_tokenizer.encode("a", add_special_tokens=False)[0])
    with pytest.raises(ValueError, match="too large"):
        smollm2_compiler.compile(GrammarSpec.from_params(regex='[^"]{1,100000}'))

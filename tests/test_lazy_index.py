"""The lazy token index (constrained/index/lazy_index.py) against outlines-core's index: the same
allowed tokens and the same final states at every state of random token walks, over the whole
vocabulary of the embedded model; its UTF-8 byte ranges exact; what it does not read falls
back to outlines-core."""
from __future__ import annotations

import random
import re

import pytest

from treadle.constrained import GrammarCompiler, GrammarSpec, build_compiled_grammar
from treadle.constrained.index.index_markers import marked, marker_token_ids
from treadle.constrained.index.json_holes import PLACEHOLDERS
from treadle.constrained.index.lazy_index import LazyIndex, LazyUnsupported, build_nfa, utf8_sequences
from treadle.constrained.index.vocabulary import build_vocabulary, lazy_tokens

EOS = 2
V = 49152

REGEXES = [
    r"[0-9]+(?:\.[0-9]+)?",  # outlines-core's own quirk around matches before the end (index_markers.py)
    r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]){0,12}"',
    r'\{"a":(?:true|false),"b":-?[0-9]{1,3}(?:,"c":"[a-z]*")?\}',
    r"[a-z]+(?: [a-z]+)*",
    r"(?:a|ab)c?|abc{2,}",
    r"héllo|wörld|日本[一-龥]{1,3}|[\u0400-\u04ff]+",
    r"(?:yes|no|maybe){1,3}\.",
    r"[^a-z\n]{1,4}x",
    # lists X(?:,X)*, X built once (lazy_index._loop_tail), X a group or flattened into the sequence
    r'\[(?:\{"a":[0-9]\}(?:, ?\{"a":[0-9]\})*)?\]',
    r"(?:ab|c)(?:,(?:ab|c))*;|xa(?:ba)*",
]


@pytest.fixture(scope="module")
def vocab(smol):
    return build_vocabulary(smol, [EOS])


def _start(index, table):
    return index.get_next_state(index.get_initial_state(), marker_token_ids(len(table), len(PLACEHOLDERS))[0])


def same_as_outlines_core(vocab, lazy_regex, ref_regex=None, *, seed=0, walks=6, steps=25):
    """Random token walks through the lazy index of ``lazy_regex`` and outlines-core's index of
    ``ref_regex`` (default the same text) side by side: the same allowed tokens and finality at
    every state, and a token both refuse has no next state. Returns the states checked."""
    from outlines_core import Index

    outlines_vocab, table = vocab
    ref = Index(marked(lazy_regex if ref_regex is None else ref_regex), outlines_vocab)
    lazy = LazyIndex(build_nfa(marked(lazy_regex)), lazy_tokens(table, [EOS]))
    rng = random.Random(seed)
    checked = 0
    for _ in range(walks):
        a, b = _start(ref, table), _start(lazy, table)
        for _ in range(steps):
            want = sorted(t for t in ref.get_allowed_tokens(a) if t != EOS)
            got = lazy.get_allowed_tokens(b).tolist()
            assert got == want, (lazy_regex[:200], sorted(set(want) ^ set(got))[:10])
            assert bool(ref.is_final_state(a)) == lazy.is_final_state(b)
            checked += 1
            real = [t for t in want if t < len(table)]
            if not real:
                break
            t = rng.choice(real)
            a, b = ref.get_next_state(a, t), lazy.get_next_state(b, t)
            assert (a is None) == (b is None)
        # a token the index refuses has no next state in either
        bad = next(t for t in range(3, len(table)) if table[t] and t not in set(want))
        assert ref.get_next_state(a, bad) is None and lazy.get_next_state(b, bad) is None
    return checked


@pytest.mark.parametrize("regex", REGEXES)
def test_allowed_tokens_equal_outlines_core_on_random_walks(vocab, regex):
    assert same_as_outlines_core(vocab, regex) >= 6


def test_utf8_sequences_spell_exactly_the_range():
    rng = random.Random(1)
    for _ in range(300):
        lo = rng.choice([rng.randrange(0x80), rng.randrange(0x800), rng.randrange(0x10000), rng.randrange(0x110000)])
        hi = min(0x10FFFF, lo + rng.choice([0, 1, 63, 64, 4095, 70000]))
        seqs = utf8_sequences(lo, hi)
        probes = {lo, hi, lo - 1, hi + 1, 0xD7FF, 0xD800, 0xDFFF, 0xE000} | {rng.randrange(0x110000) for _ in range(20)}
        for cp in probes:
            if not 0 <= cp <= 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                continue
            data = chr(cp).encode()
            spelled = any(len(s) == len(data) and all(a <= x <= b for x, (a, b) in zip(data, s)) for s in seqs)
            assert spelled == (lo <= cp <= hi), (hex(lo), hex(hi), hex(cp))


@pytest.mark.parametrize("regex", [r"\d+", r"^ab", r"a(?=b)", r"[[:alpha:]]", r"a+?", r"(?i)ab", r"[a-z&&b]", r"\bx"])
def test_constructs_it_does_not_read_are_refused_and_fall_back(smol, regex):
    with pytest.raises(LazyUnsupported):
        build_nfa(regex)
    if regex in (r"\d+", r"a+?"):  # outlines-core reads these: the grammar still compiles, with its index
        g = build_compiled_grammar(regex, smol, [EOS], vocab_size=V)
        assert not isinstance(g.index, LazyIndex)


def test_compiler_builds_lazy_indexes_that_accept_and_refuse(smol):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                                               "extra": {}},
              "required": ["name", "tags", "extra"]}
    with GrammarCompiler(smol, [EOS], vocab_size=V) as c:
        g = c.compile(GrammarSpec.from_params(json_schema=schema))
        assert isinstance(g.index, LazyIndex) and g.holes is not None
        m = g.matcher()
        for t in smol.encode('{"name":"Zoë","tags":["a","b"],"extra":{"k":[1,{}]}}', add_special_tokens=False):
            assert m.accept_token(t), smol.decode([t])
        assert m.accept_token(EOS)
        m2 = g.matcher()
        assert not all(m2.accept_token(t) for t in smol.encode('{"name":1', add_special_tokens=False))
    with GrammarCompiler(smol, [EOS], vocab_size=V, token_index="outlines") as c:
        g2 = c.compile(GrammarSpec.from_params(regex="[0-9]{2}"))
        assert not isinstance(g2.index, LazyIndex)


def test_an_index_past_its_dfa_cap_fails_its_request_alone(monkeypatch):
    """A lazy index makes DFA states as requests explore it, in the scheduler; past its cap (a
    regex that determinizes exponentially) the request that asked fails with a message naming
    it, and the rest of its batch goes on, with no KV leaked."""
    from treadle.constrained.index import lazy_index
    from treadle.runtime import Engine

    monkeypatch.setattr(lazy_index, "MAX_DFA_STATES", 12)
    with Engine(max_total_tokens=2048) as e:
        (bad,), _, _ = e._build("Spell a long word:", None, {"regex": "[a-z]{40}", "max_new_tokens": 45,
                                                             "temperature": 0}, False, None, 0, False, "bad")
        (ok,), _, _ = e._build("The weather today", None, {"max_new_tokens": 12, "temperature": 0,
                                                          "ignore_eos": True}, False, None, 0, False, "ok")
        boxes = [e._submit(bad), e._submit(ok)]  # one batch
        failed, served = e._collect(bad, boxes[0]), e._collect(ok, boxes[1])
        assert failed["meta_info"]["finish_reason"]["type"] == "abort", failed
        assert re.search(r"grammar could not go on: .*past 12 DFA states", failed["meta_info"]["error"])
        assert not failed["meta_info"].get("internal_error")  # the request's own: a 400 over HTTP
        assert served["meta_info"]["completion_tokens"] == 12 and "error" not in served["meta_info"]
        e.check_integrity()

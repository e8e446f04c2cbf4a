"""The "any JSON" pushdown grammar (constrained/index/json_any.py): masks against an independent
character-level oracle over the whole SmolLM2 vocabulary, random walks that must end in
valid JSON, the matcher contract (reject / rollback / jump / terminate), and the compiler
routing schemas that ask only for JSON to it."""

from __future__ import annotations

import json
import random

import pytest
import torch

from treadle.constrained import (
    CompiledGrammar, GrammarCompiler, GrammarSpec, JsonAnyGrammar, allocate_token_bitmask, json_any_root,
    token_bytes_table,
)
from treadle.constrained.index.json_any import JsonPushdown

from json_checks import Oracle, accepted_ids, allowed_ids, random_walk

EOS = 2
V = 49152


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def pda(smol):
    table = token_bytes_table(smol)
    return JsonPushdown(table, len(table), V, (EOS,))


PREFIXES = {
    "object": ['', '{', '{"', '{"a', '{"a"', '{"a":', '{"a":[', '{"a":[1', '{"a":[1,', '{"a":[1,{"b":tr',
               '{"a":"x\\', '{"a":"\\u', '{"a":"\\ud83d', '{"a":"\\ud83d\\u', '{"a":-0.5e', '{"a":-0.5e+1',
               '{"a":{}', '{"a":[[]', '{"a":1234567890123456', '{"a":0.1234567890123456', '{"a":1e12',
               '{"k\\', '{"a":"é', '{"a":"\xe2\x82', '{"a":{"b":{"c":{"d":{"e":[[[[', '{"a":null}',
               '{"a":[{"b":{}}', '{"a":f', '{"x":"ab"', '{"a":0'],
    "value": ['', '-', '12', '"x"', '[', '[1,', 'nul', '1.5'],
    "array": ['', '[', '[]', '[{"a":[]},'],
}


def _oracle_at(root: str, prefix: str) -> Oracle:
    o = Oracle(root)
    data = prefix.encode("latin-1") if "\xe2" in prefix else prefix.encode()
    assert o.feed(data), prefix
    return o, data


@pytest.mark.parametrize("root", ["object", "value", "array"])
def test_masks_equal_the_oracle_over_the_whole_vocabulary(pda, root):
    g = JsonAnyGrammar(pda, root)
    table = pda.token_bytes
    for prefix in PREFIXES[root]:
        o, data = _oracle_at(root, prefix)
        state, stack = pda.run(g.initial, (), data)
        assert state != 0, prefix
        got = allowed_ids(pda.mask(state, stack))
        want = ({EOS} if o.final() else set()) | accepted_ids(o, table, skip=(EOS,))
        assert got == want, (prefix, sorted(table[i] for i in got - want)[:10],
                             sorted(table[i] for i in want - got)[:10])


def test_random_walks_end_in_valid_json_of_the_root_kind(pda):
    rng = random.Random(0)
    bm = allocate_token_bitmask(1, V)
    table = pda.token_bytes
    done = {"object": 0, "value": 0, "array": 0}
    for trial in range(45):
        root = ("object", "value", "array")[trial % 3]
        m = JsonAnyGrammar(pda, root).matcher()
        out = random_walk(m, bm, table, EOS, rng, steps=400, stop_p=0.2, free_steps=40, steer_after=80)
        if m.is_terminated():
            value = json.loads(out.decode())
            kind = {"object": dict, "array": list}.get(root)
            assert kind is None or isinstance(value, kind), out
            done[root] += 1
    assert all(n >= 10 for n in done.values()), done


def test_matcher_contract(smol, pda):
    enc = lambda s: smol.encode(s, add_special_tokens=False)  # noqa: E731
    m = JsonAnyGrammar(pda, "object").matcher()
    ids = enc('{"a":[{"b":null}],"c":"d"}')
    for i, t in enumerate(ids):
        assert m.accept_token(t), i
        assert not m.can_terminate() or i == len(ids) - 1
    assert m.can_terminate() and m.num_accepted == len(ids)
    assert not m.accept_token(enc(",")[0])  # nothing after the root object
    state = m.state
    m.rollback(3)
    assert m.num_accepted == len(ids) - 3 and not m.can_terminate()
    for t in ids[-3:]:
        assert m.accept_token(t)
    assert m.state == state
    assert m.accept_token(EOS) and m.is_terminated() and not m.accept_token(EOS)
    bm = allocate_token_bitmask(1, V)
    m.fill_next_token_bitmask(bm, 0)
    assert allowed_ids(bm[0].numpy()) == {EOS}
    with pytest.raises(ValueError):
        m.rollback(10_000)
    # jump-forward: the rest of a literal
    m = JsonAnyGrammar(pda, "value").matcher()
    assert m.find_jump_forward_string() == ""
    assert m.accept_token(enc("t")[0]) and m.find_jump_forward_string() == "rue"
    m.reset()
    assert m.num_accepted == 0 and m.state[1] == ()
    # nesting is unbounded: 200 levels open and close
    m = JsonAnyGrammar(pda, "array").matcher()
    for t in enc("[" * 200 + "1" + "]" * 200):
        assert m.accept_token(t)
    assert m.can_terminate()


def test_schema_classification():
    assert json_any_root({}) == "value" and json_any_root(True) == "value"
    assert json_any_root({"title": "x", "description": "y"}) == "value"
    assert json_any_root({"type": "object"}) == "object"
    assert json_any_root({"type": "object", "additionalProperties": True}) == "object"
    assert json_any_root({"type": "array", "items": {}}) == "array"
    for other in ({"type": "string"}, {"type": "object", "properties": {"a": {}}}, {"type": "array", "items": {"type": "integer"}},
                  {"type": "object", "additionalProperties": False}, {"enum": [1]}, False, {"type": ["object", "array"]},
                  {"minProperties": 1}):
        assert json_any_root(other) is None, other


def test_compiler_routes_any_json_to_the_pushdown_grammar(smol, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("a regex and index build was started for an any-JSON schema")

    with GrammarCompiler(smol, [EOS], vocab_size=V) as c:
        with monkeypatch.context() as m:
            m.setattr(c._pool, "submit", no_build)  # no regex build (that took 34 s): nothing is built
            g = c.compile(GrammarSpec.from_params(json_schema={}))
            assert isinstance(g, JsonAnyGrammar) and g.root == "value"
            assert isinstance(c.compile(GrammarSpec.from_params(json_schema={"type": "object"})), JsonAnyGrammar)
        assert isinstance(c.compile(GrammarSpec.from_params(regex="[0-9]")), CompiledGrammar)
        assert c.compile(GrammarSpec.from_params(json_schema={"type": "array"})).matcher().accept_token(
            smol.encode("[", add_special_tokens=False)[0])
    # with a whitespace pattern the regex backend serves it (the pushdown grammar is compact)
    with GrammarCompiler(smol, [EOS], vocab_size=V, whitespace_pattern="[ ]?") as c:
        spec = GrammarSpec.from_params(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
        assert isinstance(c.compile(spec), CompiledGrammar)
        assert c._json_any_root(GrammarSpec.from_params(json_schema={})) is None


def test_bitmask_row_on_a_wider_bitmask(pda):
    m = JsonAnyGrammar(pda, "object").matcher()
    bm = torch.full((2, pda.bitmask_words + 3), -1, dtype=torch.int32)
    m.fill_next_token_bitmask(bm, 1)
    assert bm[1, pda.bitmask_words:].eq(0).all() and bm[0].eq(-1).all()
    assert allowed_ids(bm[1, :pda.bitmask_words].numpy()) == {i for i, t in enumerate(pda.token_bytes)
                                                               if t and t.startswith(b"{") and Oracle("object").feed(t)}


def test_masks_equal_the_oracle_on_a_vocabulary_of_bracket_runs():
    """Every string of up to 3 of ``{}[]",:1a`` (plus some longer runs) as a token: opens and
    closes inside one token, of both kinds, across the real stack."""
    import itertools

    alphabet = '{}[]",:1a'
    tokens = [""] + ["".join(p) for n in (1, 2, 3) for p in itertools.product(alphabet, repeat=n)]
    tokens += ["[[[]]]", "[{}]", "[{]}", "]]]]", "}]}]", '{"a":[]}', '[{"a":1}]', "]}]}", "[]]"]
    table = [t.encode() if t else None for t in tokens]  # id 0 stands in for a special token
    table[EOS] = None
    pda = JsonPushdown(table, len(table), len(table), (EOS,))
    prefixes = ["", "[", "[[", "[{", '[{"a":[', '{"a":{"b":[', '{"a":[[{"c":[', "[[[[[["]
    for root in ("value", "array"):
        g = JsonAnyGrammar(pda, root)
        for prefix in prefixes:
            if root == "array" and not prefix.startswith("["):
                continue
            o, data = _oracle_at(root, prefix)
            state, stack = pda.run(g.initial, (), data)
            got = allowed_ids(pda.mask(state, stack))
            want = accepted_ids(o, table) | ({EOS} if o.final() else set())
            assert got == want, (root, prefix, sorted(tokens[i] for i in got ^ want)[:10])
            # the scalar path agrees with the mask
            assert {i for i, tb in enumerate(table) if tb and pda.run(state, stack, tb)[0] != 0} == got - {EOS}

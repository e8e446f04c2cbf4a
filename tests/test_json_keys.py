"""Unique keys (constrained/decode/json_keys.py): the lexer, the candidate search against brute
force, and matchers of real JSON grammars over SmolLM2's vocabulary (mask and acceptance
agree, rollback forgets keys, the grammar wins where unique keys would leave nothing), and
the real model, whose loops used to repeat keys."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from treadle.constrained import GrammarCompiler, GrammarSpec, allocate_token_bitmask, bitmask_to_bool
from treadle.constrained.decode.json_keys import START, KeyIndex, feed, schema_has_free_keys


def run(text: bytes, cut: int = 3):
    """Feed ``text`` in pieces of ``cut`` bytes; (state, whether any piece repeated a key)."""
    state, rep = START, False
    for i in range(0, len(text), cut):
        state, r = feed(state, text[i:i + cut])
        rep |= r
    return state, rep


@pytest.mark.parametrize("cut", [1, 2, 3, 100])
def test_lexer_finds_repeats_where_json_has_them(cut):
    def dup(text: str) -> bool:  # an independent reading: Python's parser, every object's pairs
        found = []
        json.loads(text, object_pairs_hook=lambda kv: found.append(len({k for k, _ in kv}) < len(kv)) or dict(kv))
        return any(found)

    texts = [
        '{"a":1,"b":2}', '{"a":1,"a":2}', '{"a":{"a":1},"b":{"a":2}}', '{"a":{"b":1},"a":2}',
        '[{"a":1},{"a":1}]', '{"a":"\\"a\\"","b":"{\\"a\\":1}"}', '{"a\\"b":1,"a\\"b":2}',
        '{"x":[1,{"y":2,"y":3}],"z":null}', '{"":1,"":2}', '{"k":"a,\\"k\\":1"}', '{"a" : 1 , "a" : 2}',
        '{"t":true,"f":false,"n":null,"t":1}', '{"é":1,"é":2}',
    ]
    for t in texts:
        assert run(t.encode(), cut)[1] == dup(t), t


def test_lexer_state_tracks_the_key_being_written():
    frames, mode, key = run(b'{"a":1,"b":{"c":[1,2],"d\\"', 1)[0]
    assert mode == 1 and key == b'd\\"'
    assert [f[0] for f in frames] == [frozenset({b"a", b"b"}), frozenset({b"c"})]
    # a string value is not a key, an array has none
    assert run(b'{"a":"xy', 2)[0][2] is None and run(b'["x', 1)[0][2] is None


TOY = [b'{', b'}', b'[', b']', b'"', b'a', b'b', b'ab', b':', b',', b'1', b'a"', b'b"', b'ab"', b'":', b'"a"',
       b'"b":', b',"a":', b'","', b'"a":1,"a":', b'},"a"', b'\\', b'"a":1,"b"', b'x', None, b'"ab"']


def brute(index: KeyIndex, state, row: np.ndarray) -> list[int]:
    words = row.view(np.uint32)
    return sorted(t for t, b in enumerate(index.table)
                  if b and int(words[t >> 5]) >> (t & 31) & 1 and feed(state, b)[1])


def test_candidates_match_brute_force_on_random_states():
    index = KeyIndex(TOY, len(TOY))
    rng = random.Random(5)
    full = np.full(1, -1, dtype=np.int32)  # every toy token allowed
    seen_repeat = 0
    for _ in range(3000):
        state = START
        for _ in range(rng.randrange(1, 12)):
            t = rng.choice([b for b in TOY if b])
            nxt, rep = feed(state, t)
            if not rep:
                state = nxt
        want = brute(index, state, full)
        assert sorted(index.repeaters(state, full)) == want
        seen_repeat += bool(want)
        # a row that allows only some tokens: the same, within it
        half = np.array([rng.getrandbits(32)], dtype=np.uint32).view(np.int32)
        assert sorted(index.repeaters(state, half)) == brute(index, state, half)
    assert seen_repeat > 100  # the walks do reach states where a token would repeat a key


def test_filter_copies_and_never_empties():
    index = KeyIndex(TOY, len(TOY))
    state, _ = run(b'{"a":1,"a')
    row = np.full(1, -1, dtype=np.int32)
    out = index.filter(state, row)
    gone = {t for t in range(len(TOY)) if not int(out.view(np.uint32)[0]) >> t & 1}
    assert gone == {TOY.index(b'"'), TOY.index(b'":'), TOY.index(b'","'), TOY.index(b'"a"'), TOY.index(b'"b":'),
                    TOY.index(b'"a":1,"a":'), TOY.index(b'"a":1,"b"'), TOY.index(b'"ab"')}
    assert row[0] == -1  # the shared row is untouched
    only_quote = np.zeros(1, dtype=np.int32)
    only_quote.view(np.uint32)[0] = 1 << TOY.index(b'"')
    assert index.filter(state, only_quote) is only_quote  # nothing else left: the grammar decides


# ---------------------------------------------------------------- real grammars, SmolLM2

MAP = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "object",
       "additionalProperties": {"type": "integer"}}}, "required": ["name", "tags"]}


@pytest.fixture(scope="module")
def compiler(smol):
    with GrammarCompiler(smol, [smol.eos_token_id], vocab_size=len(smol)) as c:
        yield c


def allowed(m, vocab: int) -> set[int]:
    bm = allocate_token_bitmask(1, vocab)
    m.fill_next_token_bitmask(bm, 0)
    return set(bitmask_to_bool(bm, vocab)[0].nonzero().flatten().tolist())


def accepted(m, ids) -> set[int]:
    out = set()
    for t in ids:
        if m.accept_token(t):
            out.add(t)
            m.rollback(1)
    return out


def drive(m, smol, text: str) -> None:
    for t in smol.encode(text, add_special_tokens=False):
        assert m.accept_token(t), (text, smol.decode([t]))


@pytest.mark.parametrize("spec", [dict(json_schema=MAP), dict(json_schema={"type": "object"}),
                                  dict(json_schema={"type": "object", "properties": {"tags": {}}})],
                         ids=["map", "any-object", "hole"])
def test_mask_leaves_out_repeats_and_acceptance_agrees(compiler, smol, spec):
    g = compiler.compile(GrammarSpec.from_params(**spec))
    m = g.matcher()
    assert m.keys_unique
    vocab = len(smol)
    prefix = '{"name":"x","tags":{"tam_":1,"tam' if spec["json_schema"] is MAP else '{"tags":{"tam_":1,"tam'
    drive(m, smol, prefix)
    mask = allowed(m, vocab)
    quoted = [t for t in range(vocab) if '"' in smol.decode([t])]
    close = smol.convert_tokens_to_ids('"')
    assert close in mask  # "tam" is a new key...
    finish = [t for t in quoted if smol.decode([t]).startswith('_"')]
    assert finish and not set(finish) & mask  # ..."tam" + '_"' repeats one
    # mask and acceptance agree on every token of the vocabulary (a sample of the rest)
    rng = random.Random(0)
    sample = set(quoted) | set(rng.sample(range(vocab), 3000))
    assert accepted(m, sorted(sample)) == mask & sample
    # a key may still start with a seen one, and not end there
    under = [t for t in mask if smol.decode([t]) == "_"]
    assert under and m.accept_token(under[0])
    now = allowed(m, vocab)
    assert close not in now and not m.accept_token(close)
    assert smol.convert_tokens_to_ids("a") in now  # "tam_a" is new
    m.rollback(1)
    # in a nested object the outer keys are free again
    m2 = g.matcher()
    drive(m2, smol, prefix + 'x":2')
    assert {smol.convert_tokens_to_ids(",")} <= allowed(m2, vocab)


def test_rollback_forgets_a_key(compiler, smol):
    g = compiler.compile(GrammarSpec.from_params(json_schema=MAP))
    m = g.matcher()
    drive(m, smol, '{"name":"x","tags":{')
    n = m.num_accepted
    drive(m, smol, '"ab":1,')
    drive(m, smol, '"ab')
    close = smol.convert_tokens_to_ids('"')
    assert not m.accept_token(close)
    m.rollback(m.num_accepted - n)
    drive(m, smol, '"ab')
    assert m.accept_token(close)


def test_grammar_wins_where_unique_keys_leave_nothing(compiler, smol):
    # the only key the map may have is "a", and a comma asks for another entry
    schema = {"type": "object", "patternProperties": {"^a$": {"type": "integer"}}, "additionalProperties": False}
    try:
        g = compiler.compile(GrammarSpec.from_params(json_schema=schema))
    except ValueError as e:
        pytest.fail(f"schema should compile: {e}")
    m = g.matcher()
    drive(m, smol, '{"a":1,"a')
    assert allowed(m, len(smol))  # the repeat is all the grammar allows: allowed
    drive(m, smol, '":2}')
    assert m.can_terminate()


DECLARED = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "home": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
    "shape": {"enum": [{"kind": "circle", "r": 1}, "none"]}}, "required": ["name"],
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "additionalProperties": False}}}


@pytest.mark.parametrize("schema, free", [
    (DECLARED, False), (False, False), ({"type": "object", "properties": {}, "additionalProperties": False}, False),
    (MAP, True), ({"type": "object"}, True), ({}, True), (True, True), ({"type": "array"}, True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "patternProperties": {"^x": {}}}, True),
    ({"properties": {"a": {"type": "integer"}}}, True),  # untyped: any value
    ({**DECLARED, "$defs": {"Address": {"type": "object", "additionalProperties": {"type": "string"}}}}, True),
    ({"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "object", "properties": {"p": {}}}]}}, True),
    ({"type": "array", "items": [{"type": "integer"}, {"type": "object"}]}, True),  # a draft-04 tuple
    ({"type": ["null", {"type": "object", "properties": {"a": {}}}]}, True),  # draft-03: a type holding a schema
    ({"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": False,
      "extends": {"patternProperties": {"^x": {}}}}, True),  # draft-03's extends
    ({"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": False,
      "extends": [{"type": "object", "additionalProperties": False}]}, False),
])
def test_schemas_with_free_keys(schema, free):
    assert schema_has_free_keys(schema) == free


def test_declared_keys_only_skip_the_check(compiler, smol):
    assert not compiler.compile(GrammarSpec.from_params(json_schema=DECLARED)).matcher().keys_unique
    assert compiler.compile(GrammarSpec.from_params(json_schema=MAP)).matcher().keys_unique
    # spec mode admits extra members after the declared ones: checked
    with GrammarCompiler(smol, [smol.eos_token_id], vocab_size=len(smol), json_schema_mode="spec") as c:
        assert c.compile(GrammarSpec.from_params(json_schema=DECLARED)).matcher().keys_unique


def test_not_for_text_grammars(compiler):
    tag = {"structures": [{"begin": "<j>", "schema": MAP, "end": "</j>"}], "triggers": ["<j>"]}
    for spec in (GrammarSpec.from_params(regex=r'\{"a":1,"a":2\}'), GrammarSpec.from_params(structural_tag=tag)):
        assert not compiler.compile(spec).matcher().keys_unique


@pytest.mark.parametrize("mode, block", [("open", 'I think {"x":1} "tam_" fits.</think>\n'),
                                         ("maybe", '<think>{"tam_":1,"tam_":2}</think>'), ("maybe", "")])
def test_after_a_reasoning_block(compiler, smol, mode, block):
    """The block is free text (keys in it count for nothing); the answer's keys are checked."""
    g = compiler.compile(GrammarSpec.from_params(json_schema=MAP, reasoning=mode))
    m = g.matcher()
    assert m.keys_unique
    drive(m, smol, block + '{"name":"x","tags":{"tam_":1,"tam')
    under = [t for t in range(len(smol)) if smol.decode([t]) == "_"]
    assert m.accept_token(under[0])
    close = smol.convert_tokens_to_ids('"')
    assert close not in allowed(m, len(smol)) and not m.accept_token(close)


def test_model_loop_no_longer_repeats_keys():
    """SmolLM2 at temperature 0 under a string-to-int map wrote ``"tags":123`` over and over
    (the old output: '{"name":"apple","tags":{"name":123,"tags":123,"tags":123,...')."""
    from treadle.runtime.engine import Engine

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {
        "type": "object", "additionalProperties": {"type": "integer"}}}, "required": ["name", "tags"]}
    with Engine(max_total_tokens=8192) as e:
        out = e.generate("Describe a fruit as JSON with a name and tags.",
                         {"temperature": 0, "max_new_tokens": 96, "json_schema": json.dumps(schema)})
    text = out["text"]
    tags = text[text.index('"tags":{') + 8:]
    keys = re.findall(r'"((?:[^"\\]|\\.)*)":', tags)
    assert len(keys) >= 3, text
    assert len(keys) == len(set(keys)), text

"""A reasoning block before the constrained answer (constrained/ebnf/reasoning_prefix.py): the
regex around a grammar's, on examples for every kind (with calls: the definitions stay
reachable), the compiled grammar on SmolLM2's vocabulary (a thinking reply then JSON, the
block free, the answer constrained), and an Engine request whose reply starts inside the
block (free text, replayed through its grammar)."""
from __future__ import annotations

import json
import re

import pytest

from treadle.constrained.compile.grammar import GrammarSpec
from treadle.runtime.sampling_params import SamplingParams

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "extra": {"type": "object"}}, "required": ["a"]}
TREE = {"type": "object", "properties": {"label": {"type": "string"},
                                         "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["label"]}
THINK = "<think>\nThe user wants JSON; a < b and </thin k> are fine here.\n</think>\n\n"


@pytest.mark.parametrize("params, answers, wrong", [
    ({"json_schema": OBJ}, ['{"a":1}', '{"a":1,"extra":{"x":[1]}}'], ['{"b":1}', "no"]),
    ({"choices": ["yes", "no"]}, ["yes", "no"], ["maybe"]),
    ({"regex": "[0-9]{2}|x"}, ["42", "x"], ["4", "xx"]),
    ({"ebnf": 'root ::= "(" root ")" | "x"'}, ["x", "((x))"], ["(x", "()"]),
    ({"structural_tag": {"structures": [{"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}],
                         "triggers": ["<a>"]}}, ["text <a>5</a> more", ""], ["<a>x</a>"]),
])
def test_the_block_is_free_and_the_answer_constrained(params, answers, wrong):
    """On the regex, with Python's re (holes and calls: on the real vocabulary below)."""
    for mode in ("open", "maybe"):
        regex = re.compile(GrammarSpec.from_params(**params, reasoning=mode).to_regex(), re.S)
        head = THINK if mode == "maybe" else THINK[len("<think>"):]
        for a in answers:
            assert regex.fullmatch(head + a), (mode, a)
            assert bool(regex.fullmatch(a)) == (mode == "maybe"), (mode, a)  # "maybe": no block at all
        for w in wrong:
            assert not regex.fullmatch(head + w), (mode, w)
        if "structural_tag" not in params:  # (whose answer is free text) one block, before the answer
            assert not regex.fullmatch(head + answers[0] + "</think>")
            assert not regex.fullmatch("<think>a</think>b</think>" + answers[1])


def test_calls_keep_their_definitions():
    from treadle.constrained.index.json_holes import ENTRY_CHAR

    plain = GrammarSpec.from_params(json_schema=TREE).to_regex(holes=True)
    wrapped = GrammarSpec.from_params(json_schema=TREE, reasoning="open").to_regex(holes=True)
    assert wrapped.count(ENTRY_CHAR) == plain.count(ENTRY_CHAR) == 1
    assert wrapped.endswith(plain[plain.index("|" + ENTRY_CHAR):])  # the definitions, after the root


def test_mode_and_params_are_checked():
    with pytest.raises(ValueError, match="'open' or 'maybe'"):
        GrammarSpec.from_params(regex="a", reasoning="always")
    with pytest.raises(ValueError, match="grammar_after_reasoning"):
        SamplingParams.from_dict({"regex": "a", "grammar_after_reasoning": "yes"})
    assert GrammarSpec.from_params(reasoning="open") is None  # nothing to constrain
    own = GrammarSpec.from_params(regex="<think>[a-z]+</think>[0-9]", reasoning="maybe")
    assert own == GrammarSpec.from_params(regex="<think>[a-z]+</think>[0-9]")  # it writes the block itself
    a, b = GrammarSpec.from_params(regex="a"), GrammarSpec.from_params(regex="a", reasoning="maybe")
    assert a != b and a.to_regex() != b.to_regex()  # separate cache entries


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    from treadle.constrained.compile.compiler import GrammarCompiler

    tok = smollm2_tokenizer
    with GrammarCompiler(tok, [tok.eos_token_id], vocab_size=len(tok)) as c:
        yield c


@pytest.mark.parametrize("schema", [OBJ, TREE, {"type": "object"}])
def test_a_thinking_reply_then_json_on_the_real_vocabulary(compiler, smollm2_tokenizer, schema):
    """The model's own tokens: the block takes any text (JSON-invalid prose, a lone '<'), the
    answer only valid JSON, EOS only once it is complete. Any-JSON ({"type": "object"}) runs
    on the regex with a hole here, not the pushdown grammar alone."""
    from json_checks import allowed_ids
    from treadle.constrained.decode.bitmask import allocate_token_bitmask

    tok = smollm2_tokenizer
    g = compiler.compile(GrammarSpec.from_params(json_schema=schema, reasoning="maybe"))
    assert g.holes is not None
    answer = {OBJ is schema: '{"a":7,"extra":{"deep":[1,{"x":null}]}}',
              TREE is schema: '{"label":"r","kids":[{"label":"a","kids":[{"label":"b","kids":[{"label":"c"}]}]}]}'
              }.get(True, '{"any":[1,2,{"n":null}]}')
    bitmask = allocate_token_bitmask(1, len(tok))
    m = g.matcher()
    ids = tok.encode(THINK + answer, add_special_tokens=False)
    think_ids = len(tok.encode(THINK, add_special_tokens=False))
    for i, t in enumerate(ids):
        m.fill_next_token_bitmask(bitmask, 0)
        allowed = allowed_ids(bitmask[0].numpy())
        assert t in allowed, tok.decode(ids[:i + 1])
        if 2 < i < think_ids - 8:  # inside the block: nearly every token
            assert len(allowed) > len(tok) - 300
        assert tok.eos_token_id not in allowed, tok.decode(ids[:i])  # complete only at the end
        assert m.accept_token(t)
    assert m.accept_token(tok.eos_token_id)
    m = g.matcher()
    assert all(m.accept_token(t) for t in tok.encode(THINK, add_special_tokens=False))
    assert not m.accept_token(tok.encode("Sure", add_special_tokens=False)[0])  # prose after the block
    assert m.accept_token(tok.encode("{", add_special_tokens=False)[0])


def test_engine_reply_starting_inside_the_block_is_free(smollm2_tokenizer):
    """"open": the reply starts inside the block, so the model's prose is allowed (without the
    mode it would be held to JSON from the first token); replayed through its grammar."""
    from treadle.runtime import Engine

    params = {"json_schema": OBJ, "max_new_tokens": 12, "temperature": 0}
    with Engine(max_total_tokens=4096) as e:
        free = e.generate("Tell me a story.", {**params, "grammar_after_reasoning": "open"})
        held = e.generate("Tell me a story.", params)
        g = e.scheduler.grammar_compiler.compile(GrammarSpec.from_params(json_schema=OBJ, reasoning="open"))
    assert held["text"].startswith("{")
    assert not free["text"].lstrip().startswith("{") and re.search("[a-z]{3}", free["text"]), free["text"]
    m = g.matcher()
    assert all(m.accept_token(t) for t in free["output_ids"])
    json.dumps(free)  # plain data

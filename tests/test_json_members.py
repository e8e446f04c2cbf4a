"""Ordered members (constrained/schema/members.py): an object's declared properties written as one node
that the lazy index builds as a linear automaton, instead of the spelt-out regex whose text
grows with the square of the optional properties (issue 31).

The node's index must accept exactly the language of its spelt-out text (``expand_members``):
compared token by token with outlines-core's index of that text over the whole vocabulary.
Then schemas that the quadratic text made too large: 60 optional object-valued properties, and
a real Kubernetes PodSpec, compile within the default limits and their outputs validate.
"""
from __future__ import annotations

import json
import os
import random
import sys

import jsonschema
import pytest
from test_lazy_index import EOS, V, same_as_outlines_core

from treadle.constrained import GrammarCompileError, GrammarCompiler, GrammarSpec
from treadle.constrained.index.grammar_size import regex_size, schema_size
from treadle.constrained.index.index_markers import MEMBERS_OPEN
from treadle.constrained.index.lazy_index import LazyIndex
from treadle.constrained.schema.members import MEMBERS_MIN_CHARS, expand_members, members_text, spell_members
from treadle.constrained.index.vocabulary import build_vocabulary

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")

ATOMS = ['"a":[0-9]{1,2}', '"bb":(?:true|false)', '"c":"[a-z]{0,3}"', '"d":null', r'"e":\[(?:[0-9](?:,[0-9])*)?\]']


@pytest.fixture(scope="module")
def vocab(smol):
    return build_vocabulary(smol, [EOS])


@pytest.fixture(scope="module")
def compiler(smol):
    with GrammarCompiler(smol, [EOS], vocab_size=V) as c:
        yield c


def _members(rng: random.Random, depth: int, shape: str) -> str:
    n = rng.randint(2, 4)
    entries = []
    for i in range(n):
        if depth and i == 1:  # an object-valued entry whose members are a node too
            text = f'"o{i}":\\{{' + _members(rng, depth - 1, "mixed") + r"\}"
        else:
            text = rng.choice(ATOMS)
        req = {"optional": False, "required": True}.get(shape, rng.random() < 0.4)
        entries.append((text, req))
    if shape == "last_required":
        entries[-1] = (entries[-1][0], True)
    return members_text(entries, ",", rng.random() < 0.5 if shape != "optional_nonempty" else False)


CASES = [("optional", 0, 0), ("optional_nonempty", 0, 1), ("mixed", 0, 2), ("mixed", 0, 3),
         ("last_required", 0, 4), ("required", 0, 5), ("mixed", 1, 6), ("optional", 2, 7)]


@pytest.mark.parametrize("shape,depth,seed", CASES)
def test_members_index_equals_outlines_core_of_the_spelt_out_text(vocab, shape, depth, seed):
    """Same allowed tokens and finality at every state of random walks: the node (lazy index)
    against its spelt-out text (outlines-core's index), required/optional mixes, all optional
    with and without the empty sequence, members nested inside an entry."""
    rng = random.Random(seed)
    regex = r"\{" + _members(rng, depth, shape) + r"\}"
    assert MEMBERS_OPEN in regex or "\U0010fff1" in regex
    spelt = expand_members(regex)
    assert not any(0x10FFF0 <= ord(c) <= 0x10FFF4 for c in spelt)
    assert same_as_outlines_core(vocab, regex, spelt, seed=seed, walks=4, steps=20) >= 4


def test_expand_members_is_the_translators_old_text_and_is_capped():
    entries = [('"a":1', False), ('"b":2', True), ('"c":3', False)]
    node = "x(?:" + members_text(entries, ",", False) + ")y"
    assert expand_members(node) == "x(?:" + spell_members(entries, ",", False) + ")y"
    many = [(f'"p{i}":"[a-z]{{0,9}}"', False) for i in range(300)]
    with pytest.raises(ValueError, match="pass 100,000 characters"):
        expand_members(members_text(many, ","), 100_000)


def _wide_schema(n: int) -> dict:
    value = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 8},
                                              "on": {"type": "boolean"}}, "required": ["id"]}
    return {"type": "object", "properties": {f"p{i:02d}": value for i in range(n)}, "additionalProperties": False}


def _walk_and_validate(g, smol, schema, walks: int, seed: int) -> int:
    sys.path.insert(0, BENCH)
    from grammar_walks import random_text

    from treadle.constrained import allocate_token_bitmask

    bitmask = allocate_token_bitmask(1, V)
    rng = random.Random(seed)
    checker = jsonschema.validators.validator_for(schema)(schema)
    done = 0
    for _ in range(walks):
        text = random_text(g.matcher(), bitmask, g.token_bytes, EOS, rng, steps=400)
        if text is not None:
            errors = list(checker.iter_errors(json.loads(text)))
            assert not errors, (text[:300], errors[0].message)
            done += 1
    return done


def test_sixty_optional_object_properties_compile_small_and_validate(compiler, smol):
    schema = _wide_schema(60)
    spec = GrammarSpec.from_params(json_schema=schema)
    regex = spec.to_regex(members=True)
    spelt = expand_members(regex)
    assert len(regex) < 50_000 and 20 * len(regex) < len(spelt), (len(regex), len(spelt))  # 39k, 1.2M
    assert spelt == spec.to_regex()  # the standard text is what the translator wrote before
    assert regex_size(regex) < regex_size(spelt) // 10
    assert schema_size(schema, members=True)[0] == 60 and schema_size(schema)[0] == 3600
    g = compiler.compile(spec)
    assert isinstance(g.index, LazyIndex)
    assert _walk_and_validate(g, smol, schema, walks=8, seed=3) >= 6


def test_outlines_core_fallback_refuses_a_huge_expansion_naming_the_cap(smol):
    """outlines-core's index needs the spelt-out text: past max_grammar_size it is the usual
    refusal, before anything is built (the expansion's length is known from the node)."""
    with GrammarCompiler(smol, [EOS], vocab_size=V, token_index="outlines", max_grammar_size=20_000) as c:
        with pytest.raises(GrammarCompileError, match="max_grammar_size 20,000"):
            c.compile(GrammarSpec.from_params(json_schema=_wide_schema(60)))
        small = c.compile(GrammarSpec.from_params(json_schema=_wide_schema(2)))  # short: no node
        assert not isinstance(small.index, LazyIndex) and MEMBERS_OPEN not in small.regex


def _podspec() -> dict:
    import kubernetes_validate

    sys.path.insert(0, BENCH)
    from schema_corpus import _bundle_k8s

    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                        "v1.30.0-local-strict")
    defs = json.load(open(os.path.join(base, "_definitions.json")))["$defs"]
    return _bundle_k8s(json.load(open(os.path.join(base, "podspec-v1.json"))), defs)


def test_kubernetes_podspec_compiles_within_the_default_limits(compiler, smol):
    """A real PodSpec (~40 optional properties whose values are big objects, nested): its
    spelt-out text passes 50 million characters; as nodes it compiles with the defaults."""
    schema = _podspec()
    spec = GrammarSpec.from_params(json_schema=schema)
    regex = spec.to_regex(members=True)
    with pytest.raises(ValueError):
        expand_members(regex, 50_000_000)
    g = compiler.compile(spec)
    assert isinstance(g.index, LazyIndex)
    assert _walk_and_validate(g, smol, schema, walks=4, seed=5) >= 2


def test_kubernetes_podspec_generations_validate():
    """The embedded model through the Engine, greedy and sampled beside an unconstrained
    request: every finished output validates against the PodSpec."""
    from treadle.runtime import Engine
    from treadle.runtime.tokenizer import apply_chat_template

    schema = _podspec()
    with Engine(max_total_tokens=4096) as e:
        prompt = apply_chat_template(e.tokenizer, [{"role": "user", "content": (
            'Reply with exactly this JSON: {"containers":[{"name":"web","image":"nginx"}],"hostNetwork":true}')}])
        params = [{"json_schema": schema, "max_new_tokens": 96, "temperature": 0},
                  {"json_schema": schema, "max_new_tokens": 96, "temperature": 0.8, "seed": 4},
                  {"max_new_tokens": 16, "temperature": 0}]
        outs = e.generate([prompt, prompt, "The capital of France is"], params)
        finished = 0
        checker = jsonschema.validators.validator_for(schema)(schema)
        for out in outs[:2]:
            assert "error" not in out["meta_info"], out["meta_info"]
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                errors = list(checker.iter_errors(json.loads(out["text"])))
                assert not errors, (out["text"], errors[0].message)
                finished += 1
        assert finished >= 1, [o["text"][:200] for o in outs[:2]]
        assert outs[2]["meta_info"]["completion_tokens"] > 0
        e.check_integrity()


def test_a_schema_naming_the_markers_is_translated_without_nodes(compiler):
    """The markers are never characters: a schema holding one is refused as before (reserved
    code points), not read as a node; one that names code points near them (even through JSON
    escapes) is spelt out, and still compiles."""
    props = {f"p{i:02d}": {"type": "string", "maxLength": 4} for i in range(25)}
    plain = {"type": "object", "properties": props}
    assert MEMBERS_OPEN in compiler.compile(GrammarSpec.from_params(json_schema=plain)).regex
    holding = {"type": "object", "properties": {**props, "m": {"enum": ["\U0010fff2x\U0010fff4"]}}}
    with pytest.raises(ValueError, match="reserved"):
        compiler.compile(GrammarSpec.from_params(json_schema=holding))
    text = json.dumps({**plain, "description": "U+10FFF0 is private"}).replace("10FFF0", "\\u0031\\u0030FFF0")
    g = compiler.compile(GrammarSpec("json_schema", text))
    assert MEMBERS_OPEN not in g.regex and isinstance(g.index, LazyIndex)

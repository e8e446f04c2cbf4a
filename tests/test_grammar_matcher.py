"""GrammarMatcher (accept / mask / rollback / terminate) and the bitmask helpers."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch

from treadle.constrained import (
    GrammarMatcher,
    GrammarSpec,
    allocate_token_bitmask,
    apply_token_bitmask_ref,
    bitmask_to_bool,
    build_compiled_grammar,
    reset_bitmask_row,
)

EOS = 2
V = 49152
REGEXES = [r"[0-9]{3}-[a-z]+", r"(yes|no)", r'\{"name":"[a-z]{1,10}","age":[0-9]{1,3}\}', r"(é|ü|😀)+ x"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
}


@pytest.fixture(scope="module")
def grammars(smol):
    out = {rx: build_compiled_grammar(rx, smol, [EOS], vocab_size=V) for rx in REGEXES}
    schema_rx = GrammarSpec.from_params(json_schema=SCHEMA).to_regex()
    out["schema"] = build_compiled_grammar(schema_rx, smol, [EOS], vocab_size=V)
    return out


def allowed_ids(m: GrammarMatcher, vocab: int = V) -> set[int]:
    bm = allocate_token_bitmask(1, vocab)
    m.fill_next_token_bitmask(bm, 0)
    return set(bitmask_to_bool(bm, vocab)[0].nonzero().flatten().tolist())


def index_allowed(g, state) -> set[int]:
    # ids past the tokenizer's are pseudo-tokens (json_holes.py, index_markers.py)
    ids = {i for i in g.index.get_allowed_tokens(state) if i < g.num_tokens} - {EOS} - g.reserved_tokens
    if g.is_final(state):
        ids.add(EOS)
    return ids


def random_walk(g, smol, rng: random.Random, max_steps: int = 300) -> tuple[list[int], GrammarMatcher]:
    m = GrammarMatcher(g)
    out: list[int] = []
    for _ in range(max_steps):
        allowed = allowed_ids(m)
        assert allowed == index_allowed(g, m.state)
        assert (EOS in allowed) == m.can_terminate()
        if EOS in allowed and (len(allowed) == 1 or rng.random() < 0.4):
            tid = EOS
        else:
            choices = sorted(allowed - {EOS})
            assert choices, "non-final state without tokens"
            tid = rng.choice(choices)
        assert m.accept_token(tid)
        out.append(tid)
        if m.is_terminated():
            return out, m
    raise AssertionError("walk did not terminate")


@pytest.mark.parametrize("key", REGEXES)
def test_random_walks_fullmatch(grammars, smol, key):
    g = grammars[key]
    rng = random.Random(REGEXES.index(key))
    for _ in range(5):
        out, m = random_walk(g, smol, rng)
        assert out[-1] == EOS and m.num_accepted == len(out)
        text = b"".join(g.token_bytes[t] for t in out[:-1]).decode()
        assert re.fullmatch(key, text), text


def test_json_schema_walks_validate(grammars, smol):
    g = grammars["schema"]
    rng = random.Random(7)
    for _ in range(5):
        out, _ = random_walk(g, smol, rng)
        doc = json.loads(b"".join(g.token_bytes[t] for t in out[:-1]).decode())
        jsonschema.validate(doc, SCHEMA)
        assert list(doc) == ["name", "age", "tags"]  # property order kept


def test_rejects_disallowed_and_eos_before_final(grammars, smol):
    g = grammars[r"[0-9]{3}-[a-z]+"]
    m = GrammarMatcher(g)
    state = m.state
    for bad in (EOS, smol.convert_tokens_to_ids("a"), 0, V + 5, -1):
        assert not m.accept_token(bad)
        assert m.state == state and m.num_accepted == 0
    assert EOS not in allowed_ids(m) and not m.can_terminate()
    for tid in smol.encode("123-ab", add_special_tokens=False):
        assert m.accept_token(tid)
    assert m.can_terminate() and EOS in allowed_ids(m)
    assert m.accept_token(EOS) and m.is_terminated()
    assert not m.accept_token(smol.convert_tokens_to_ids("a"))
    assert allowed_ids(m) == {EOS}  # a terminated row allows only EOS


def test_rollback_restores_state_mask_and_jump(grammars, smol):
    g = grammars[r'\{"name":"[a-z]{1,10}","age":[0-9]{1,3}\}']
    m = GrammarMatcher(g, max_rollback=32)
    ids = smol.encode('{"name":"bob","age":4', add_special_tokens=False)
    snapshots = []
    for tid in ids:
        snapshots.append((m.state, allowed_ids(m), m.find_jump_forward_string()))
        assert m.accept_token(tid)
    for k in range(len(ids), 0, -1):
        m.rollback(1)
        assert (m.state, allowed_ids(m), m.find_jump_forward_string()) == snapshots[k - 1]
        assert m.num_accepted == k - 1
    with pytest.raises(ValueError, match="roll back"):
        m.rollback(1)
    # Rolling back an EOS un-terminates.
    for tid in smol.encode('{"name":"x","age":1}', add_special_tokens=False):
        assert m.accept_token(tid)
    assert m.accept_token(EOS) and m.is_terminated()
    m.rollback(1)
    assert not m.is_terminated() and m.can_terminate()


def test_max_rollback_bounds_history(grammars, smol):
    m = GrammarMatcher(grammars[r"[0-9]{3}-[a-z]+"], max_rollback=2)
    for tid in smol.encode("123-abcdef", add_special_tokens=False):
        assert m.accept_token(tid)
    m.rollback(2)
    with pytest.raises(ValueError, match="max_rollback=2"):
        m.rollback(1)


def test_padding_ids_and_extra_eos_ids(smol):
    g = build_compiled_grammar(r"(yes|no)", smol, [EOS, 0], vocab_size=V + 70)
    m = GrammarMatcher(g)
    bm = allocate_token_bitmask(2, V + 70)
    assert bm.shape == (2, (V + 70 + 31) // 32)
    m.fill_next_token_bitmask(bm, 1)
    allowed = bitmask_to_bool(bm, V + 70)
    assert not allowed[1, V:].any() and allowed[0].all()  # row 0 untouched (allow-all)
    assert not m.accept_token(V + 3)
    for tid in smol.encode("yes", add_special_tokens=False):
        assert m.accept_token(tid)
    got = allowed_ids(m, V + 70)
    assert got == {EOS, 0}  # both EOS ids, nothing else, in the final state
    assert m.accept_token(0) and m.is_terminated()


def test_fill_rejects_narrow_bitmask(grammars):
    m = GrammarMatcher(grammars[r"(yes|no)"])
    with pytest.raises(ValueError, match="bitmask"):
        m.fill_next_token_bitmask(torch.zeros((1, 10), dtype=torch.int32), 0)


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 100, 1000, 49157])
def test_apply_bitmask_matches_bool_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    batch = 3
    allowed = torch.rand((batch, vocab), generator=gen) < 0.3
    allowed[0] = True
    # Pack the bool reference into words by hand (independent of bitmask_to_bool).
    words = (vocab + 31) // 32
    bm = torch.zeros((batch, words), dtype=torch.int64)
    idx = torch.arange(vocab)
    contrib = allowed.to(torch.int64) << (idx % 32)
    bm.index_add_(1, idx // 32, contrib)
    bm = torch.where(bm >= 2**31, bm - 2**32, bm).to(torch.int32)
    logits = torch.randn((batch, vocab), generator=gen)
    expected = logits.masked_fill(~allowed, float("-inf"))
    apply_token_bitmask_ref(logits, bm)
    assert torch.equal(logits, expected)
    assert torch.equal(bitmask_to_bool(bm, vocab), allowed)


def test_bitmask_allocate_reset_and_narrow():
    bm = allocate_token_bitmask(2, 70)
    assert bm.dtype == torch.int32 and bm.shape == (2, 3) and (bm == -1).all()
    bm.zero_()
    reset_bitmask_row(bm, 1)
    assert (bm[0] == 0).all() and (bm[1] == -1).all()
    reset_bitmask_row(bm)
    assert (bm == -1).all()
    # Logits wider than the bitmask: the extra ids are masked.
    logits = torch.zeros((2, 100))
    apply_token_bitmask_ref(logits, bm)
    assert torch.isinf(logits[:, 96:]).all() and (logits[:, :96] == 0).all()
    with pytest.raises(ValueError):
        apply_token_bitmask_ref(torch.zeros(3, 5), bm)

"""A JSON schema whose exact automaton passes the size cap is built again with its bounded
repetitions lowered (compiler.lazy_nfa, lazy_index.build_nfa's ``narrow_to``): a subset of
what the schema allows, so it compiles and every output still validates. A user's own regex,
and a schema's spec mode, are never narrowed: they are refused by the cap as before."""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from treadle.constrained import GrammarSpec
from treadle.constrained.compile.compiler import GrammarTooLarge, spec_automaton
from treadle.constrained.index.index_markers import END_CHAR, START_CHAR
from treadle.constrained.index.lazy_index import LazyIndex, TokenArrays, build_nfa

BYTES = TokenArrays({b: bytes([b]) for b in range(256)})  # one token per byte: walks spell bytes

# cfn-lint's AWS::SES::MailManagerAddressList, trimmed to what makes it large: up to 200 tags of
# a 128- and a 256-character string (14 million automaton states spelt out; the cap is 3 million)
SES_TAGS = {
    "additionalProperties": False,
    "definitions": {"Tag": {"additionalProperties": False, "required": ["Key", "Value"], "type": "object",
                            "properties": {"Key": {"maxLength": 128, "minLength": 1, "type": "string"},
                                           "Value": {"maxLength": 256, "minLength": 0, "type": "string"}}}},
    "properties": {"AddressListName": {"maxLength": 255, "minLength": 1, "pattern": "^[a-zA-Z0-9_.-]+$", "type": "string"},
                   "Tags": {"items": {"$ref": "#/definitions/Tag"}, "maxItems": 200, "minItems": 1, "type": "array"}},
    "required": ["Tags"],
    "type": "object",
}


def _run(index: LazyIndex, s: int | None, text: bytes) -> int | None:
    for b in text:
        if s is None:
            return None
        s = index.get_next_state(s, b)
    return s


def _start(index: LazyIndex, marks: bool) -> int:
    """Where output starts: after the start marker of a compiled grammar (index_markers.py)."""
    s = index.get_initial_state()
    return _run(index, s, START_CHAR.encode()) if marks else s


def _final(index: LazyIndex, s: int | None, marks: bool) -> bool:
    if marks:
        s = _run(index, s, END_CHAR.encode())
    return s is not None and index.is_final_state(s)


def _accepts(index: LazyIndex, text: bytes, marks: bool = False) -> bool:
    return _final(index, _run(index, _start(index, marks), text), marks)


def _walk(index: LazyIndex, rng: random.Random, steps: int = 6000) -> bytes | None:
    """A random byte path of a compiled grammar's index to where it may end (None when it does
    not get there in ``steps``): ASCII preferred, closing quotes / brackets often."""
    s, out = _start(index, True), bytearray()
    for _ in range(steps):
        if _final(index, s, True) and rng.random() < 0.5:
            return bytes(out)
        allowed = [int(t) for t in index.get_allowed_tokens(s) if t < 0xF4]  # 0xF4: reserved markers
        if not allowed:
            return None
        closing = [b for b in allowed if b in b'"]}']
        ascii_ = [b for b in allowed if 0x20 <= b < 0x7F]
        pick = rng.choice(closing) if closing and rng.random() < 0.3 else rng.choice(ascii_ or allowed)
        out.append(pick)
        s = index.get_next_state(s, pick)
    return None


def test_build_nfa_narrows_a_repetition_to_a_subset():
    regex = "(?:ab[0-9]){2,5000}"
    exact = build_nfa(regex, 10**7)
    assert exact.narrowed == 0
    small = build_nfa(regex, 10**7, narrow_to=200)
    assert small.narrowed == 1 and small.num_states < exact.num_states // 10
    index = LazyIndex(small, BYTES)
    kept = max(k for k in range(1, 60) if _accepts(index, b"ab1" * k))
    assert 2 <= kept < 5000
    for k in range(0, kept + 3):  # every text the narrowed automaton accepts, the regex accepts
        text = (b"ab7" * k)
        assert _accepts(index, text) == (2 <= k <= kept)
        if _accepts(index, text):
            assert re.fullmatch(regex, text.decode())
    # the lower count is kept whatever the budget
    tiny = build_nfa("(?:ab){40,5000}", 10**7, narrow_to=3)
    assert not _accepts(LazyIndex(tiny, BYTES), b"ab" * 39) and _accepts(LazyIndex(tiny, BYTES), b"ab" * 40)


def test_a_schema_past_the_cap_compiles_narrowed_and_every_output_validates():
    spec = GrammarSpec("json_schema", json.dumps(SES_TAGS))
    regex, nfa = spec_automaton(spec, None, "strict", False, 8, max_size=150_000)
    assert nfa is not None and nfa.narrowed >= 1 and nfa.num_states <= 20 * 150_000
    index = LazyIndex(nfa, BYTES)
    validator = jsonschema.Draft202012Validator(SES_TAGS)
    rng = random.Random(0)
    finished = 0
    for _ in range(20):
        text = _walk(index, rng)
        if text is None:
            continue
        finished += 1
        validator.validate(json.loads(text))
    assert finished >= 6
    # it still writes more than one tag (the largest count that fits, not the least)
    one = {"Key": "k", "Value": "v"}
    assert _accepts(index, json.dumps({"Tags": [one] * 3}, separators=(",", ":")).encode(), marks=True)
    assert not _accepts(index, json.dumps({"Tags": []}, separators=(",", ":")).encode(), marks=True)  # minItems 1 holds


def test_a_users_regex_and_spec_mode_are_refused_not_narrowed():
    with pytest.raises(GrammarTooLarge, match="max_grammar_size"):
        spec_automaton(GrammarSpec("regex", "(?:.{300}x){0,1000}"), None, "strict", False, 8, max_size=150_000)
    with pytest.raises(GrammarTooLarge, match="max_grammar_size"):
        spec_automaton(GrammarSpec("json_schema", json.dumps(SES_TAGS)), None, "spec", False, 8, max_size=150_000)

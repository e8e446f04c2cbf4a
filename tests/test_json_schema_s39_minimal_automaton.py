"""Merging a pattern's equivalent automaton states (regex_ecma._minimal) in n k log n, not one
round of refinement per state: a pattern with a long counted run (the widely copied URL regex
``...[-a-zA-Z0-9@:%._\\+~#=]{1,256}\\.[a-zA-Z0-9()]{1,6}\\b...``, whose ``\\b`` needs the exact
automaton) took 6 s to translate (17-20 s on a loaded box), a chain of 1,500 counted states
about 40 s: Moore's rounds over a chain of n states cost n^2 k."""

from __future__ import annotations

import json
import math
import random

import interegular
import regex
from jsonschema import Draft202012Validator

from treadle.constrained import GrammarSpec, allocate_token_bitmask
from treadle.constrained.regex import regex_ecma
from treadle.constrained.regex.regex_ecma import _minimal

from json_checks import random_walk

URL = r"^https?:\/\/(www\.)?[-a-zA-Z0-9@:%._\+~#=]{1,256}\.[a-zA-Z0-9()]{1,6}\b([-a-zA-Z0-9()@:%_\+.~#?&//=]*)$"
EOS = 2
V = 49152


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", "[a-c]", "[^a]", "ab", "(?:a|bc)", "x{1,3}", "[0-9]{2,4}", "(?:ab)*", "b?", "[a-z]+"]
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice(atoms)
    if r < 0.55:
        return _random_pattern(rng, depth + 1) + _random_pattern(rng, depth + 1)
    if r < 0.75:
        return f"(?:{_random_pattern(rng, depth + 1)}|{_random_pattern(rng, depth + 1)})"
    return f"(?:{_random_pattern(rng, depth + 1)}){rng.choice(['*', '+', '?', '{0,3}', '{2}'])}"


def _live_states(fsm) -> int:
    """The states of ``fsm`` from which some string is accepted."""
    live, changed = set(fsm.finals), True
    while changed:
        changed = False
        for q, row in fsm.map.items():
            if q not in live and any(r in live for r in row.values()):
                live.add(q)
                changed = True
    return len(live)


def test_merged_automaton_accepts_the_same_strings_with_the_fewest_states():
    rng = random.Random(39)
    for _ in range(300):
        fsm = interegular.parse_pattern(_random_pattern(rng)).to_fsm()
        if rng.random() < 0.5:  # products hold equivalent states to merge
            fsm = fsm & interegular.parse_pattern(_random_pattern(rng)).to_fsm()
        if fsm.empty():
            continue  # (no live state: returned as it is)
        merged = _minimal(fsm)
        assert merged.equivalent(fsm)
        assert len(merged.states) == _live_states(fsm.reduce())  # interegular's minimal automaton


def test_a_long_counted_chain_merges_in_n_k_log_n():
    fsm = interegular.parse_pattern(r"[-a-zA-Z0-9@:%._+~#=]{1,1500}\.[a-z]{1,6}").to_fsm()
    before = regex_ecma.minimal_work
    merged = _minimal(fsm)
    work = regex_ecma.minimal_work - before
    assert len(merged.states) == len(fsm.states)  # a chain: nothing to merge, all of it checked
    # work, not seconds (this took about 22 s, one refinement round per state of the chain:
    # Moore's rounds looked at all n states' k transitions 1,500 times, 7e7 pairs)
    n, k = len(fsm.states), len(fsm.alphabet.by_transition)
    assert 0 < work <= n * k * math.log2(n), (work, n, k)


def test_the_url_regex_with_a_word_boundary_translates_in_bounded_work_and_its_outputs_match(smol):
    from treadle.constrained import build_compiled_grammar, token_bytes_table
    from treadle.constrained.index.json_any import JsonPushdown

    for schema in ({"type": "string", "pattern": URL},):  # (under maxLength: a time budget decides, see docs)
        spec = GrammarSpec.from_params(json_schema=schema)
        regex_ecma._subset_body_or_error.cache_clear()  # translated here, not remembered from elsewhere
        regex_ecma._fsm.cache_clear()
        before = regex_ecma.minimal_work
        rx = spec.to_regex(holes=True)
        # was 6 s alone (17-20 s on a loaded 2-core box), in Moore's rounds over the {1,256}
        # chain; now about 1 s. Work, not seconds: 120,000 (state, symbol) pairs refined against
        assert 0 < regex_ecma.minimal_work - before <= 600_000, regex_ecma.minimal_work - before
        table = token_bytes_table(smol)
        g = build_compiled_grammar(rx, smol, [EOS], vocab_size=V, spec=spec, pda=JsonPushdown(table, len(table), V, (EOS,)))
        rng = random.Random(7)
        bm = allocate_token_bitmask(1, V)
        finished = 0
        for _ in range(6):
            m = g.matcher()
            out = random_walk(m, bm, table, EOS, rng, steps=300, stop_p=0.3, free_steps=40, steer_after=60)
            if m.is_terminated():
                value = json.loads(out.decode())
                Draft202012Validator(schema).validate(value)
                assert regex.search(URL, value), value  # the pattern, \b as ECMA reads it on ASCII
                finished += 1
        assert finished >= 2, finished

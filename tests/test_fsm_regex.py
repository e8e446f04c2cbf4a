"""fsm_to_regex (constrained/regex/fsm_regex.py): the regex written back from a character FSM
accepts exactly what the FSM does, checked by FSM equivalence over random regexes and the
key sets it is used for (intersections and differences)."""

from __future__ import annotations

import random

import interegular
import pytest

from treadle.constrained.regex.fsm_regex import fsm_to_regex
from treadle.constrained.regex.regex_text import SAFE_RAW_CHAR, pattern_to_body

ATOMS = ["a", "b", "c", "[ab]", "[^a\"\\\\]", "x_", "(?:ab|c)", "[0-9]"]


def _random_regex(rng: random.Random, depth: int = 0) -> str:
    if depth > 2 or rng.random() < 0.3:
        return rng.choice(ATOMS)
    kind = rng.choice(["cat", "alt", "star", "opt", "plus"])
    if kind == "cat":
        return _random_regex(rng, depth + 1) + _random_regex(rng, depth + 1)
    if kind == "alt":
        return f"(?:{_random_regex(rng, depth + 1)}|{_random_regex(rng, depth + 1)})"
    return f"(?:{_random_regex(rng, depth + 1)})" + {"star": "*", "opt": "?", "plus": "+"}[kind]


def _same(a, b) -> bool:
    return (a - b).empty() and (b - a).empty()


def test_random_regexes_round_trip():
    rng = random.Random(7)
    for _ in range(150):
        rx = _random_regex(rng)
        fsm = interegular.parse_pattern(rx).to_fsm()
        back = fsm_to_regex(fsm)
        assert back is not None, rx
        assert _same(fsm, interegular.parse_pattern(back).to_fsm()), (rx, back)


def test_key_sets_round_trip_and_empty_sets_are_none():
    any_key = interegular.parse_pattern(SAFE_RAW_CHAR + "*").to_fsm()
    x = interegular.parse_pattern(pattern_to_body("^x_")).to_fsm()
    a = interegular.parse_pattern(pattern_to_body("a$")).to_fsm()
    names = interegular.parse_pattern("x_id|name").to_fsm()
    for fsm in (any_key - x, x & a, x - a, (any_key - x) - a, any_key - names, (x - names) - a):
        back = fsm_to_regex(fsm)
        assert back is not None and _same(fsm, interegular.parse_pattern(back).to_fsm()), back
    assert fsm_to_regex(x - any_key) is None
    with pytest.raises(ValueError, match="exceed"):
        fsm_to_regex(any_key - names, limit=10)


def test_a_regex_nesting_past_the_parsers_depth_is_refused() -> None:
    # a long counted repetition of a key set (^[\w]{1,2048}$ of AWS::AppFlow::Flow, read to
    # 256) is written one nested group per step: past MAX_NESTING it is a ValueError, not a
    # RecursionError in the parser that reads it next
    import interegular
    import pytest

    from treadle.constrained.regex.fsm_regex import MAX_NESTING, fsm_to_regex

    fsm = interegular.parse_pattern('"[a-z]{1,200}"').to_fsm()
    with pytest.raises(ValueError, match="nest"):
        fsm_to_regex(fsm)
    short = fsm_to_regex(interegular.parse_pattern('"[a-z]{1,20}"').to_fsm())
    assert short is not None and short.count("(") <= MAX_NESTING


def _reference_elimination(fsm, limit: int = 20_000):
    """fsm_to_regex's state elimination as first written (every round scans every edge for
    each state's predecessors): the order and the regex the heap version must reproduce."""
    from treadle.constrained.regex.fsm_regex import _alt, _edge_classes, _live_states
    from treadle.constrained.regex.regex_text import has_top_level_alternation

    def _group(x: str) -> str:
        return f"(?:{x})" if has_top_level_alternation(x) else x

    from interegular.fsm import anything_else

    live = _live_states(fsm)
    if fsm.initial not in live:
        return None
    classes = _edge_classes(fsm)

    def least_char(symbol):  # 'anything else' after every character
        chars = [c for c in fsm.alphabet.by_transition[symbol] if c is not anything_else]
        return (not chars, min(chars) if chars else "")

    number, queue = {fsm.initial: 0}, [fsm.initial]
    while len(queue) > 0:
        p = queue.pop(0)
        for symbol in sorted(fsm.map.get(p, {}), key=least_char):
            q = fsm.map[p][symbol]
            if q in live and q not in number:
                number[q] = len(number)
                queue.append(q)
    start, end = object(), object()
    edges = {q: {} for q in (start, *sorted(number.values()))}
    edges[start][0] = ""
    for p in sorted(number, key=number.get):
        by_target = {}
        for symbol in sorted(fsm.map.get(p, {}), key=least_char):
            q = fsm.map[p][symbol]
            if q in live:
                by_target.setdefault(number[q], []).append(symbol)
        for q, symbols in by_target.items():
            edges[number[p]][q] = classes(symbols)
        if p in fsm.finals:
            edges[number[p]][end] = _alt(edges[number[p]].get(end), "")
    pending = set(number.values())
    while pending:
        into = {q: [p for p in edges if q in edges[p] and p != q] for q in pending}
        q = min(pending, key=lambda s: (len(into[s]) * len([r for r in edges[s] if r != s]), s))
        pending.discard(q)
        loop = edges[q].pop(q, None)
        star = f"(?:{loop})*" if loop else ""
        outs = list(edges.pop(q).items())
        for p in into[q]:
            a = edges[p].pop(q)
            for r, b in outs:
                edges[p][r] = _alt(edges[p].get(r), _group(a) + star + _group(b))
    return edges[start].get(end)


def test_the_elimination_order_is_kept_fewest_paths_first_ties_by_number():
    # the heap that picks the next state (fewest paths through, ties by the states' numbers in
    # a breadth-first walk from the start, edges by their least character) eliminates in
    # the very order of a full scan each round, so the regex is the same text, character for
    # character: random regexes, and a key set of many names (an object's extra members)
    rng = random.Random(11)
    for _ in range(200):
        fsm = interegular.parse_pattern(_random_regex(rng)).to_fsm()
        assert fsm_to_regex(fsm) == _reference_elimination(fsm)
    any_key = interegular.parse_pattern(SAFE_RAW_CHAR + "*").to_fsm()
    words = sorted({"".join(rng.choice("abcdefgh_") for _ in range(rng.randint(1, 7))) for _ in range(60)})
    for fsm in (any_key - interegular.parse_pattern("|".join(words)).to_fsm(),
                interegular.parse_pattern("(?:" + "|".join(words) + ")_[a-c]+").to_fsm()):
        got = fsm_to_regex(fsm, limit=10**7)
        assert got == _reference_elimination(fsm)
        assert _same(fsm, interegular.parse_pattern(got).to_fsm())

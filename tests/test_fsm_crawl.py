"""constrained/regex/fsm_crawl.py: interegular's FSM operations through the linear crawl give the
very FSMs the library's own crawl gives (same states, numbering, finals and edges)."""

from __future__ import annotations

import contextlib
import itertools

import interegular
import interegular.fsm as ifsm
import pytest

from treadle.constrained.regex import fsm_crawl

PATTERNS = [
    "arn:([a-z0-9-]+):personalize:.*:.*:.+",
    "[a-zA-Z0-9][a-zA-Z0-9_-]*",
    "(ab|a)*c?",
    "x{2,5}(y|z){0,3}",
    "[^:]*:[^:]*",
    "",
]


@contextlib.contextmanager
def _library_crawl():
    ifsm.crawl = fsm_crawl.interegular_crawl
    try:
        yield
    finally:
        ifsm.crawl = fsm_crawl.crawl


def _ops(a: str, b: str) -> list:
    fa, fb = interegular.parse_pattern(a).to_fsm(), interegular.parse_pattern(b).to_fsm()
    return [fa, fa | fb, fa & fb, fa - fb, fa + fb, fa.star(), fa.reversed(), ifsm.FSM.times(fb, 3),
            fa.everythingbut()]


def _same(x, y) -> None:
    assert x.initial == y.initial and set(x.states) == set(y.states) and x.finals == y.finals
    assert x.map == y.map and x.alphabet == y.alphabet


def test_the_linear_crawl_is_installed():
    assert ifsm.crawl is fsm_crawl.crawl


@pytest.mark.parametrize("a,b", list(itertools.permutations(PATTERNS, 2))[:20])
def test_operations_build_the_same_fsm(a, b):
    ours = _ops(a, b)
    with _library_crawl():
        theirs = _ops(a, b)
    for x, y in zip(ours, theirs):
        _same(x, y)


def test_a_pattern_under_a_length_bound_compiles_quickly_and_exactly():
    """The case that spent 7 s in the library's crawl: ``.*:.*:.+`` within 256 characters.
    The product's language is checked on strings at and past the bound."""
    pattern = interegular.parse_pattern("arn:([a-z0-9-]+):personalize:.*:.*:.+").to_fsm()
    bounded = interegular.parse_pattern(".{0,256}").to_fsm()
    both = pattern & bounded
    assert both.accepts("arn:aws:personalize:x:y:z")
    head = "arn:a:personalize:::"
    assert both.accepts(head + "z" * (256 - len(head)))
    assert not both.accepts(head + "z" * (257 - len(head)))
    assert not both.accepts("arn:A:personalize:x:y:z")

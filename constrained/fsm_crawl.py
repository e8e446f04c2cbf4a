"""interegular's FSM operations with a crawl that is linear in the states it finds.

interegular builds every product FSM (``&``, ``|``, ``-``, concatenation, reversal) through
one function, ``interegular.fsm.crawl``, which numbers each new state by searching the list
of states found so far (``states.index(next)``): quadratic in the states, each step an
equality test of frozensets or dicts. The product of a pattern with a length bound of a few
hundred has thousands of states, and a single CloudFormation string
(``arn:([a-z\\d-]+):personalize:.*:.*:.+`` with maxLength 256) spent 7 of its 8 seconds of
compile there. This crawl numbers the states through a dict instead. It finds the same
states in the same order, so the FSMs it returns are identical, state numbers included
(tests/test_fsm_crawl.py).

Importing this module installs it into ``interegular.fsm``, whose operations call the
module-level name; every module here that uses interegular imports ``regex_text``, which
imports this one.
"""

from __future__ import annotations

from typing import Any, Callable

import interegular.fsm as _fsm

__all__ = ["crawl", "interegular_crawl"]

interegular_crawl = _fsm.crawl  # the library's own, kept for the equality test


def _key(state: Any) -> Any:
    # interegular's product states are dicts (``parallel``), sets (``star``'s first state) or
    # frozensets / ints (the rest); a set equals the frozenset of its members, as keyed here
    if isinstance(state, dict):
        return ("d", frozenset(state.items()))
    if isinstance(state, set):
        return frozenset(state)
    return state


def crawl(alphabet: Any, initial: Any, final: Callable[[Any], bool], follow: Callable[[Any, Any], Any]) -> Any:
    """The FSM reached from ``initial`` by ``follow`` over ``alphabet``'s transitions; states
    numbered in the order they are found (as ``interegular.fsm.crawl`` numbers them)."""
    states = [initial]
    number = {_key(initial): 0}
    finals = set()
    transitions: dict[int, dict[Any, int]] = {}
    by_transition = list(alphabet.by_transition)
    i = 0
    while i < len(states):
        state = states[i]
        if final(state):
            finals.add(i)
        row: dict[Any, int] = {}
        for transition in by_transition:
            try:
                nxt = follow(state, transition)
            except _fsm.OblivionError:
                continue
            k = _key(nxt)
            j = number.get(k)
            if j is None:
                j = number[k] = len(states)
                states.append(nxt)
            row[transition] = j
        transitions[i] = row
        i += 1
    return _fsm.FSM(alphabet=alphabet, states=range(len(states)), initial=0, finals=finals, map=transitions,
                    __no_validation__=True)


_fsm.crawl = crawl

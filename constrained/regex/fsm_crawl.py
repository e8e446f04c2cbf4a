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

``limit(states, seconds)`` bounds every crawl made inside it: one that finds more states, or
runs past the deadline, raises ``TooLarge`` (as does an alphabet union past the deadline). A nested counted repetition
(``^https://([.\\-_a-zA-Z0-9]+/?){3,1016}$``, CloudFormation's SageMaker URLs) makes an
automaton interegular spends minutes on; under a limit the caller learns that in a fraction
of a second and writes a narrower subset instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Any, Callable, Iterator

import interegular.fsm as _fsm

__all__ = ["TooLarge", "crawl", "interegular_crawl", "limit"]


class TooLarge(BaseException):
    """A crawl under ``limit`` found more states than it allows or ran past its deadline
    (``late``). A BaseException, so that code catching interegular's many ``Exception``s (and
    turning them into a verdict on the pattern, perhaps remembered) lets it through to the
    caller that set the limit."""

    def __init__(self, message: str, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


# (most states of one crawl, deadline by time.perf_counter()) of the innermost limit, or None
_BOUND: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("fsm_crawl_bound", default=None)


@contextlib.contextmanager
def limit(states: int | None = None, seconds: float | None = None) -> Iterator[None]:
    """Every crawl inside raises ``TooLarge`` past ``states`` states (each crawl counted on
    its own) or ``seconds`` from now; inside another limit, the tighter of each bound holds."""
    outer = _BOUND.get() or (float("inf"), float("inf"))
    most = outer[0] if states is None else min(outer[0], states)
    deadline = outer[1] if seconds is None else min(outer[1], time.perf_counter() + seconds)
    token = _BOUND.set((most, deadline))
    try:
        yield
    finally:
        _BOUND.reset(token)

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
    numbered in the order they are found (as ``interegular.fsm.crawl`` numbers them); under
    ``limit``, ``TooLarge`` past its bounds."""
    most, deadline = _BOUND.get() or (float("inf"), float("inf"))
    states = [initial]
    number = {_key(initial): 0}
    finals = set()
    transitions: dict[int, dict[Any, int]] = {}
    by_transition = list(alphabet.by_transition)
    i = 0
    while i < len(states):
        state = states[i]
        if len(states) > most:
            raise TooLarge(f"an automaton past {most} states")
        if not i & 63 and time.perf_counter() > deadline:
            raise TooLarge("an automaton's build past its deadline", late=True)
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


def _union(*alphabets: Any) -> Any:
    """``Alphabet.union``, which every FSM operation calls first, stopped under ``limit`` past
    its deadline: alphabets of classes listing wide ranges (``[^\\x00-\\x20\\x7f-\\uffff]``)
    hold a symbol per character, and a union of them takes a tenth of a second."""
    bound = _BOUND.get()
    if bound is not None and time.perf_counter() > bound[1]:
        raise TooLarge("an alphabet union past its deadline", late=True)
    return _library_union(*alphabets)


_library_union = _fsm.Alphabet.union
_fsm.crawl = crawl
_fsm.Alphabet.union = _union

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

``limit(states, steps)`` bounds every crawl made inside it: one that finds more states, or
takes the work of all crawls (and alphabet unions) inside past ``steps``, raises ``TooLarge``.
A nested counted repetition (``^https://([.\\-_a-zA-Z0-9]+/?){3,1016}$``, CloudFormation's
SageMaker URLs) makes an automaton interegular spends minutes on; under a limit the caller
learns that in a fraction of a second and writes a narrower subset instead.

The budget is counted in work, never in time: a step is one transition followed from one
state (``follow``), weighted by the size of the product state it reads (a product of three
FSMs costs about three times one), and an alphabet union costs one and a half steps per
symbol it maps (measured: about 2.5 million crawl steps and 1.7 million union symbols a
second of CPU on the 2-core development box). So a pattern's verdict (built, or too large
and narrowed) is a function of the pattern only: the same on a quiet machine and a loaded
one, and a refusal remembered by a cache is one any machine would give. ``spent()`` tells
the work done so far under the innermost limit.

A function remembered by ``memo`` charges what computing its result cost (the steps, and its
largest crawl against the states bound) at its first call in each outermost limit (a
translation), as if the memory were empty when that limit began: a verdict does not depend
on what the process happened to compute before either.

(``limit(seconds=...)`` remains for callers that want a wall-clock bound, tests of it; no
translation uses one.)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
import weakref
from typing import Any, Callable, Iterator

import interegular.fsm as _fsm

__all__ = ["TooLarge", "crawl", "interegular_crawl", "limit", "memo", "spent"]


class TooLarge(BaseException):
    """A crawl under ``limit`` found more states than it allows, or the work inside the limit
    passed its steps (``work``). A BaseException, so that code catching interegular's many
    ``Exception``s (and turning them into a verdict on the pattern, perhaps remembered) lets it
    through to the caller that set the limit."""

    def __init__(self, message: str, work: bool = False) -> None:
        super().__init__(message)
        self.work = work


class _Spent(BaseException):
    """A ``TooLarge`` of work on its way out to the outermost limit whose budget is spent
    (not a ``TooLarge``, so that the handlers of the limits inside let it through)."""


class _Epoch:
    """The identity of an outermost limit (shared by the limits inside it)."""

    __slots__ = ("__weakref__",)


class _Bound:
    """The innermost limit: the most states of one crawl, the step count past which work
    stops, and the counter of steps (one per thread of limits, shared by nested limits so that
    an inner crawl's work counts against every limit around it)."""

    __slots__ = ("most", "end", "counter", "start", "deadline", "peaks", "epoch")

    def __init__(self, most: float, end: float, counter: list[int], deadline: float,
                 peaks: tuple[list[int], ...], epoch: _Epoch) -> None:
        self.most, self.end, self.counter, self.start = most, end, counter, counter[0]
        self.epoch = epoch  # the outermost limit's (what a memo charged in: memo)
        self.deadline = deadline  # by time.perf_counter(), where a caller asked for one
        self.peaks = peaks  # cells of the memos measuring inside: the most states of a crawl

    def spent(self) -> bool:
        return self.counter[0] > self.end or self.deadline != _NEVER and time.perf_counter() > self.deadline


_NEVER = float("inf")
# whether a ``memo``'s function ran on this call (a cell per call, per thread)
_RAN: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("fsm_crawl_ran", default=[False])
_BOUND: contextvars.ContextVar[_Bound | None] = contextvars.ContextVar("fsm_crawl_bound", default=None)


@contextlib.contextmanager
def limit(states: int | None = None, steps: int | None = None, seconds: float | None = None,
          _peak: list[int] | None = None) -> Iterator[None]:
    """Every crawl inside raises ``TooLarge`` past ``states`` states (each crawl counted on its
    own) or once the work of every crawl and alphabet union inside passes ``steps`` (or, where
    given, ``seconds`` from now pass); inside another limit, the tighter of each bound holds."""
    outer = _BOUND.get()
    counter = outer.counter if outer is not None else [0]
    most = outer.most if outer is not None else _NEVER
    end = outer.end if outer is not None else _NEVER
    deadline = outer.deadline if outer is not None else _NEVER
    if states is not None:
        most = min(most, states)
    if steps is not None:
        end = min(end, counter[0] + steps)
    if seconds is not None:
        deadline = min(deadline, time.perf_counter() + seconds)
    peaks = outer.peaks if outer is not None else ()
    if _peak is not None:
        peaks = (*peaks, _peak)
    epoch = outer.epoch if outer is not None else _Epoch()
    token = _BOUND.set(_Bound(most, end, counter, deadline, peaks, epoch))
    try:
        yield
    except (TooLarge, _Spent) as exc:
        if isinstance(exc, TooLarge) and not exc.work:
            raise
        if outer is not None and outer.spent():
            # an enclosing limit's budget is spent too: the work stops up to that limit, past
            # every handler of this one's (which would try a narrower pattern, on no budget)
            raise _Spent(str(exc)) from None
        if isinstance(exc, _Spent):
            raise TooLarge(str(exc), work=True) from None
        raise
    finally:
        _BOUND.reset(token)


def spent() -> int:
    """The steps of work done so far inside the innermost ``limit`` (0 outside any)."""
    bound = _BOUND.get()
    return 0 if bound is None else bound.counter[0] - bound.start


def _charge(steps: int, peak: int) -> None:
    """Count ``steps`` of work and a crawl of ``peak`` states against the innermost limit, as
    doing that work again would (``TooLarge`` past its bounds)."""
    bound = _BOUND.get()
    if bound is None:
        return
    for cell in bound.peaks:
        cell[0] = max(cell[0], peak)
    if peak > bound.most:
        raise TooLarge(f"an automaton past {bound.most} states")
    bound.counter[0] += steps
    if bound.counter[0] > bound.end:
        raise TooLarge("automata past their steps of work", work=True)


def memo(maxsize: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``functools.lru_cache(maxsize)`` for a function whose work is crawls: the first call
    with given arguments in each outermost limit is charged what computing the result cost
    (``_charge``), the later ones are free, so a remembered result is had under a limit
    exactly where it would have been with a memory emptied at that limit's start (not where
    an earlier translation happened to compute it). A call that raises is not remembered
    (``TooLarge`` among them)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.lru_cache(maxsize)
        def measured(*args: Any) -> tuple[Any, int, int, weakref.WeakSet]:
            _RAN.get()[0] = True
            peak = [0]
            with limit(_peak=peak):
                bound = _BOUND.get()
                before = bound.counter[0]
                out = fn(*args)
                steps = bound.counter[0] - before
            return out, steps, peak[0], weakref.WeakSet([bound.epoch])  # (counted as it ran)

        @functools.wraps(fn)
        def charged(*args: Any) -> Any:
            ran = [False]
            token = _RAN.set(ran)
            try:
                out, steps, peak, epochs = measured(*args)
            finally:
                _RAN.reset(token)
            bound = _BOUND.get()
            if not ran[0] and bound is not None and bound.epoch not in epochs:
                _charge(steps, peak)  # remembered from elsewhere: charged, once in this limit
                epochs.add(bound.epoch)
            return out

        charged.cache_clear = measured.cache_clear  # type: ignore[attr-defined]
        charged.cache_info = measured.cache_info  # type: ignore[attr-defined]
        return charged
    return wrap


def _size(state: Any) -> int:
    # the parts of a product state that ``follow`` reads: a dict's or a set's members
    return len(state) if isinstance(state, (dict, set, frozenset)) else 1


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
    bound = _BOUND.get()
    most, end, counter = (bound.most, bound.end, bound.counter) if bound is not None else (_NEVER, 0, None)
    timed = bound is not None and bound.deadline != _NEVER
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
        if counter is not None:
            counter[0] += len(by_transition) * max(1, _size(state))
            if counter[0] > end:
                raise TooLarge("automata past their steps of work", work=True)
            if timed and not i & 63 and time.perf_counter() > bound.deadline:
                raise TooLarge("an automaton's build past its deadline", work=True)
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
    if bound is not None:
        for peak in bound.peaks:
            peak[0] = max(peak[0], len(states))
    return _fsm.FSM(alphabet=alphabet, states=range(len(states)), initial=0, finals=finals, map=transitions,
                    __no_validation__=True)


def _union(*alphabets: Any) -> Any:
    """``Alphabet.union``, which every FSM operation calls first, counted under ``limit``: a
    step per symbol of each alphabet (those of classes listing wide ranges,
    ``[^\\x00-\\x20\\x7f-\\uffff]``, hold a symbol per character, and a union of them takes a
    tenth of a second); past the limit's steps, ``TooLarge`` before the union is made."""
    bound = _BOUND.get()
    if bound is not None:
        bound.counter[0] += 3 * sum(len(a._symbol_mapping) for a in alphabets) // 2
        if bound.spent():
            raise TooLarge("automata past their steps of work (an alphabet union)", work=True)
    return _library_union(*alphabets)


_library_union = _fsm.Alphabet.union
_fsm.crawl = crawl
_fsm.Alphabet.union = _union

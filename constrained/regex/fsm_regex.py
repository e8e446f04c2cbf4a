"""A character FSM back to a regex (state elimination), for sets a regex cannot write directly.

JSON schema keys are sometimes sets like "contains a match of p but of no other pattern" or
"any key but these names": interegular builds their FSMs by intersection and difference
(``&``, ``-``), and ``fsm_to_regex`` writes one back as a regex the token index can take.
Dead states are dropped first, and states are eliminated fewest-paths-through first, which
keeps the regexes of the small key FSMs here small; ``limit`` bounds the result.

Importing this module does not import torch.
"""

from __future__ import annotations

import heapq
from typing import Any

from interegular.fsm import anything_else

from treadle.constrained.regex.regex_text import class_literal

__all__ = ["forced_prefix", "fsm_to_regex", "length_range"]


def fsm_to_regex(fsm: Any, limit: int = 20_000) -> str | None:
    """A regex matching exactly the strings ``fsm`` accepts; None when it accepts none.
    Raises ``ValueError`` when the regex would be longer than ``limit`` characters."""
    live = _live_states(fsm)
    if fsm.initial not in live:
        return None
    classes = _edge_classes(fsm)
    # the states numbered in an order of the automaton's own (breadth first from the start,
    # edges by their least character), not interegular's, which follows the hash order of
    # its alphabet: the elimination order, so the regex and whether it fits ``limit``, are
    # then the same in every process (a format under a minLength was a 400 in some runs only)
    by_symbol = fsm.alphabet.by_transition

    def symbol_key(symbol: Any) -> tuple:
        chars = [c for c in by_symbol[symbol] if c is not anything_else]
        return (not chars, min(chars) if chars else "")

    rank, order = {fsm.initial: 0}, [fsm.initial]
    for p in order:  # (grows as it goes: a breadth-first walk)
        for symbol in sorted(fsm.map.get(p, {}), key=symbol_key):
            q = fsm.map[p][symbol]
            if q in live and q not in rank:
                rank[q] = len(rank)
                order.append(q)
    start, end = object(), object()
    edges: dict[Any, dict[Any, str]] = {q: {} for q in (start, *range(len(order)))}
    edges[start][0] = ""
    for p in order:
        by_target: dict[Any, list] = {}
        for symbol in sorted(fsm.map.get(p, {}), key=symbol_key):
            q = fsm.map[p][symbol]
            if q in live:
                by_target.setdefault(rank[q], []).append(symbol)
        for q, symbols in by_target.items():
            edges[rank[p]][q] = classes(symbols)
        if p in fsm.finals:
            edges[rank[p]][end] = _alt(edges[rank[p]].get(end), "")
    live = set(range(len(order)))
    # state elimination, fewest paths through first (ties by the order above): each state's
    # predecessors are kept up to date and the choice comes from a heap, so each elimination
    # costs its own edges (a key set of ~1,000 names was cubic: 13 s)
    preds: dict[Any, set] = {q: set() for q in live}
    for p, row in edges.items():
        for q in row:
            if q is not end and q != p:
                preds[q].add(p)

    def key(s: Any) -> tuple:
        return (len(preds[s]) * (len(edges[s]) - (s in edges[s])), s)

    pending = set(live)
    heap = [(key(q), n, q) for n, q in enumerate(live)]
    heapq.heapify(heap)
    tick = len(heap)
    while pending:
        k, _, q = heapq.heappop(heap)
        if q not in pending or k != key(q):
            continue  # a stale entry: q is gone, or its count changed (a newer entry holds it)
        pending.discard(q)
        loop = edges[q].pop(q, None)
        star = f"(?:{loop})*" if loop else ""
        outs = list(edges.pop(q).items())
        into = preds.pop(q)
        for r, _ in outs:
            if r is not end:
                preds[r].discard(q)
        for p in into:
            a = edges[p].pop(q)
            for r, b in outs:
                if r is not end and r != p:
                    preds[r].add(p)
                # a label is a class, "", a group or a concatenation of them: never a top-level
                # alternation, so it concatenates as it is
                edges[p][r] = _alt(edges[p].get(r), a + star + b)
                if len(edges[p][r]) > limit:
                    raise ValueError(f"its automaton written back as a regex would exceed {limit} characters")
        for s in {*into, *(r for r, _ in outs)}:
            if s in pending:
                heapq.heappush(heap, (key(s), tick, s))
                tick += 1
    out = edges[start].get(end)
    depth = _nesting(out or "")
    if depth > MAX_NESTING:
        raise ValueError(f"its automaton written back as a regex would nest {depth} groups deep")
    return out


# groups inside groups: the recursive parsers that read a written regex next (interegular's
# stops near 150 levels) are kept well inside their depth
MAX_NESTING = 100


def _nesting(regex: str) -> int:
    """The deepest nesting of groups in ``regex`` as written here (classes escape ']')."""
    depth = top = i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            while regex[i] != "]":
                i += 2 if regex[i] == "\\" else 1
        elif c == "(":
            depth += 1
            top = max(top, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return top


def length_range(fsm: Any) -> tuple[int, int | None] | None:
    """The fewest and the most characters of a string ``fsm`` accepts (None for the most when
    a loop makes them unbounded); None when it accepts nothing."""
    live = _live_states(fsm)
    if fsm.initial not in live:
        return None
    succ = {p: [q for q in fsm.map.get(p, {}).values() if q in live] for p in live}
    indeg = dict.fromkeys(live, 0)
    for p in live:
        for q in succ[p]:
            indeg[q] += 1
    # Kahn's order from the start: every live state is reachable from it, so a state left
    # unordered lies on a loop
    order, todo = [], [p for p in live if indeg[p] == 0]
    while todo:
        p = todo.pop()
        order.append(p)
        for q in succ[p]:
            indeg[q] -= 1
            if indeg[q] == 0:
                todo.append(q)
    shortest = {fsm.initial: 0}
    frontier = [fsm.initial]
    while frontier:  # breadth first
        nxt = []
        for p in frontier:
            for q in succ[p]:
                if q not in shortest:
                    shortest[q] = shortest[p] + 1
                    nxt.append(q)
        frontier = nxt
    low = min(shortest[q] for q in live & set(fsm.finals))
    if len(order) < len(live):
        return low, None
    longest = dict.fromkeys(live, -1)
    longest[fsm.initial] = 0
    for p in order:
        for q in succ[p]:
            longest[q] = max(longest[q], longest[p] + 1)
    return low, max(longest[q] for q in live & set(fsm.finals))


def _live_states(fsm: Any) -> set:
    """States reachable from the start that can still reach a final state."""
    reach, todo = {fsm.initial}, [fsm.initial]
    while todo:
        for q in fsm.map.get(todo.pop(), {}).values():
            if q not in reach:
                reach.add(q)
                todo.append(q)
    back: dict[Any, set] = {}
    for p, row in fsm.map.items():
        for q in row.values():
            back.setdefault(q, set()).add(p)
    alive, todo = set(fsm.finals) & reach, list(set(fsm.finals) & reach)
    while todo:
        for p in back.get(todo.pop(), ()):
            if p in reach and p not in alive:
                alive.add(p)
                todo.append(p)
    return alive


def _edge_classes(fsm: Any):
    """symbols -> one character class: the characters they stand for, or, with the
    'anything else' symbol among them, every character but those of the other symbols."""
    by_symbol = fsm.alphabet.by_transition
    named = {ch for chars in by_symbol.values() for ch in chars if ch is not anything_else}

    cache: dict[frozenset, str] = {}  # the same few symbol sets label most edges

    def render(symbols: list) -> str:
        key = frozenset(symbols)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = _render(key)
        return hit

    def _render(symbols: frozenset) -> str:
        chars = {ch for s in symbols for ch in by_symbol[s]}
        if anything_else in chars:
            others = sorted(named - chars)
            if not others:  # (every character: what a regex's '(?s).' is written as)
                return "(?:[^\\n]|\\n)"
            return "[^" + _ranges(others) + "]"
        return "[" + _ranges(sorted(chars)) + "]"

    return render


def _ranges(ordered: list[str]) -> str:
    """Sorted characters as a class body, runs of 4 or more consecutive code points as
    ranges (a class over most of the BMP stays short)."""
    out, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ord(ordered[j + 1]) == ord(ordered[j]) + 1:
            j += 1
        if j - i >= 3:
            out.append(class_literal(ordered[i]) + "-" + class_literal(ordered[j]))
        else:
            out.extend(class_literal(c) for c in ordered[i:j + 1])
        i = j + 1
    return "".join(out)


def _alt(a: str | None, b: str) -> str:
    if a is None:
        return b
    if a == b:
        return a
    if a == "":
        return f"(?:{b})?"
    if b == "":
        return f"(?:{a})?"
    return f"(?:{a}|{b})"


def peeled_fsm_to_regex(fsm: Any, limit: int = 20_000) -> str | None:
    """``fsm_to_regex`` with the chain of states every string starts through written first:
    from the start, while a state is not final and all its live edges lead to one other state,
    that edge's class, then the regex of the rest. State elimination copies such a prefix into
    each branch the rest splits into (a URN pattern's "urn:cdx:<uuid>/" under a URI format:
    7 times, a regex of 7,000 chars for one of 600), which a schema using it often multiplies."""
    live = _live_states(fsm)
    if fsm.initial not in live:
        return None
    classes = _edge_classes(fsm)
    prefix, q, seen = [], fsm.initial, {fsm.initial}
    while q not in fsm.finals:
        row = {s: t for s, t in fsm.map.get(q, {}).items() if t in live}
        targets = set(row.values())
        if len(targets) != 1:
            break
        (t,) = targets
        if t in seen:
            break
        prefix.append(classes(sorted(row, key=repr)))
        seen.add(t)
        q = t
    if not prefix:
        return fsm_to_regex(fsm, limit)
    rest = type(fsm)(alphabet=fsm.alphabet, states=fsm.states, initial=q, finals=fsm.finals, map=fsm.map)
    tail = fsm_to_regex(rest, limit)
    return None if tail is None else "".join(prefix) + (tail if tail == "" or tail.startswith("(?:") and _one_group(tail)
                                                        else f"(?:{tail})")


def _one_group(regex: str) -> bool:
    """Whether ``regex`` is a single group "(?:...)" (its first "(" closes at the end)."""
    depth, i = 0, 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            while regex[i] != "]":
                i += 2 if regex[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i == len(regex) - 1
        i += 1
    return False


def forced_prefix(fsm: Any, limit: int = 64) -> str:
    """The text every string ``fsm`` accepts starts with: from its start, the characters read
    while a state has one way on, by one character, and is not final (up to ``limit``). On
    ``fsm.reversed()``, reversed, the text they all end with (``\\.com$``: ".com")."""
    chars_of: dict = {}
    for ch, key in fsm.alphabet.items():
        chars_of.setdefault(key, []).append(ch)
    state, read = fsm.initial, ""
    while len(read) < limit and state not in fsm.finals:
        edges = fsm.map.get(state, {})
        if len(edges) != 1:
            break
        (key, state), = edges.items()
        chars = chars_of.get(key, [])
        if len(chars) != 1 or chars[0] is anything_else:
            break
        read += chars[0]
    return read

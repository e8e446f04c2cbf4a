"""Free text: a regex of every string that holds none of a set of strings.

A structural tag's free text must not hold a trigger (a trigger opens a tagged segment), nor
the end of the tag around it; a reasoning block must not hold ``</think>`` before it ends.
``trigger_free_regex`` builds that regex from the Aho-Corasick automaton of the strings,
whose states it eliminates one by one into regex edges.

Importing this module does not import torch.
"""

from __future__ import annotations

from treadle.constrained.regex.regex_text import class_literal, escape_literal

__all__ = ["group", "trigger_free_regex"]


def group(r: str) -> str:
    """``r`` as one atom, for a quantifier or a concatenation."""
    if len(r) == 1 or (len(r) == 2 and r[0] == "\\"):
        return r
    return f"(?:{r})"


def _union(a: str | None, b: str | None) -> str | None:
    """Either regex (None: no edge; "": the empty string)."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    if a == "" or b == "":
        return f"{group(a or b)}?"
    return f"(?:{a}|{b})"


def _concat(*parts: str) -> str:
    return "".join(parts)  # no part has a top-level "|": unions are grouped


def _automaton(triggers: tuple[str, ...]) -> tuple[list[dict[str, int]], list[bool], list[str]]:
    """The Aho-Corasick automaton of ``triggers`` over their characters: (each state's
    transition on each of them; dead: a trigger has just ended; the alphabet). Any other
    character goes back to state 0."""
    goto: list[dict[str, int]] = [{}]
    dead = [False]
    for t in triggers:
        s = 0
        for ch in t:
            if ch not in goto[s]:
                goto[s][ch] = len(goto)
                goto.append({})
                dead.append(False)
            s = goto[s][ch]
        dead[s] = True
    alphabet = sorted({ch for t in triggers for ch in t})
    delta: list[dict[str, int]] = [{} for _ in goto]
    fail = [0] * len(goto)
    queue = [0]
    for s in queue:  # breadth first: a state's failure link is settled before it
        for ch in alphabet:
            if ch in goto[s]:
                nxt = goto[s][ch]
                fail[nxt] = delta[fail[s]][ch] if s else 0
                dead[nxt] = dead[nxt] or dead[fail[nxt]]
                delta[s][ch] = nxt
                queue.append(nxt)
            else:
                delta[s][ch] = delta[fail[s]][ch] if s else 0
    return delta, dead, alphabet


def trigger_free_regex(triggers: tuple[str, ...] | list[str], hide: str = "") -> str:
    """A regex of every string that holds none of ``triggers``. ``hide`` (a character-class
    body, such as the placeholders' range) is left out of it too. Built by eliminating the
    states of the triggers' automaton (all of them accepting, but the dead ones), deepest
    first, from a graph whose edges are labelled with regexes."""
    triggers = tuple(triggers)
    if not triggers or not all(triggers):
        raise ValueError("trigger_free_regex needs non-empty triggers")
    delta, dead, alphabet = _automaton(triggers)
    depth = {0: 0}  # the live states reachable from 0 (a trigger's extension is not), by distance
    live = [0]
    for s in live:
        for t in delta[s].values():
            if not dead[t] and t not in depth:
                depth[t] = depth[s] + 1
                live.append(t)
    final = -1
    edges: dict[int, dict[int, str | None]] = {s: {} for s in live}
    for s in live:
        by_target: dict[int, list[str]] = {}
        away = []  # the alphabet's characters that do not go back to 0 from s
        for ch in alphabet:
            t = delta[s][ch]
            if t != 0:
                away.append(ch)
                if t in depth:
                    by_target.setdefault(t, []).append(ch)
        for t, chars in by_target.items():
            edges[s][t] = escape_literal(chars[0]) if len(chars) == 1 else \
                "[" + "".join(class_literal(c) for c in chars) + "]"
        edges[s][0] = "[^" + "".join(class_literal(c) for c in away) + hide + "]"
        edges[s][final] = ""
    for k in sorted((s for s in live if s), key=lambda s: -depth[s]):
        loop = edges[k].pop(k, None)
        star = "" if loop is None else f"{group(loop)}*"
        outs = edges.pop(k)
        for i in edges:
            into = edges[i].pop(k, None)
            if into is None:
                continue
            for j, out in outs.items():
                edges[i][j] = _union(edges[i].get(j), _concat(into, star, out))
    loop = edges[0].get(0)
    rest = edges[0].get(final)
    head = "" if loop is None else f"{group(loop)}*"
    return _concat(head, rest or "") if rest is not None else head

"""How large a grammar's token index would be, estimated before it is built.

The token index (outlines-core) has a state per position of the regex's automaton, and each
state lists the tokens that can leave it: a literal character lets a few tokens through, a
wide character class thousands. Build time and memory grow with that product, so the
estimate is a weighted count of positions: a literal character counts 1, a character class
(or an escape such as ``\\w``, or ``.``) its width up to ``WIDE``, a group the sum of its
alternatives, and a bounded repetition ``{m,n}`` its body ``n`` times (``*``, ``+``, ``?`` loop
or skip, adding no position). Measured on SmolLM2's vocabulary: ``[a-z]{0,1000}`` (26,000)
builds in ~4 s and ~70 MB; 4,000 alternatives ``zz<i>[a-z]{0,5}`` (~543,000) take about a
minute. It reads the regex once with one C-level tokenizing pass, so a 100k-character regex is
judged in milliseconds, before any parsing or building.

A JSON schema is judged twice: before its translation, by the optional properties of each
object, and after it, by its regex. Spelt out, strict mode writes an object of N optional
properties as ~N^2 pieces (a schema of thousands of them would take minutes and gigabytes only
to be translated); the compile path writes a long sequence as an ordered-members node instead
(members.py), whose automaton builds each property once: N. An ordered-members node in a
regex counts its entries once and its separator once per entry.
"""
from __future__ import annotations

import re
from typing import Any

from treadle.constrained.index.index_markers import (MEMBER_OPTIONAL, MEMBER_REQUIRED, MEMBERS_CLOSE, MEMBERS_OPEN,
                                               MEMBERS_OPEN_NONEMPTY)

__all__ = ["WIDE", "regex_size", "schema_size"]

WIDE = 100  # the weight of a class as wide as most of the vocabulary's first bytes
_ESCAPES = {"d": 10, "D": WIDE, "w": 63, "W": WIDE, "s": 4, "S": WIDE}
_TOKEN = re.compile(
    r"\\[pP]\{[^}]*\}|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|\\U[0-9a-fA-F]{8}|\\."  # escapes
    r"|\[\^?\]?(?:\\.|[^\]\\])*\]"  # a class
    r"|\{\d+(?:,\d*)?\}"  # a counted repetition
    r"|\((?:\?(?:[:=!]|<[=!]|P?<\w+>))?"  # a group's start
    r"|[)|*+?.]"
    rf"|[{MEMBERS_OPEN}{MEMBERS_OPEN_NONEMPTY}{MEMBER_REQUIRED}{MEMBER_OPTIONAL}{MEMBERS_CLOSE}]"  # ordered members
    rf"|[^\\\[\](){{}}|*+?.{MEMBERS_OPEN}-{MEMBERS_CLOSE}]+",  # a run of literal characters
    re.S)


_MEMBERS = frozenset((MEMBERS_OPEN, MEMBERS_OPEN_NONEMPTY, MEMBER_REQUIRED, MEMBER_OPTIONAL, MEMBERS_CLOSE))


def _class_width(text: str) -> int:
    body = text[1:-1]
    if body.startswith("^"):
        return WIDE
    n, i = 0, 0
    while i < len(body) and n < WIDE:
        if body[i] == "\\" and i + 1 < len(body):
            n += _ESCAPES.get(body[i + 1], 1)
            i += 2
        elif i + 2 < len(body) and body[i + 1] == "-":
            n += max(ord(body[i + 2]) - ord(body[i]) + 1, 1)
            i += 3
        else:
            n += 1
            i += 1
    return min(n, WIDE)


def regex_size(regex: str) -> int:
    """The weighted position count of ``regex`` (see the module docstring). Never raises: text
    that is not a valid regex gets some estimate, and the regex's own check rejects it later."""
    stack: list[tuple[int, int]] = []
    members: list[list[int]] = []  # the ordered-members nodes open (members.py)
    alts = cur = last = 0  # this group's finished alternatives, the current one, its last atom
    for m in _TOKEN.finditer(regex):
        t = m.group()
        c = t[0]
        if c in _MEMBERS:  # a group whose parts add up like alternatives, the separator per entry
            if c in (MEMBERS_OPEN, MEMBERS_OPEN_NONEMPTY):
                stack.append((alts, cur))
                members.append([0, 0])  # [its separator's size, entries so far]
                alts = cur = last = 0
            elif c == MEMBERS_CLOSE and members:
                sep, n = members.pop()
                size = alts + cur + sep * max(n - 1, 0)
                if stack:
                    alts, cur = stack.pop()
                cur += size
                last = size
            else:  # an entry begins: what came before it was the separator or an entry
                if members and members[-1][1] == 0:
                    members[-1][0] = alts + cur
                    alts = cur = last = 0
                else:
                    alts += cur
                    cur = last = 0
                if members:
                    members[-1][1] += 1
            continue
        if c == "(":
            stack.append((alts, cur))
            alts = cur = last = 0
        elif c == ")":
            size = alts + cur
            if stack:
                alts, cur = stack.pop()
            cur += size
            last = size
        elif c == "|":
            alts += cur
            cur = last = 0
        elif c in "*+?":
            continue
        elif c == "{":
            lo, _, hi = t[1:-1].partition(",")
            times = int(hi) if hi else max(int(lo), 1)
            cur += last * (times - 1)
            last *= times
        elif c == "[":
            last = _class_width(t)
            cur += last
        elif c == "\\":
            last = _ESCAPES.get(t[1], 1) if len(t) == 2 else 1
            cur += last
        elif c == ".":
            last = WIDE
            cur += last
        else:
            cur += len(t)
            last = 1
    while stack:
        size = alts + cur
        alts, cur = stack.pop()
        cur += size
    return alts + cur


def schema_size(schema: Any, members: bool = False) -> tuple[int, str]:
    """(the largest number of optional properties of one object, squared, or as it is with
    ``members`` (its translation may write ordered-members nodes); the JSON path of that
    object) over every object ``schema`` declares. Iterative (a deep schema cannot overflow the
    stack); a node's keys are read only where they are mappings."""
    worst, where = 0, "$"
    todo: list[tuple[Any, str]] = [(schema, "$")]
    while todo:
        node, path = todo.pop()
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                req = node.get("required")
                required = set(req) if isinstance(req, list) and all(isinstance(r, str) for r in req) else set()
                n = sum(1 for k in props if k not in required)
                size = n if members else n * n
                if size > worst:
                    worst, where = size, path
            todo.extend((v, f"{path}.{k}") for k, v in node.items() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(node) if isinstance(v, (dict, list)))
    return worst, where

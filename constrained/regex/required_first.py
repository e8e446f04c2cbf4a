"""The password rule: ``^(?=.*[A-Z])(?=.*[a-z])(?=.*\\d)(?=.*[@$!%*?&])[A-Za-z\\d@$!%*?&]{8,16}$``,
written as a subset when its exact automaton is too large to write back as a regex.

Each lookahead asks for one character of a class somewhere; the string is a repetition of one
class. Exactly, that is an automaton of (which classes were seen) x (how long so far): 196
states here, whose regex by state elimination passes 1.6 million characters, so regex_ecma.py
refused it ("its automaton written back as a regex would exceed 20000 characters"), the most
common password pattern there is. ``needs_first`` writes the strings that begin with one
character of each asked class, in the pattern's order, followed by the repetition with its
counts lowered by as many: every one has a character of each class, only characters of the
repeated class (each asked class is written as its part inside it) and a length within the counts (a subset:
"Aa1!xyzw" is written, "xyzwAa1!" is not).

Importing this module does not import torch.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from treadle.constrained.regex.fsm_regex import fsm_to_regex

__all__ = ["needs_first"]

# one atom: an escape, a bracket class, '.' or a plain character
_ATOM = r"(?:\\.|\[(?:\\.|[^\]\\])*\]|[^\\()\[\]|*+?{}^$])"
# a lookahead asking for one atom anywhere after some characters: (?=.*X), (?=.*?X)
_NEED = re.compile(r"\(\?=\.\*\??(" + _ATOM + r")\)")
_REST = re.compile(r"(" + _ATOM + r")(?:\{(\d+)(?:(,)(\d*))?\}|([*+]))")


def needs_first(core: str, translate: Callable[[str], str], fsm_of: Callable[[str], Any]) -> str | None:
    """``core`` (a pattern branch anchored at both ends, its anchors taken off) as the subset
    above, in the dialect ``translate`` writes (regex_ecma's reading of a part of a pattern);
    None where ``core`` is not one or more ``(?=.*X)`` then ``Y{m,n}`` / ``Y+`` / ``Y*`` (``X``,
    ``Y`` single atoms), an ``X`` shares no character with ``Y`` (each is written as its part
    inside ``Y``), or the counts leave no room.
    ``fsm_of`` builds the automaton of a translated atom (to compare their character sets)."""
    needs, at = [], 0
    while (m := _NEED.match(core, at)) is not None:
        needs.append(m.group(1))
        at = m.end()
    rest = _REST.fullmatch(core, at)
    if not needs or rest is None:
        return None
    if rest.group(5):
        least, most = (0 if rest.group(5) == "*" else 1), None
    else:
        least = int(rest.group(2))
        most = least if rest.group(3) is None else (int(rest.group(4)) if rest.group(4) else None)
    if most is not None and (most < len(needs) or most < least):
        return None
    body = translate(rest.group(1))
    allowed = fsm_of(body)
    written = []
    for need in needs:
        x = translate(need)
        if not (fsm_of(x) - allowed).empty():  # (a class reaching past the repeated one: its part inside)
            x = fsm_to_regex(fsm_of(x) & allowed)
        if x is None or fsm_of(x).empty():
            return None
        written.append(x)
    low = max(0, least - len(needs))
    high = "" if most is None else str(most - len(needs))
    return "".join(f"(?:{x})" for x in written) + f"(?:{body}){{{low},{high}}}"

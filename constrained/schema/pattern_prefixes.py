"""Two string patterns that no string matches both: their anchored literal prefixes differ.

A oneOf of strings told apart by what they start with (cibuildwheel's build-frontend:
``^pip; ?args:``, ``^build; ?args:``, ``^build\\[uv\\]; ?args:``, ...) is exclusive: a string
starting with "pip;" starts with no "build;". json_schema_logic.Apart proved strings apart by
listed values, lengths and types only, so spec mode wrote each such branch where every other
one fails, one complement each (a string of another type, or one not matching the pattern):
2^5 combinations past its cap, and the oneOf was refused.

``literal_prefix`` reads the text a pattern's every match starts with: ``^`` then literal
characters (letters, digits, plain punctuation, escaped metacharacters), cut before a
quantifier, a class, a group or anything else; none for a pattern with a top-level ``|`` (its
``^`` holds for one alternative only). The same under Python's ``re`` and ECMA-262 (no flags:
``^`` is the start of the string). Prefixes of which neither starts the other prove the two
patterns apart over every string, whatever its JSON spelling (the prefix is of characters).

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

from treadle.constrained.regex.regex_text import top_level_cuts

__all__ = ["literal_prefix", "patterns_apart"]

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-;:,/@=!%&'\"<>~`#")
_ESCAPED = frozenset(".[](){}*+?|\\/^$-")
_QUANTIFIERS = frozenset("?*+{")


def _top_level_alternation(pattern: str) -> bool:
    """Whether `pattern` has a `|` outside every group and class (or an unbalanced `)`: not a
    pattern this proof reads)."""
    return top_level_cuts(pattern) != []


def literal_prefix(pattern: Any) -> str | None:
    """The characters every string ``pattern`` matches starts with; None when it is not
    anchored by ``^`` at the start, has a top-level ``|``, or is no string."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or _top_level_alternation(pattern):
        return None
    chars: list[str] = []
    i = 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and pattern[i + 1] in _ESCAPED:
            char, step = pattern[i + 1], 2
        elif c in _PLAIN:
            char, step = c, 1
        else:
            break
        if i + step < len(pattern) and pattern[i + step] in _QUANTIFIERS:
            break  # this character may be absent or repeated
        chars.append(char)
        i += step
    return "".join(chars)


def patterns_apart(a: Any, b: Any) -> bool:
    """Whether no string matches both patterns: their literal prefixes disagree."""
    pa, pb = literal_prefix(a), literal_prefix(b)
    if not pa or not pb:
        return False
    return not (pa.startswith(pb) or pb.startswith(pa))

"""How deeply a grammar given as text nests, measured without recursion, so that a request whose
json_schema, structural_tag, EBNF or regex nests past MAX_GRAMMAR_NESTING is a ValueError (a
400) where it is validated, never a RecursionError where it is compiled (100,000 brackets in a
string made one in the scheduler, failing the request with a 500).

The compilers recurse a few frames per level; 128 levels stay far from Python's 1,000-frame
limit, and far past what a real schema nests (a JSON schema level is two JSON levels:
`{"properties": {"a": {...}}}`)."""
from __future__ import annotations

import json
import re
from typing import Any

MAX_GRAMMAR_NESTING = 128

# the parts of a grammar text whose brackets are literal characters: a quoted string, a
# character class, or an escaped character
_EBNF_LITERALS = re.compile(r'"(?:\\.|[^"\\])*"' r"|'(?:\\.|[^'\\])*'" r"|\[(?:\\.|[^\]\\])*\]|\\.", re.S)
_REGEX_LITERALS = re.compile(r"\[\^?\]?(?:\\.|[^\]\\])*\]|\\.", re.S)


def bracket_depth(text: str, opening: str, closing: str) -> int:
    """The deepest nesting of `opening` / `closing` brackets in `text` (unbalanced closers
    count as nothing)."""
    import numpy as np  # a prompt-sized text: one vectorised pass, not a Python loop per character

    keep = re.sub(f"[^{re.escape(opening + closing)}]", "", text)
    if not keep:
        return 0
    b = np.frombuffer(keep.encode("ascii"), dtype=np.uint8)
    steps = np.where(np.isin(b, np.frombuffer(opening.encode("ascii"), dtype=np.uint8)), 1, -1)
    return max(0, int(np.cumsum(steps).max()))


def json_depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0), iteratively."""
    depth, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            depth = max(depth, d)
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return depth


def check_json_text(text: str, field: str, limit: int = MAX_GRAMMAR_NESTING) -> None:
    """ValueError naming `field` when the JSON text nests past `limit` (an unparsable text is
    left to the field's own check, which says why)."""
    # brackets inside JSON strings count here too: a cheap upper bound, exact where it matters
    if bracket_depth(text, "[{", "]}") <= limit:
        return
    try:
        depth = json_depth(json.loads(text))
    except RecursionError:
        depth = limit + 1
    except ValueError:
        return  # not JSON: the field's own check says so
    if depth > limit:
        raise ValueError(f"sampling_params.{field} nests more than {limit} levels deep; flatten it")


def check_grammar_text(text: str, field: str, literals: re.Pattern = _EBNF_LITERALS,
                       limit: int = MAX_GRAMMAR_NESTING) -> None:
    """ValueError naming `field` when the groups of an EBNF grammar (or, with
    `literals=REGEX_LITERALS`, a regex) nest past `limit`; brackets in quoted strings,
    character classes and escapes are literal characters and do not count."""
    if bracket_depth(text, "(", ")") <= limit:
        return
    if bracket_depth(literals.sub("", text), "(", ")") > limit:
        raise ValueError(f"sampling_params.{field}: its groups nest more than {limit} levels deep; flatten it")


REGEX_LITERALS = _REGEX_LITERALS

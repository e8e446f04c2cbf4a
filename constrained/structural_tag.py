"""Structural tags: free text in which tagged segments follow a JSON schema.

SGLang's and xgrammar's ``structural_tag`` response format, for tool calls inside a free
reply (``<function=get_weather>{"city": "Paris"}</function>``) and the like::

    {"structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}, ...],
     "triggers": ["<function="]}

The text is free until a trigger appears. From there it must go on as the ``begin`` of a
structure starting with that trigger, then a JSON value of that structure's ``schema``,
then its ``end``; after that the text is free again, and any number of segments may follow.
A trigger cannot appear in free text without opening a segment, so a segment the model
starts always parses and validates. Every begin must start with a trigger, and every
trigger must start some begin.

It compiles to one regex, so the token index, holes and calls, masks and jump-forward
(after a trigger, the rest of a single begin is forced text) all work as for a schema:

    F (?: (?: T1 (?: B11 S11 E11 | ...) | T2 (...) ) F )*

``F`` is the free text: every string holding no trigger, built from the Aho-Corasick
automaton of the triggers (``trigger_free_regex``). The structures' schemas are converted
together (``json_schemas_to_regexes``), so the recursive ``$ref``s of all of them are calls
of one list of definitions.

Importing this module does not import torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from treadle.constrained.json_holes import (
    ENTRY_AFTER,
    EXIT_AT,
    JSON_BOUNDS,
    PLACEHOLDER_RANGE,
    WRITTEN,
    Bounds,
    with_definitions,
)
from treadle.constrained.regex_text import class_literal, escape_literal

__all__ = ["StructuralTag", "Structure", "structural_tag_bounds", "structural_tag_to_regex", "trigger_free_regex"]

MAX_STRUCTURES = 64
MAX_TRIGGER_CHARS = 256  # all triggers together: the free-text regex grows with their automaton


@dataclass(frozen=True)
class Structure:
    begin: str
    schema: Any  # a JSON schema (dict or bool)
    end: str


@dataclass(frozen=True)
class StructuralTag:
    structures: tuple[Structure, ...]
    triggers: tuple[str, ...]

    @staticmethod
    def parse(value: Any) -> StructuralTag:
        """A structural tag from its dict or JSON text; ``ValueError`` naming the first problem.
        A ``"type": "structural_tag"`` member (the response_format's) is allowed."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"structural_tag is not valid JSON: {e}") from e
        if not isinstance(value, dict):
            raise ValueError(f"structural_tag must be an object, got {type(value).__name__}")
        extra = sorted(set(value) - {"type", "structures", "triggers"})
        if extra:
            raise ValueError(f"structural_tag: unknown field(s) {', '.join(extra)}; accepted: structures, triggers")
        if value.get("type", "structural_tag") != "structural_tag":
            raise ValueError(f"structural_tag.type must be 'structural_tag', got {value.get('type')!r}")
        triggers = value.get("triggers")
        if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise ValueError("structural_tag.triggers must be a non-empty list of non-empty strings")
        if sum(map(len, triggers)) > MAX_TRIGGER_CHARS:
            raise ValueError(f"structural_tag.triggers: at most {MAX_TRIGGER_CHARS} characters in all")
        raw = value.get("structures")
        if not isinstance(raw, list) or not raw:
            raise ValueError("structural_tag.structures must be a non-empty list of {begin, schema, end} objects")
        if len(raw) > MAX_STRUCTURES:
            raise ValueError(f"structural_tag.structures: at most {MAX_STRUCTURES}, got {len(raw)}")
        structures = []
        for i, s in enumerate(raw):
            where = f"structural_tag.structures[{i}]"
            if not isinstance(s, dict) or set(s) - {"begin", "schema", "end"}:
                raise ValueError(f"{where} must be an object with begin, schema and end only")
            begin, schema, end = s.get("begin"), s.get("schema"), s.get("end")
            if not isinstance(begin, str) or not isinstance(end, str) or not end:
                raise ValueError(f"{where}: begin and end must be non-empty strings")
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"{where}.schema must be a JSON schema (an object or a boolean)")
            if not any(begin.startswith(t) for t in triggers):
                raise ValueError(f"{where}.begin {begin!r} does not start with any of the triggers")
            structures.append(Structure(begin, schema, end))
        for i, t in enumerate(triggers):
            if not any(s.begin.startswith(t) for s in structures):
                raise ValueError(f"structural_tag.triggers[{i}] {t!r} starts no structure's begin "
                                 "(free text could never hold it)")
        for text in (*triggers, *(s.begin for s in structures), *(s.end for s in structures)):
            if any(ord(c) >= 0x100000 for c in text):
                raise ValueError("structural_tag: code points U+100000-U+10FFFF are reserved")
        return StructuralTag(tuple(structures), tuple(dict.fromkeys(triggers)))

    def canonical(self) -> str:
        """Compact JSON text (the grammar cache key); schema key order is kept (it is the
        order of the generated members)."""
        return json.dumps({"structures": [{"begin": s.begin, "schema": s.schema, "end": s.end}
                                          for s in self.structures],
                           "triggers": list(self.triggers)}, separators=(",", ":"), ensure_ascii=False)


# ------------------------------------------------------------------ free text

def _group(r: str) -> str:
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
        return f"{_group(a or b)}?"
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
        star = "" if loop is None else f"{_group(loop)}*"
        outs = edges.pop(k)
        for i in edges:
            into = edges[i].pop(k, None)
            if into is None:
                continue
            for j, out in outs.items():
                edges[i][j] = _union(edges[i].get(j), _concat(into, star, out))
    loop = edges[0].get(0)
    rest = edges[0].get(final)
    head = "" if loop is None else f"{_group(loop)}*"
    return _concat(head, rest or "") if rest is not None else head


# ------------------------------------------------------------------ the whole regex

def structural_tag_to_regex(value: str, *, whitespace_pattern: str | None = None, mode: str = "strict",
                            holes: bool = False, max_recursion_depth: int = 3) -> str:
    """The regex of a structural tag (its canonical JSON text). With ``holes`` the schemas'
    any-values are holes and their recursive refs calls (json_holes.py), as for one schema."""
    from treadle.constrained.json_schema import json_schemas_to_regexes

    tag = StructuralTag.parse(value)
    schemas, definitions = json_schemas_to_regexes(
        [s.schema for s in tag.structures], whitespace_pattern=whitespace_pattern, mode=mode, holes=holes,
        max_recursion_depth=max_recursion_depth, paths=[f"$.structures[{i}].schema" for i in range(len(tag.structures))])
    holes = any(c in r for r in (*schemas, *definitions) for c in WRITTEN)
    # free text must not take a placeholder, or a definition's branch (ENTRY CALL_i) would start in it
    free = _group(trigger_free_regex(tag.triggers, PLACEHOLDER_RANGE if holes else ""))
    branches = []
    for t in tag.triggers:
        segments = [escape_literal(s.begin[len(t):]) + _group(r) + escape_literal(s.end)
                    for s, r in zip(tag.structures, schemas) if s.begin.startswith(t)]
        branches.append(escape_literal(t) + _group("|".join(segments)))
    root = f"{free}(?:(?:{'|'.join(branches)}){free})*"
    return with_definitions(root, definitions)


def structural_tag_bounds(value: str, regex: str) -> Bounds:
    """The bytes around the holes and calls of a structural tag's regex (json_holes.Bounds):
    JSON's, and where a schema has any, the last byte of its begin (its whole value may be a
    hole) and the first byte of its end."""
    tag = StructuralTag.parse(value)
    before, first, last, after = JSON_BOUNDS
    if any(c in regex for c in WRITTEN):
        before = ENTRY_AFTER | {s.begin.encode()[-1] for s in tag.structures}
        after = EXIT_AT | {s.end.encode()[0] for s in tag.structures}
    return (frozenset(before), first, last, frozenset(after))

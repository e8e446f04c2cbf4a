"""Structural tags: free text and tagged segments, each segment in a format of its own.

SGLang's and xgrammar's ``structural_tag`` response format, in both of its forms:

* the legacy one, for tool calls inside a free reply::

    {"structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}, ...],
     "triggers": ["<function="]}

* xgrammar's ``format`` tree, ``{"type": "structural_tag", "format": {...}}``, whose nodes are
  ``const_string``, ``json_schema``, ``regex``, ``grammar`` (EBNF), ``any_text``,
  ``sequence``, ``or``, ``optional`` / ``plus`` / ``star`` / ``repeat``, ``tag`` (begin,
  content, an end or a list of ends), ``triggered_tags`` and ``tags_with_separator``.

The legacy form is a ``triggered_tags`` of ``tag``s whose contents are ``json_schema``s.
What each node allows (xgrammar's meaning, checked against xgrammar 0.2.9):

* ``triggered_tags``: the text is free until a trigger appears; from there it must go on
  as the begin of a tag starting with that trigger, its content and its end, then it is free
  again. A trigger cannot appear in free text without opening a tag, so a tag the model
  opens always parses. ``at_least_one``: the text starts with a tag; ``stop_after_first``:
  nothing follows the first tag. Each tag's begin starts with exactly one trigger, and free
  text holds none of ``excludes``;
* ``tags_with_separator``: tags with the separator between them and no other text;
* ``tag``: its begin, its content, one of its ends. Content that ends in free text
  (``any_text``, ``triggered_tags``) ends at the first end: that free text holds none;
* ``any_text``: any text holding none of ``excludes``; ``sequence`` and ``or`` are
  concatenation and alternation.

Unlike xgrammar, free text (``any_text``, ``triggered_tags``) must be followed by fixed text
(a ``const_string``, a tag's begin or end) or end the output, and cannot repeat: free text
followed by a pattern (``any_text`` then a JSON number) makes the token index's automaton
blow up; those formats are a ``ValueError``.

It all compiles to one regex, so the token index, holes and calls, masks and jump-forward
(after a trigger, the rest of a single begin is forced text) work as for a schema::

    triggered_tags:  F (?: (?: T1 (?: B11 C11 E11 | ...) | T2 (...) ) F )*

``F`` is the free text (free_text.py). The format's JSON schemas are converted together
(``json_schemas_to_regexes``), so the recursive ``$ref``s of all of them are calls of one
list of definitions; a format with a ``regex`` or ``grammar`` node converts them without
holes (the node's character classes could take a placeholder).

Importing this module does not import torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from treadle.constrained.regex.free_text import group, trigger_free_regex
from treadle.constrained.index.json_holes import ENTRY_AFTER, EXIT_AT, JSON_BOUNDS, PLACEHOLDER_RANGE, WRITTEN, Bounds, with_definitions
from treadle.constrained.regex.regex_text import escape_literal, translate_regex, validate_regex

__all__ = ["StructuralTag", "structural_tag_bounds", "structural_tag_to_regex", "trigger_free_regex"]

MAX_STRUCTURES = 64  # tags in all
MAX_NODES = 512
MAX_DEPTH = 16
MAX_REPEAT = 32  # a bounded repeat's max (-1, unbounded, is not counted)
MAX_TRIGGER_CHARS = 256  # the strings one free text must not hold, together: its regex grows with their automaton
_ANY = frozenset(range(256))


# ------------------------------------------------------------------ the format tree

@dataclass(frozen=True)
class Const:
    value: str


@dataclass(frozen=True)
class Json:
    schema: Any  # a JSON schema (dict or bool)


@dataclass(frozen=True)
class Regex:
    pattern: str


@dataclass(frozen=True)
class Grammar:
    ebnf: str


@dataclass(frozen=True)
class AnyText:
    excludes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Seq:
    elements: tuple[Any, ...]


@dataclass(frozen=True)
class Or:
    elements: tuple[Any, ...]


@dataclass(frozen=True)
class Repeat:
    content: Any
    lo: int
    hi: int  # -1: unbounded


@dataclass(frozen=True)
class Tag:
    begin: str
    content: Any
    ends: tuple[str, ...]


@dataclass(frozen=True)
class Triggered:
    triggers: tuple[str, ...]
    tags: tuple[Tag, ...]
    at_least_one: bool = False
    stop_after_first: bool = False
    excludes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Separated:
    tags: tuple[Tag, ...]
    separator: str
    at_least_one: bool = False
    stop_after_first: bool = False


_FIELDS = {  # the fields of each node type besides "type"; defaults that change nothing are allowed too
    "const_string": {"value"}, "json_schema": {"json_schema", "style", "any_order", "excludes", "max_whitespace_cnt"},
    "regex": {"pattern"}, "grammar": {"grammar", "syntax"}, "any_text": {"excludes", "max_tokens", "max_chars"},
    "sequence": {"elements"}, "or": {"elements"}, "optional": {"content"}, "plus": {"content"}, "star": {"content"},
    "repeat": {"content", "min", "max"}, "tag": {"begin", "content", "end"},
    "triggered_tags": {"triggers", "tags", "at_least_one", "stop_after_first", "excludes"},
    "tags_with_separator": {"tags", "separator", "at_least_one", "stop_after_first"},
}
_NEUTRAL = {  # fields allowed only at these values (their others are not supported)
    "json_schema": {"style": "json", "any_order": False, "excludes": [], "max_whitespace_cnt": None},
    "grammar": {"syntax": "ebnf"}, "any_text": {"max_tokens": None, "max_chars": None}}


class _Parser:
    def __init__(self) -> None:
        self.nodes = 0
        self.tags = 0

    def string(self, v: Any, where: str, empty: bool = True) -> str:
        if not isinstance(v, str) or (not empty and not v):
            raise ValueError(f"{where} must be a {'' if empty else 'non-empty '}string")
        if any(ord(c) >= 0x100000 for c in v):
            raise ValueError(f"{where}: code points U+100000-U+10FFFF are reserved")
        return v

    def strings(self, v: Any, where: str) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise ValueError(f"{where} must be a list of non-empty strings")
        return tuple(dict.fromkeys(self.string(s, f"{where}[{i}]", empty=False) for i, s in enumerate(v)))

    def flag(self, v: dict, name: str, where: str) -> bool:
        f = v.get(name, False)
        if not isinstance(f, bool):
            raise ValueError(f"{where}.{name} must be a boolean")
        return f

    def node(self, v: Any, where: str, depth: int = 0) -> Any:
        if not isinstance(v, dict):
            raise ValueError(f"{where} must be an object (a format)")
        t = v.get("type")
        if t not in _FIELDS:
            raise ValueError(f"{where}.type {t!r} is not supported; supported: {', '.join(_FIELDS)}")
        extra = sorted(set(v) - _FIELDS[t] - {"type"})
        if extra:
            raise ValueError(f"{where}: unknown field(s) {', '.join(extra)} for a {t!r} format")
        for name, neutral in _NEUTRAL.get(t, {}).items():
            if name in v and v[name] != neutral:
                raise ValueError(f"{where}.{name} = {v[name]!r} is not supported (only {neutral!r})")
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise ValueError(f"structural_tag: at most {MAX_NODES} formats, nested at most {MAX_DEPTH} deep")
        sub = depth + 1
        if t == "const_string":
            return Const(self.string(v.get("value"), f"{where}.value"))
        if t == "json_schema":
            schema = v.get("json_schema")
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"{where}.json_schema must be a JSON schema (an object or a boolean)")
            return Json(schema)
        if t == "regex":
            pattern = self.string(v.get("pattern"), f"{where}.pattern")
            try:  # the linear checks here; interegular's, which can take minutes, in the compile worker
                translate_regex(pattern)
            except ValueError as e:
                raise ValueError(f"{where}.pattern: {e}") from e
            return Regex(pattern)
        if t == "grammar":
            return Grammar(self.string(v.get("grammar"), f"{where}.grammar", empty=False))
        if t == "any_text":
            return AnyText(self.strings(v.get("excludes", []), f"{where}.excludes"))
        if t in ("sequence", "or"):
            elements = v.get("elements")
            if not isinstance(elements, list) or not elements:
                raise ValueError(f"{where}.elements must be a non-empty list of formats")
            parts = tuple(self.node(e, f"{where}.elements[{i}]", sub) for i, e in enumerate(elements))
            if t == "sequence":
                for i in range(len(parts) - 1):
                    first, _, empty = _edges(parts[i + 1])
                    if _open_tail(parts[i]) and (empty or first == _ANY):
                        raise ValueError(f"{where}.elements[{i}] ends in free text, so the element after it must "
                                         "begin with fixed text (a const_string, a tag): a token index cannot be "
                                         "built for free text followed by a pattern")
            return Seq(parts) if t == "sequence" else Or(parts)
        if t in ("optional", "plus", "star", "repeat"):
            content = self.node(v.get("content"), f"{where}.content", sub)
            if _open_tail(content):
                raise ValueError(f"{where}.content ends in free text: it cannot repeat (put it in a tag)")
            if t != "repeat":
                return Repeat(content, int(t == "plus"), 1 if t == "optional" else -1)
            lo, hi = v.get("min"), v.get("max")
            if not isinstance(lo, int) or not isinstance(hi, int) or isinstance(lo, bool) or isinstance(hi, bool) \
                    or lo < 0 or (hi != -1 and hi < lo) or hi == 0:
                raise ValueError(f"{where}: min must be >= 0 and max >= min (>= 1), or -1 for no bound")
            if max(lo, hi) > MAX_REPEAT:
                raise ValueError(f"{where}: min and max at most {MAX_REPEAT} (max -1 for no bound)")
            return Repeat(content, lo, hi)
        if t == "tag":
            return self.tag(v, where, depth)
        tags = v.get("tags")
        if not isinstance(tags, list) or not tags:
            raise ValueError(f"{where}.tags must be a non-empty list of tag formats")
        tags_ = tuple(self.tag(g, f"{where}.tags[{i}]", sub) for i, g in enumerate(tags))
        first, once = self.flag(v, "at_least_one", where), self.flag(v, "stop_after_first", where)
        if t == "tags_with_separator":
            return Separated(tags_, self.string(v.get("separator"), f"{where}.separator"), first, once)
        triggers = v.get("triggers")
        if not isinstance(triggers, list) or not triggers:
            raise ValueError(f"{where}.triggers must be a non-empty list of non-empty strings")
        triggers_ = self.strings(triggers, f"{where}.triggers")
        for i, g in enumerate(tags_):
            n = sum(g.begin.startswith(x) for x in triggers_)
            if n != 1:
                raise ValueError(f"{where}.tags[{i}].begin {g.begin!r} " + (
                    "does not start with any of the triggers" if not n else
                    "starts with more than one of the triggers (it must start with exactly one)"))
        for i, x in enumerate(triggers_):
            if not any(g.begin.startswith(x) for g in tags_):
                raise ValueError(f"{where}.triggers[{i}] {x!r} starts no tag's begin (free text could never hold it)")
        excludes = self.strings(v.get("excludes", []), f"{where}.excludes")
        return Triggered(triggers_, tags_, first, once, excludes)

    def tag(self, v: Any, where: str, depth: int) -> Tag:
        if not isinstance(v, dict):
            raise ValueError(f"{where} must be a tag format (an object with begin, content and end)")
        v = {"type": "tag", **v}
        if v["type"] != "tag":
            raise ValueError(f"{where}.type must be 'tag'")
        extra = sorted(set(v) - _FIELDS["tag"] - {"type"})
        if extra:
            raise ValueError(f"{where}: unknown field(s) {', '.join(extra)} for a 'tag' format")
        self.nodes += 1
        self.tags += 1
        if self.tags > MAX_STRUCTURES:
            raise ValueError(f"structural_tag: at most {MAX_STRUCTURES} tags")
        begin = self.string(v.get("begin"), f"{where}.begin")
        end = v.get("end")
        ends = (self.string(end, f"{where}.end"),) if isinstance(end, str) else \
            tuple(dict.fromkeys(self.string(e, f"{where}.end[{i}]") for i, e in enumerate(end))) \
            if isinstance(end, list) and end else None
        if ends is None:
            raise ValueError(f"{where}.end must be a string or a non-empty list of strings")
        content = self.node(v.get("content"), f"{where}.content", depth + 1)
        if _open_tail(content) and not any(ends):
            raise ValueError(f"{where}: content that ends in free text needs a non-empty end")
        return Tag(begin, content, ends)


def _open_tail(node: Any) -> bool:
    """Whether ``node``'s text may end in free text (its end is then the tag's end)."""
    if isinstance(node, AnyText):
        return True
    if isinstance(node, Triggered):
        return not (node.at_least_one and node.stop_after_first)
    if isinstance(node, Seq):
        return _open_tail(node.elements[-1])
    if isinstance(node, Or):
        return any(map(_open_tail, node.elements))
    if isinstance(node, Repeat):
        return _open_tail(node.content)
    return False


def _legacy(value: dict) -> Triggered:
    """The legacy ``{"structures", "triggers"}`` form as the ``triggered_tags`` it is."""
    extra = sorted(set(value) - {"type", "structures", "triggers"})
    if extra:
        raise ValueError(f"structural_tag: unknown field(s) {', '.join(extra)}; accepted: structures, triggers "
                         "(or format)")
    triggers = value.get("triggers")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("structural_tag.triggers must be a non-empty list of non-empty strings")
    raw = value.get("structures")
    if not isinstance(raw, list) or not raw:
        raise ValueError("structural_tag.structures must be a non-empty list of {begin, schema, end} objects")
    tags = []
    for i, s in enumerate(raw):
        where = f"structural_tag.structures[{i}]"
        if not isinstance(s, dict) or set(s) - {"begin", "schema", "end"}:
            raise ValueError(f"{where} must be an object with begin, schema and end only")
        if not isinstance(s.get("begin"), str) or not isinstance(s.get("end"), str) or not s["end"]:
            raise ValueError(f"{where}: begin and end must be non-empty strings")
        if not isinstance(s.get("schema"), (dict, bool)):
            raise ValueError(f"{where}.schema must be a JSON schema (an object or a boolean)")
        tags.append({"begin": s["begin"], "content": {"type": "json_schema", "json_schema": s["schema"]},
                     "end": s["end"]})
    try:
        return _Parser().node({"type": "triggered_tags", "triggers": triggers, "tags": tags}, "structural_tag")
    except ValueError as e:
        raise ValueError(str(e).replace("structural_tag.tags[", "structural_tag.structures[")) from None


def _dump(node: Any) -> dict:
    """The format (xgrammar's form) of a node."""
    if isinstance(node, Const):
        return {"type": "const_string", "value": node.value}
    if isinstance(node, Json):
        return {"type": "json_schema", "json_schema": node.schema}
    if isinstance(node, Regex):
        return {"type": "regex", "pattern": node.pattern}
    if isinstance(node, Grammar):
        return {"type": "grammar", "grammar": node.ebnf}
    if isinstance(node, AnyText):
        return {"type": "any_text", "excludes": list(node.excludes)}
    if isinstance(node, (Seq, Or)):
        return {"type": "sequence" if isinstance(node, Seq) else "or", "elements": [_dump(e) for e in node.elements]}
    if isinstance(node, Repeat):
        return {"type": "repeat", "min": node.lo, "max": node.hi, "content": _dump(node.content)}
    if isinstance(node, Tag):
        return {"type": "tag", "begin": node.begin, "content": _dump(node.content), "end": list(node.ends)}
    if isinstance(node, Triggered):
        return {"type": "triggered_tags", "triggers": list(node.triggers), "tags": [_dump(t) for t in node.tags],
                "at_least_one": node.at_least_one, "stop_after_first": node.stop_after_first,
                "excludes": list(node.excludes)}
    return {"type": "tags_with_separator", "tags": [_dump(t) for t in node.tags], "separator": node.separator,
            "at_least_one": node.at_least_one, "stop_after_first": node.stop_after_first}


def _walk(node: Any, path: str = "$.format"):
    """(node, its path in the format) for every node of the tree, depth first, parents first."""
    yield node, path
    if isinstance(node, (Seq, Or)):
        kids = [(e, f"{path}.elements[{i}]") for i, e in enumerate(node.elements)]
    elif isinstance(node, (Repeat, Tag)):
        kids = [(node.content, f"{path}.content")]
    elif isinstance(node, (Triggered, Separated)):
        kids = [(t, f"{path}.tags[{i}]") for i, t in enumerate(node.tags)]
    else:
        kids = []
    for k, at in kids:
        yield from _walk(k, at)


def _as_seq(tag: Tag) -> Seq:
    """A tag as the sequence it is: its begin, its content, one of its ends."""
    return Seq((Const(tag.begin), tag.content, Or(tuple(map(Const, tag.ends)))))


@dataclass(frozen=True)
class StructuralTag:
    format: Any  # the root node

    @staticmethod
    def parse(value: Any) -> StructuralTag:
        """A structural tag from its dict or JSON text, in either form; ``ValueError`` naming the
        first problem. A ``"type": "structural_tag"`` member (the response_format's) is allowed."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"structural_tag is not valid JSON: {e}") from e
        if not isinstance(value, dict):
            raise ValueError(f"structural_tag must be an object, got {type(value).__name__}")
        if value.get("type", "structural_tag") != "structural_tag":
            raise ValueError(f"structural_tag.type must be 'structural_tag', got {value.get('type')!r}")
        if "format" not in value:
            return StructuralTag(_legacy(value))
        extra = sorted(set(value) - {"type", "format"})
        if extra:
            raise ValueError(f"structural_tag: unknown field(s) {', '.join(extra)} beside format")
        return StructuralTag(_Parser().node(value["format"], "structural_tag.format"))

    def canonical(self) -> str:
        """Compact JSON text of the format (the grammar cache key); schema key order is kept
        (it is the order of the generated members)."""
        return json.dumps({"type": "structural_tag", "format": _dump(self.format)}, separators=(",", ":"),
                          ensure_ascii=False)


# ------------------------------------------------------------------ the regex

class _Emitter:
    def __init__(self, schemas: dict[int, str], hide: str, max_recursion_depth: int) -> None:
        self.schemas = schemas  # id(Json node) -> its regex
        self.hide = hide
        self.depth = max_recursion_depth

    def free(self, avoid: tuple[str, ...]) -> str:
        avoid = tuple(dict.fromkeys(a for a in avoid if a))
        if sum(map(len, avoid)) > MAX_TRIGGER_CHARS:
            raise ValueError(f"structural_tag: the strings free text must not hold (triggers, excludes, the end "
                             f"around it) are at most {MAX_TRIGGER_CHARS} characters together")
        if avoid:
            return group(trigger_free_regex(avoid, self.hide))
        return f"[^{self.hide}]*" if self.hide else r"[\s\S]*"

    def tag(self, t: Tag, skip: int = 0) -> str:
        """A tag's regex without the first ``skip`` characters of its begin."""
        ends = [escape_literal(e) for e in t.ends]
        end = ends[0] if len(ends) == 1 else "(?:" + "|".join(ends) + ")"
        return escape_literal(t.begin[skip:]) + group(self.emit(t.content, t.ends)) + end

    def emit(self, node: Any, stop: tuple[str, ...] = ()) -> str:
        """``node``'s regex; ``stop``: the ends of the tag it closes, which its free text at the
        end must not hold."""
        if isinstance(node, Const):
            return escape_literal(node.value)
        if isinstance(node, Json):
            return group(self.schemas[id(node)])
        if isinstance(node, Regex):
            return group(validate_regex(node.pattern))
        if isinstance(node, Grammar):
            from treadle.constrained.ebnf.ebnf import ebnf_to_regex

            return group(ebnf_to_regex(node.ebnf, max_recursion_depth=self.depth))
        if isinstance(node, AnyText):
            return self.free(node.excludes + stop)
        if isinstance(node, Seq):
            last = len(node.elements) - 1
            parts = (self.emit(e, stop if i == last else ()) for i, e in enumerate(node.elements))
            return "".join(group(r) for r in parts if r)
        if isinstance(node, Or):
            return "(?:" + "|".join(self.emit(e, stop) for e in node.elements) + ")"
        if isinstance(node, Repeat):
            n = "?" if (node.lo, node.hi) == (0, 1) else "*" if (node.lo, node.hi) == (0, -1) else \
                "+" if (node.lo, node.hi) == (1, -1) else f"{{{node.lo},}}" if node.hi == -1 else \
                f"{{{node.lo}}}" if node.lo == node.hi else f"{{{node.lo},{node.hi}}}"
            return f"(?:{self.emit(node.content, stop)}){n}"
        if isinstance(node, Tag):
            return self.tag(node)
        if isinstance(node, Separated):
            one = "(?:" + "|".join(self.tag(t) for t in node.tags) + ")"
            if node.stop_after_first:
                return one if node.at_least_one else one + "?"
            more = f"{one}(?:{escape_literal(node.separator)}{one})*"
            return more if node.at_least_one else f"(?:{more})?"
        # triggered tags: a trigger, then the rest of a begin that starts with it
        branches = []
        for x in node.triggers:
            rests = [self.tag(t, len(x)) for t in node.tags if t.begin.startswith(x)]
            branches.append(escape_literal(x) + group("|".join(rests)))
        one = "(?:" + "|".join(branches) + ")"
        free = self.free(node.triggers + node.excludes + stop)
        if node.stop_after_first:
            return one if node.at_least_one else f"{free}{one}?"
        return f"{one}{free}(?:{one}{free})*" if node.at_least_one else f"{free}(?:{one}{free})*"


def structural_tag_to_regex(value: str, *, whitespace_pattern: str | None = None, mode: str = "strict",
                            holes: bool = False, max_recursion_depth: int = 3) -> str:
    """The regex of a structural tag (its canonical JSON text). With ``holes`` the schemas'
    any-values are holes and their recursive refs calls (json_holes.py), as for one schema,
    unless the format has a regex or a grammar node."""
    from treadle.constrained.schema.json_schema import json_schemas_to_regexes

    root = StructuralTag.parse(value).format
    nodes = [n for n, _ in _walk(root)]
    jsons = [(n, f"{path}.json_schema") for n, path in _walk(root) if isinstance(n, Json)]
    if isinstance(root, Triggered) and not (root.at_least_one or root.stop_after_first or root.excludes) and all(
            isinstance(t.content, Json) and len(t.ends) == 1 and t.ends[0] for t in root.tags):
        jsons = [(n, f"$.structures[{i}].schema") for i, (n, _) in enumerate(jsons)]  # the legacy form's names
    holes = holes and not any(isinstance(n, (Regex, Grammar)) for n in nodes)
    regexes, definitions = json_schemas_to_regexes(
        [n.schema for n, _ in jsons], whitespace_pattern=whitespace_pattern, mode=mode, holes=holes,
        max_recursion_depth=max_recursion_depth, paths=[path for _, path in jsons])
    written = any(c in r for r in (*regexes, *definitions) for c in WRITTEN)
    # free text must not take a placeholder, or a definition's branch (ENTRY CALL_i) would start in it
    emitter = _Emitter({id(n): r for (n, _), r in zip(jsons, regexes)}, PLACEHOLDER_RANGE if written else "",
                       max_recursion_depth)
    return with_definitions(emitter.emit(root), definitions)


# ------------------------------------------------------------------ the bytes around JSON values


def _edges(node: Any) -> tuple[frozenset[int], frozenset[int], bool]:
    """(the first bytes of ``node``'s texts, their last bytes, whether one is empty); any byte
    where that is not simply known."""
    if isinstance(node, Const):
        b = node.value.encode()
        return (frozenset(b[:1]), frozenset(b[-1:]), not b)
    if isinstance(node, Json):
        return _ANY, _ANY, False
    if isinstance(node, (Regex, Grammar, AnyText)):
        return _ANY, _ANY, True
    if isinstance(node, Tag):
        return _edges(_as_seq(node))
    if isinstance(node, Seq):
        first, last = frozenset(), frozenset()
        parts = [_edges(e) for e in node.elements]
        for f, _, empty in parts:
            first |= f
            if not empty:
                break
        for _, la, empty in reversed(parts):
            last |= la
            if not empty:
                break
        return first, last, all(p[2] for p in parts)
    if isinstance(node, Or):
        parts = [_edges(e) for e in node.elements]
        return frozenset().union(*(p[0] for p in parts)), frozenset().union(*(p[1] for p in parts)), \
            any(p[2] for p in parts)
    if isinstance(node, Repeat):
        f, la, empty = _edges(node.content)
        return f, la, empty or node.lo == 0
    if isinstance(node, Separated):
        parts = [_edges(t) for t in node.tags]
        return frozenset().union(*(p[0] for p in parts)), frozenset().union(*(p[1] for p in parts)), \
            not node.at_least_one
    return _ANY, _ANY, not node.at_least_one  # triggered tags: free text around


def _around(node: Any, before: frozenset[int], after: frozenset[int], out: list) -> None:
    """Append (bytes that may come before, bytes that may come after) each JSON value of
    ``node``, which ``before`` / ``after`` may surround (empty: the text's start / end)."""
    if isinstance(node, Json):
        out.append((before, after))
    elif isinstance(node, Tag):
        _around(_as_seq(node), before, after, out)
    elif isinstance(node, Seq):
        parts = [_edges(e) for e in node.elements]
        for i, e in enumerate(node.elements):
            b, a = frozenset(), frozenset()
            for _, la, empty in reversed(parts[:i]):
                b |= la
                if not empty:
                    break
            else:
                b |= before
            for f, _, empty in parts[i + 1:]:
                a |= f
                if not empty:
                    break
            else:
                a |= after
            _around(e, b, a, out)
    elif isinstance(node, Or):
        for e in node.elements:
            _around(e, before, after, out)
    elif isinstance(node, Repeat):
        f, la, _ = _edges(node.content)
        _around(node.content, before | la, after | f, out)
    elif isinstance(node, Separated):
        sep = node.separator.encode()
        for t in node.tags:
            _around(t, before | frozenset(sep[-1:]), after | frozenset(sep[:1]), out)
    elif isinstance(node, Triggered):
        for t in node.tags:  # free text around them
            _around(t, _ANY, _ANY, out)


def structural_tag_bounds(value: str, regex: str) -> Bounds:
    """The bytes around the holes and calls of a structural tag's regex (json_holes.Bounds):
    JSON's, and where a schema has any, the bytes that may come before and after its values
    in the format (a tag's begin's last byte and its ends' first bytes)."""
    before, first, last, after = JSON_BOUNDS
    if any(c in regex for c in WRITTEN):
        out: list = []
        _around(StructuralTag.parse(value).format, frozenset(), frozenset(), out)
        before = frozenset(ENTRY_AFTER).union(*(b for b, _ in out))
        after = frozenset(EXIT_AT).union(*(a for _, a in out))
    return (frozenset(before), first, last, frozenset(after))

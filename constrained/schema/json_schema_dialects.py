"""JSON Schema dialects: any draft's schema rewritten into the one the converter reads.

The converter (json_schema.py) reads draft 2020-12. A schema of another draft, named by
its ``$schema`` (draft-03, -04, -06, -07, 2019-09), is first rewritten here into the 2020-12
spelling of the same meaning, and a schema with no ``$schema`` is read as 2020-12 that also
takes the older spellings where they can mean only one thing. What each draft asserts is the
explicit list ``ASSERTIONS`` (jsonschema's own list of keywords it validates, per draft); every
other keyword is an annotation, whatever its name (vendor metadata, typos, editor hints,
OpenAPI extras), and never changes validity.

The rewrite, per subschema:

- a keyword the converter knows as an assertion but the draft does not (draft-04's
  ``const``, draft-07's ``dependentRequired``) is renamed ``x-ignored-<name>``, an annotation;
- ``items`` as a list and ``additionalItems`` (drafts before 2020-12) are ``prefixItems`` and
  ``items``; ``dependencies`` (draft-04 to -07) splits into ``dependentRequired`` (its lists)
  and ``dependentSchemas`` (its schemas); draft-04's ``id`` is ``$id``, and its boolean
  ``exclusiveMinimum`` / ``exclusiveMaximum`` make ``minimum`` / ``maximum`` exclusive;
- in draft-07 and older a ``$ref`` overrides its siblings: assertions beside it are renamed
  as ignored;
- draft-03 (``_from_draft3``) is read as draft-04 spelt: a property's ``required: true`` is its
  parent's ``required``, a ``type`` list holding schemas (and ``any``) is ``anyOf``,
  ``disallow`` a ``not`` of such a union, ``extends`` ``allOf``, ``divisibleBy``
  ``multipleOf``, a string dependency a list of one, its formats the later names (``time``,
  Draft3Validator's %H:%M:%S, and ``color`` patterns); the later drafts' keywords (allOf, not,
  minProperties ...) are no draft-03 keywords, so annotations.

With no ``$schema``: ``id``, ``dependencies``, list ``items`` with ``additionalItems`` and a
boolean ``exclusiveMinimum`` are read the old way (in 2020-12 the first two are unknown, so
enforcing them only narrows; the last two are malformed there), and a ``$ref``'s siblings
apply, as 2020-12 says (which also satisfies a reader that ignores them).

Renamed keys move the JSON pointers below them, so every local ``$ref`` is rewritten to the
new place of what it pointed at.

Before that, identifiers are resolved away (``_resolve_ids``): every ``$ref`` is resolved as
the draft says, against the base URI of the resource it stands in (an ``$id`` below the root
starts an embedded resource, draft-04's ``id`` too; ``$anchor`` and draft-06/07's ``$id: "#name"``
name a place), and rewritten as a JSON pointer from the root (``#/definitions/b/definitions/a``)
where its target is in the document; the identifiers themselves are then annotations
(``x-ignored-$id``), so the converter and the validators it asks resolve every ref from the root.
A ref to another document is left as it is (and refused where it is used).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple
from urllib.parse import unquote, urldefrag, urljoin

import jsonschema
import referencing.jsonschema

from treadle.constrained.schema.json_schema_documents import embedded, missing_documents
from treadle.constrained.schema.json_schema_parts import DYNAMIC_REFS, UnsupportedSchemaError, pointed

__all__ = ["ASSERTIONS", "DIALECTS", "dialect_of", "to_2020_12"]

_DIALECT_URI = re.compile(r"https?://json-schema\.org/(?:(draft-0[3467])/schema|draft/(20(?:19-09|20-12))/schema)#?")
DIALECTS = ("draft-03", "draft-04", "draft-06", "draft-07", "2019-09", "2020-12")
_VALIDATORS = dict(zip(DIALECTS, (jsonschema.Draft3Validator, jsonschema.Draft4Validator, jsonschema.Draft6Validator,
                                  jsonschema.Draft7Validator, jsonschema.Draft201909Validator,
                                  jsonschema.Draft202012Validator)))
# The keywords each draft asserts or applies: jsonschema's validators, and the ones read
# inside them (then/else by if, minContains/maxContains by contains).
ASSERTIONS: dict[str, frozenset[str]] = {
    d: frozenset(v.VALIDATORS) | ({"then", "else"} if "if" in v.VALIDATORS else set())
    | ({"minContains", "maxContains"} if d in ("2019-09", "2020-12") else set())
    | ({"exclusiveMinimum", "exclusiveMaximum"} if d in ("draft-03", "draft-04") else set())
    | ({"required"} if d == "draft-03" else set())  # (a boolean in each property, read by "properties")
    for d, v in _VALIDATORS.items()
}
# what the converter reads (2020-12 and what treadle reads of the older drafts' spellings)
_CONVERTER = ASSERTIONS["2020-12"] | {"$recursiveRef"}
_DATA = frozenset({"const", "enum", "default", "examples", "required", "type"})  # values that are not schemas
_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_PLAIN = "plain"  # no $schema: 2020-12 with the older spellings that mean one thing


def dialect_of(schema: Any) -> str:
    """The draft ``schema`` names in its root ``$schema`` (one of ``DIALECTS``), or "plain"
    when it names none or another metaschema (read as 2020-12: see ``check_metaschemas``)."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    m = _DIALECT_URI.fullmatch(uri) if isinstance(uri, str) else None
    if m is None:
        return _PLAIN
    return m.group(1) or m.group(2)


def to_2020_12(schema: Any) -> Any:
    """``schema`` rewritten into the 2020-12 spelling the converter reads (see the module
    docstring); a new object, ``schema`` is not changed. Raises ``UnsupportedSchemaError``
    for a ``$schema`` below the root naming another draft than the root's."""
    dialect = dialect_of(schema)
    schema = _resolve_ids(schema, dialect)
    if dialect == "draft-03":
        schema = _typed_into_unions(schema)
    moved: dict[tuple, tuple] = {}  # original pointer tokens -> the new ones, for every node
    out = _node(schema, dialect, (), (), moved, "$")
    return _rebase(out, moved)


# how each draft names resources and places (referencing's, which jsonschema resolves with)
_SPECIFICATIONS = {"draft-03": referencing.jsonschema.DRAFT3, "draft-04": referencing.jsonschema.DRAFT4,
                   "draft-06": referencing.jsonschema.DRAFT6, "draft-07": referencing.jsonschema.DRAFT7,
                   "2019-09": referencing.jsonschema.DRAFT201909, "2020-12": referencing.jsonschema.DRAFT202012,
                   _PLAIN: referencing.jsonschema.DRAFT202012}
_SCHEMA_DATA = frozenset({"const", "enum", "default", "examples"})  # values that are data (no refs, no ids)
_IDENTIFIERS = ("$id", "$anchor")  # (and draft-03/04's "id"): annotations once every ref is a pointer


def _resolve_ids(schema: Any, dialect: str) -> Any:
    """``schema`` with every ``$ref`` whose target is in the document written as a JSON pointer
    from the root, resolved against the base URI where it stands, and its identifiers renamed
    ``x-ignored-...`` (see the module docstring). Refs to other documents, or to a pointer or
    anchor their resource lacks, stay unresolvable (a missing pointer is kept inside its resource,
    so the root's same-named place never stands in for it)."""
    spec = _SPECIFICATIONS[dialect]
    resources: dict[str, tuple] = {}  # base URI (no fragment) -> pointer tokens of its root
    anchors: dict[tuple[str, str], tuple] = {}  # (base URI, name) -> pointer tokens
    dynamic: dict[tuple[str, str], tuple] = {}  # the same, of $dynamicAnchor names only
    outward: list[tuple[str, str]] = []  # (ref, base URI) of each ref that does not start with '#'
    found: list[bool] = [False]  # any identifier or non-local ref at all (else nothing changes)

    def ident(node: dict) -> str | None:
        try:
            value = spec.id_of(node)
        except Exception:  # noqa: BLE001 - a malformed id (not a string): none
            return None
        return value if isinstance(value, str) else None

    def index(node: Any, tokens: tuple, base: str, names: bool) -> None:
        """Record resources and anchors; ``names``: ``node`` maps names to schemas."""
        if isinstance(node, list):
            for i, v in enumerate(node):
                index(v, tokens + (str(i),), base, False)
            return
        if not isinstance(node, dict):
            return
        if names:
            for k, v in node.items():
                index(v, tokens + (k,), base, False)
            return
        nid = ident(node)
        if nid is not None:
            base = urldefrag(urljoin(base, nid)).url
            resources.setdefault(base, tokens)
        try:
            for anchor in spec.anchors_in(node):
                if isinstance(anchor.name, str):
                    anchors.setdefault((base, anchor.name), tokens)
        except Exception:  # noqa: BLE001 - a malformed anchor: none
            pass
        for name in ([node["$dynamicAnchor"]] if isinstance(node.get("$dynamicAnchor"), str) else []) + \
                ([""] if node.get("$recursiveAnchor") is True and (nid is not None or not tokens) else []):
            dynamic[(base, name)] = None if (base, name) in dynamic else tokens  # (declared twice: None)
        if isinstance(node.get("$ref"), str) and not node["$ref"].startswith("#"):
            outward.append((node["$ref"], base))
        if any(isinstance(node.get(k), str) for k in _IDENTIFIERS + ("id",)) or outward:
            found[0] = True
        for k, v in node.items():
            if k not in _SCHEMA_DATA:
                index(v, tokens + (k,), base, k in _MAPS)

    root_id = ident(schema) if isinstance(schema, dict) else None
    root_base = urldefrag(urljoin("", root_id)).url if root_id is not None else ""
    while True:  # index; embed the meta-schemas refs name (json_schema_documents); again
        for held in (resources, anchors, dynamic, outward):
            held.clear()
        resources[root_base] = ()
        resources.setdefault("", ())
        index(schema, (), "", False)
        docs = missing_documents(outward, resources, dialect, dialect_of)
        if not docs:
            break
        schema = embedded(schema, docs, dialect)
    if not found[0]:
        return schema

    def pointer(tokens: tuple) -> str:
        return "#" + "".join("/" + t.replace("~", "~0").replace("/", "~1").replace("%", "%25") for t in tokens)

    def target(ref: str, base: str) -> str:
        uri, fragment = urldefrag(urljoin(base, ref))
        if uri not in resources:
            return ref  # another document
        if fragment == "":
            return pointer(resources[uri])
        if fragment.startswith("/"):
            return pointer(resources[uri]) + fragment
        place = anchors.get((uri, unquote(fragment)))
        return ref if place is None else pointer(place)

    def dynamic_target(ref: str, base: str) -> str | None:
        """A ``$dynamicRef`` (or ``$recursiveRef``, whose anchor is named "" here) as the pointer
        it resolves to whatever the path that reached it: where its static target declares no
        dynamic anchor of its name it is a plain ref; else the outermost resource of the dynamic
        scope declaring that name wins, which is the root where the root declares it (every
        evaluation starts there), or the one resource declaring it. None: it depends on the path."""
        uri, fragment = urldefrag(urljoin(base, ref))
        name = unquote(fragment) if ref != "#" or (uri, "") not in dynamic else ""
        if (uri, name) not in dynamic:
            static = target(ref, base)
            return None if static == ref and not (ref == "#" or ref.startswith("#/")) else static
        if dynamic[(uri, name)] is None:
            return None  # (its own resource declares it twice)
        if dynamic.get((root_base, name)) is not None:
            return pointer(dynamic[(root_base, name)])
        declaring = [tokens for (_, n), tokens in dynamic.items() if n == name]
        return pointer(declaring[0]) if len(declaring) == 1 and declaring[0] is not None else None

    def rewrite(node: Any, base: str, names: bool) -> Any:
        if isinstance(node, list):
            return [rewrite(v, base, False) for v in node]
        if not isinstance(node, dict):
            return node
        if names:
            return {k: rewrite(v, base, False) for k, v in node.items()}
        nid = ident(node)
        if nid is not None:
            base = urldefrag(urljoin(base, nid)).url
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                out[k] = target(v, base)
            elif k in DYNAMIC_REFS and isinstance(v, str) and "$ref" not in node \
                    and (k == "$dynamicRef" or v == "#") and dynamic_target(v, base) is not None:
                out["$ref"] = dynamic_target(v, base)
            elif (k in _IDENTIFIERS or k == "id" and dialect in ("draft-03", "draft-04")) and isinstance(v, str):
                out["x-ignored-" + k] = v
            elif k in _SCHEMA_DATA:
                out[k] = v
            else:
                out[k] = rewrite(v, base, k in _MAPS)
        return out

    return rewrite(schema, "", False)


def _node(node: Any, dialect: str, old: tuple, new: tuple, moved: dict, path: str, spelt: bool = False) -> Any:
    """One subschema (or anything in a schema's place: a dict under an unknown keyword is
    rewritten as a schema too, in case a ``$ref`` points at it); ``spelt``: a node the draft-03
    rewrite made, in draft-04's spelling already."""
    if isinstance(node, _Moved):
        return _node(node.schema, dialect, node.old, new, moved, path, node.spelt)
    if isinstance(node, list):
        moved[old] = new
        return [_node(v, dialect, old + (str(i),), new + (str(i),), moved, f"{path}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    moved[old] = new
    below = dialect_of(node) if old and isinstance(node.get("$schema"), str) else dialect
    # (below a root naming none, another draft's subschema is read as 2020-12 with the older
    # spellings, which only narrows, except draft-03's: its validator reads disallow, extends ...)
    if below not in (dialect, _PLAIN) and (dialect != _PLAIN or below == "draft-03"):
        raise UnsupportedSchemaError(f"json_schema: keyword '$schema' at {path}: a subschema of another draft "
                                     "than the root's is not supported")
    origin: dict[str, str] = {}  # a key of the node read below -> its key in the original
    spelling = "draft-04" if dialect == "draft-03" else dialect  # draft-03: its subschemas stay draft-03's
    if dialect == "draft-03" and not spelt:
        node, origin = _from_draft3(node, old)
    known = ASSERTIONS["2020-12"] if spelling == _PLAIN else ASSERTIONS[spelling]
    legacy_ref = spelling in ("draft-04", "draft-06", "draft-07") and "$ref" in node
    out: dict[str, Any] = {}

    def put(key: str, value: Any, old_key: str, kind: str = "schema") -> None:
        here_old, here_new = old + (origin.get(old_key, old_key),), new + (key,)
        if kind == "data":
            moved[here_old] = here_new
            out[key] = value
        elif kind == "map" and isinstance(value, dict):
            moved[here_old] = here_new
            out[key] = {n: _node(v, dialect, here_old + (n,), here_new + (n,), moved, f"{path}.{old_key}.{n}")
                        for n, v in value.items()}
        else:
            out[key] = _node(value, dialect, here_old, here_new, moved, f"{path}.{old_key}")

    old_items = spelling in ("draft-04", "draft-06", "draft-07", "2019-09", _PLAIN) and isinstance(node.get("items"), list)
    for key, value in node.items():
        if not isinstance(key, str):
            continue
        base = key.removeprefix("x-ignored-")
        if base in _DATA:
            kind = "data"
        elif base in _MAPS:
            kind = "map"
        else:
            kind = "schema"
        if legacy_ref and key != "$ref" and (key in known or key in _CONVERTER):
            put("x-ignored-" + key, value, key, kind)  # draft-07 and older: $ref overrides its siblings
            continue
        if key == "id" and isinstance(value, str) and spelling == "draft-04" and "$id" not in node:
            put("$id", value, key, "data")
        elif key == "items" and old_items:
            put("prefixItems", value, key)
        elif key == "additionalItems" and spelling != "2020-12":
            # after list items it is 2020-12's items; without them it has no effect
            put("items" if old_items else "x-ignored-" + key, value, key)
        elif key == "dependencies" and spelling in ("draft-04", "draft-06", "draft-07", _PLAIN) and isinstance(value, dict):
            moved[old + (key,)] = new + ("dependentSchemas",)
            lists = {n: v for n, v in value.items() if isinstance(v, list)}
            schemas = {n: v for n, v in value.items() if not isinstance(v, list)}
            if lists:
                out["dependentRequired"] = lists
            if schemas:
                out["dependentSchemas"] = {
                    n: _node(v, dialect, old + (key, n), new + ("dependentSchemas", n), moved, f"{path}.dependencies.{n}")
                    for n, v in schemas.items()}
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool) and spelling in ("draft-04", _PLAIN):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            if value and bound in node:
                out[key] = node[bound]  # set below; "minimum" itself is dropped there
            moved[old + (key,)] = new + ("x-ignored-" + key,)
        elif key in ("minimum", "maximum") and node.get("exclusive" + key[:3].title() + key[3:]) is True \
                and spelling in ("draft-04", _PLAIN):
            moved[old + (key,)] = new + ("exclusive" + key[:3].title() + key[3:],)
        elif key not in known and key in _CONVERTER and spelling != _PLAIN:
            put("x-ignored-" + key, value, key, kind)  # not an assertion of this draft
        else:
            put(key, value, key, kind)
    return out


class _Moved(NamedTuple):
    """A draft-03 subschema placed under a keyword of the rewrite (``anyOf`` for a ``type`` list)
    with ``old``, the pointer tokens of where it stood, for the refs into it; ``spelt``: a node
    the rewrite made (the ``not`` of ``disallow``), in draft-04's spelling already."""

    schema: Any
    old: tuple
    spelt: bool = False


# draft-03's keywords (jsonschema's Draft3Validator, "required" read by "properties"); every
# other assertion of the later drafts (allOf, not, minProperties ...) is an annotation there
_DRAFT3 = ASSERTIONS["draft-03"]
_LATER = (_CONVERTER | ASSERTIONS["draft-04"]) - _DRAFT3
# draft-03's formats a validator checks, in the later drafts' names, and those written as a
# pattern of some of the strings Draft3Validator's checker takes: "time" its %H:%M:%S, "color"
# (checked where webcolors is installed) a CSS 2.1 color's hex code. Its others (style, phone,
# utc-millisec) and the later drafts' formats are annotations.
_DRAFT3_FORMATS = {"date-time": "date-time", "date": "date", "regex": "regex", "uri": "uri", "email": "email",
                   "ipv6": "ipv6", "ip-address": "ipv4", "host-name": "hostname"}
_DRAFT3_PATTERNS = {"time": "^(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]$", "color": "^#[0-9a-f]{6}$"}
_GENERATED = "\x00"  # prefix of the original key of a keyword the rewrite adds (none: no ref reaches it)


def _from_draft3(node: dict, old: tuple) -> tuple[dict, dict[str, str]]:
    """A draft-03 subschema in draft-04's spelling (its subschemas, each a ``_Moved``, left in
    draft-03's), and the original key of each renamed one. ``required: true`` in a property is
    the parent's ``required``; a ``type`` list with schemas, and ``any``, ``anyOf``; ``disallow``
    a ``not`` of them; ``extends`` ``allOf``; ``divisibleBy`` ``multipleOf``; a string
    dependency a list of one; the later drafts' keywords ``x-ignored-``. Beside ``$ref`` the
    keywords are left as they are (the ref overrides them all)."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}

    def rename(key: str, to: str) -> None:
        out[to] = node[key]
        origin[to] = key

    every: list = []  # allOf
    for key, value in node.items():
        if key == "required" or key in _LATER or key == "$schema" and old:
            rename(key, "x-ignored-" + key)  # (an embedded document's draft-03, read here)
        elif "$ref" in node:
            out[key] = value
        elif key == "type":
            _draft3_type(value, old, out, origin)
        elif key == "disallow":
            out["not"] = _Moved({"anyOf": _draft3_types(value, old + (key,))}, old + (_GENERATED + "not",), True)
        elif key == "extends":
            every += [_Moved(value, old + (key,))] if isinstance(value, dict) else _draft3_types(value, old + (key,))
        elif key == "divisibleBy":
            rename(key, "multipleOf")
        elif key == "dependencies" and isinstance(value, dict):
            out[key] = {n: [v] if isinstance(v, str) else v for n, v in value.items()}
        elif key == "format" and isinstance(value, str):
            _draft3_format(value, out, origin, every)
        else:
            out[key] = value
    required = [n for n, sub in node.get("properties", {}).items() if isinstance(sub, dict) and sub.get("required")] \
        if isinstance(node.get("properties"), dict) and "$ref" not in node else []
    for key, value in (("required", required), ("allOf", every)):
        if value:
            out[key] = value
    origin.update({k: _GENERATED + k for k in ("anyOf", "allOf", "required") if k in out and k not in origin})
    return out, origin


_DRAFT3_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
# draft-03 keywords that constrain values of one type (a value of another type passes them)
_ONE_TYPE = {"items": "array", "additionalItems": "array", "minItems": "array", "maxItems": "array",
             "uniqueItems": "array", "pattern": "string", "minLength": "string", "maxLength": "string",
             "minimum": "number", "maximum": "number", "exclusiveMinimum": "number", "exclusiveMaximum": "number",
             "divisibleBy": "number"}


def _typed_into_unions(schema: Any) -> Any:
    """Draft-03 ``schema`` with the one-type keywords beside a ``type`` list holding schemas
    (``{"type": ["array", {"$ref": "#"}], "items": ...}``) moved into the names they constrain
    (``{"type": [{"type": "array", "items": ...}, {"$ref": "#"}]}``) where no schema of the
    list has a value of that type: the same meaning, and each schema stays as it is, a plain
    ``$ref`` the converter writes once rather than the ref merged with ``items`` (which
    unrolled the draft-03 metaschema's root at every use: 50 s). Indices in the list keep
    their places; a moved schema keeps its pointer (``_Moved``)."""

    def walk(node: Any, tokens: tuple, names: bool) -> Any:
        if isinstance(node, list):
            return [walk(v, tokens + (str(i),), False) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        if names:
            return {k: walk(v, tokens + (k,), False) for k, v in node.items()}
        out = {k: v if k in _SCHEMA_DATA else walk(v, tokens + (k,), k in _MAPS or k == "dependencies")
               for k, v in node.items()}
        return _spread(out, tokens, schema)

    return walk(schema, (), False)


def _spread(node: dict, tokens: tuple, root: Any) -> dict:
    """One node of ``_typed_into_unions``."""
    union = node.get("type")
    typed = [k for k in node if k in _ONE_TYPE]
    if not (isinstance(union, list) and typed and "$ref" not in node and "any" not in union
            and any(isinstance(m, dict) for m in union)):
        return node
    kinds = {_ONE_TYPE[k] for k in typed} | ({"integer"} if "number" in {_ONE_TYPE[k] for k in typed} else set())
    if not all(isinstance(m, str) or _types_of(m, root).isdisjoint(kinds) for m in union):
        return node

    def named(name: str) -> dict:
        of = {k: _Moved(node[k], tokens + (k,)) if isinstance(node[k], dict) else node[k]
              for k in typed if _ONE_TYPE[k] == name or _ONE_TYPE[k] == "number" and name == "integer"}
        return {"type": name, **of} if of else name

    out = {k: v for k, v in node.items() if k not in typed}
    out["type"] = [named(m) if isinstance(m, str) else m for m in union]
    return out


def _types_of(schema: Any, root: Any) -> set[str]:
    """The type names a draft-03 schema's values can have (through its local ``$ref``s), or
    every name where that is not known (no ``type``, ``any``, schemas in it, an outside ref)."""
    for _ in range(8):
        if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
            break
        schema = pointed(root, schema["$ref"])  # (NOWHERE: no dict, so every type)
    union = schema.get("type") if isinstance(schema, dict) and "$ref" not in schema else None
    union = [union] if isinstance(union, str) else union
    if not isinstance(union, list) or not all(isinstance(n, str) for n in union) or "any" in union:
        return set(_DRAFT3_TYPES)
    return set(union)


def _draft3_types(value: Any, old: tuple) -> list:
    """A draft-03 ``type`` / ``disallow`` value (a name, a schema or a list of them) as the list
    of schemas it is the union of."""
    members = value if isinstance(value, list) else [value]
    tokens = [old + (str(i),) for i in range(len(members))] if isinstance(value, list) else [old]
    return [_Moved(m, t) if isinstance(m, dict) else {} if m == "any" else {"type": m} for m, t in zip(members, tokens)]


def _draft3_type(value: Any, old: tuple, out: dict, origin: dict) -> None:
    """``type``: names as they are (``any``: no type), a list holding schemas as ``anyOf``."""
    names = value if isinstance(value, list) else [value]
    if "any" in names:
        out["x-ignored-type"] = value
        origin["x-ignored-type"] = "type"
    elif all(isinstance(n, str) for n in names):
        out["type"] = value
    else:
        out["anyOf"] = _draft3_types(value, old + ("type",))


def _draft3_format(value: str, out: dict, origin: dict, every: list) -> None:
    if value in _DRAFT3_FORMATS:
        out["format"] = _DRAFT3_FORMATS[value]
        return
    out["x-ignored-format"] = value
    origin["x-ignored-format"] = "format"
    if value in _DRAFT3_PATTERNS:
        every.append({"pattern": _DRAFT3_PATTERNS[value]})


def _rebase(schema: Any, moved: dict[tuple, tuple]) -> Any:
    """Every local ``$ref`` of ``schema`` pointed at where its target now is."""

    def fix(ref: str) -> str:
        if not (ref == "#" or ref.startswith("#/")):
            return ref
        tokens = tuple(ref[2:].split("/")) if ref != "#" else ()
        plain = tuple(unquote(t).replace("~1", "/").replace("~0", "~") for t in tokens)
        for n in range(len(plain), -1, -1):
            if plain[:n] in moved:
                target = moved[plain[:n]] + plain[n:]
                return "#" + "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in target)
        return ref

    def walk(node: Any, data: bool) -> Any:
        if isinstance(node, list):
            return node if data else [walk(v, False) for v in node]
        if not isinstance(node, dict) or data:
            return node
        out = {}
        for k, v in node.items():
            if k in ("$ref", "x-ignored-$ref") and isinstance(v, str):
                out[k] = fix(v)
            elif k.removeprefix("x-ignored-") in _MAPS and isinstance(v, dict):
                out[k] = {n: walk(s, False) for n, s in v.items()}
            else:
                out[k] = walk(v, k.removeprefix("x-ignored-") in _DATA)
        return out

    return walk(schema, False)

"""JSON Schema dialects: any draft's schema rewritten into the one the converter reads.

The converter (json_schema.py) reads draft 2020-12. A schema of another draft, named by
its ``$schema`` (draft-04, -06, -07, 2019-09), is first rewritten here into the 2020-12
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
  as ignored.

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
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

import jsonschema
import referencing.jsonschema

from treadle.constrained.json_schema_documents import embedded, missing_documents
from treadle.constrained.json_schema_parts import DYNAMIC_REFS, UnsupportedSchemaError

__all__ = ["ASSERTIONS", "DIALECTS", "dialect_of", "to_2020_12"]

_DIALECT_URI = re.compile(r"https?://json-schema\.org/(?:(draft-0[467])/schema|draft/(20(?:19-09|20-12))/schema)#?")
DIALECTS = ("draft-04", "draft-06", "draft-07", "2019-09", "2020-12")
_VALIDATORS = dict(zip(DIALECTS, (jsonschema.Draft4Validator, jsonschema.Draft6Validator, jsonschema.Draft7Validator,
                                  jsonschema.Draft201909Validator, jsonschema.Draft202012Validator)))
# The keywords each draft asserts or applies: jsonschema's validators, and the ones read
# inside them (then/else by if, minContains/maxContains by contains).
ASSERTIONS: dict[str, frozenset[str]] = {
    d: frozenset(v.VALIDATORS) | ({"then", "else"} if "if" in v.VALIDATORS else set())
    | ({"minContains", "maxContains"} if d in ("2019-09", "2020-12") else set())
    | ({"exclusiveMinimum", "exclusiveMaximum"} if d == "draft-04" else set())
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
    moved: dict[tuple, tuple] = {}  # original pointer tokens -> the new ones, for every node
    out = _node(schema, dialect, (), (), moved, "$")
    return _rebase(out, moved)


# how each draft names resources and places (referencing's, which jsonschema resolves with)
_SPECIFICATIONS = {"draft-04": referencing.jsonschema.DRAFT4, "draft-06": referencing.jsonschema.DRAFT6,
                   "draft-07": referencing.jsonschema.DRAFT7, "2019-09": referencing.jsonschema.DRAFT201909,
                   "2020-12": referencing.jsonschema.DRAFT202012, _PLAIN: referencing.jsonschema.DRAFT202012}
_SCHEMA_DATA = frozenset({"const", "enum", "default", "examples"})  # values that are data (no refs, no ids)
_IDENTIFIERS = ("$id", "$anchor")  # (and draft-04's "id"): annotations once every ref is a pointer


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
            elif (k in _IDENTIFIERS or k == "id" and dialect == "draft-04") and isinstance(v, str):
                out["x-ignored-" + k] = v
            elif k in _SCHEMA_DATA:
                out[k] = v
            else:
                out[k] = rewrite(v, base, k in _MAPS)
        return out

    return rewrite(schema, "", False)


def _node(node: Any, dialect: str, old: tuple, new: tuple, moved: dict, path: str) -> Any:
    """One subschema (or anything in a schema's place: a dict under an unknown keyword is
    rewritten as a schema too, in case a ``$ref`` points at it)."""
    if isinstance(node, list):
        moved[old] = new
        return [_node(v, dialect, old + (str(i),), new + (str(i),), moved, f"{path}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    moved[old] = new
    uri = node.get("$schema")
    if old and isinstance(uri, str) and dialect_of(node) not in (dialect, _PLAIN) and dialect != _PLAIN:
        raise UnsupportedSchemaError(f"json_schema: keyword '$schema' at {path}: a subschema of another draft "
                                     "than the root's is not supported")
    known = ASSERTIONS["2020-12"] if dialect == _PLAIN else ASSERTIONS[dialect]
    legacy_ref = dialect in ("draft-04", "draft-06", "draft-07") and "$ref" in node
    out: dict[str, Any] = {}

    def put(key: str, value: Any, old_key: str, kind: str = "schema") -> None:
        here_old, here_new = old + (old_key,), new + (key,)
        if kind == "data":
            moved[here_old] = here_new
            out[key] = value
        elif kind == "map" and isinstance(value, dict):
            moved[here_old] = here_new
            out[key] = {n: _node(v, dialect, here_old + (n,), here_new + (n,), moved, f"{path}.{old_key}.{n}")
                        for n, v in value.items()}
        else:
            out[key] = _node(value, dialect, here_old, here_new, moved, f"{path}.{old_key}")

    old_items = dialect in ("draft-04", "draft-06", "draft-07", "2019-09", _PLAIN) and isinstance(node.get("items"), list)
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
        if key == "id" and isinstance(value, str) and dialect == "draft-04" and "$id" not in node:
            put("$id", value, key, "data")
        elif key == "items" and old_items:
            put("prefixItems", value, key)
        elif key == "additionalItems" and dialect != "2020-12":
            # after list items it is 2020-12's items; without them it has no effect
            put("items" if old_items else "x-ignored-" + key, value, key)
        elif key == "dependencies" and dialect in ("draft-04", "draft-06", "draft-07", _PLAIN) and isinstance(value, dict):
            moved[old + (key,)] = new + ("dependentSchemas",)
            lists = {n: v for n, v in value.items() if isinstance(v, list)}
            schemas = {n: v for n, v in value.items() if not isinstance(v, list)}
            if lists:
                out["dependentRequired"] = lists
            if schemas:
                out["dependentSchemas"] = {
                    n: _node(v, dialect, old + (key, n), new + ("dependentSchemas", n), moved, f"{path}.dependencies.{n}")
                    for n, v in schemas.items()}
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool) and dialect in ("draft-04", _PLAIN):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            if value and bound in node:
                out[key] = node[bound]  # set below; "minimum" itself is dropped there
            moved[old + (key,)] = new + ("x-ignored-" + key,)
        elif key in ("minimum", "maximum") and node.get("exclusive" + key[:3].title() + key[3:]) is True \
                and dialect in ("draft-04", _PLAIN):
            moved[old + (key,)] = new + ("exclusive" + key[:3].title() + key[3:],)
        elif key not in known and key in _CONVERTER and dialect != _PLAIN:
            put("x-ignored-" + key, value, key, kind)  # not an assertion of this draft
        else:
            put(key, value, key, kind)
    return out


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

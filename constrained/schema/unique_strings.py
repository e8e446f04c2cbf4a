"""``uniqueItems`` over free strings (``set[str]``): enforced while decoding, not by the regex.

No regular language holds exactly the arrays of distinct unbounded strings, so the regex alone
could write such an array only narrowed (at most one item, or items of distinct lengths). A
JSON-schema grammar can instead have its matcher check the items as they are written
(constrained/decode/unique_items.py): every array of its output keeps the strings it has had
as direct items, and the mask leaves out each token that would close a string item equal to
an earlier one (compared as decoded JSON values, ``"a"`` and ``"\\u0061"`` alike). The regex
then writes the array as a plain list of strings.

The check applies to every array of the output, not only to those the schema says are
unique (text alone does not tell which subschema an array came from). That is sound for the
others (fewer arrays are written, each still valid) and never leaves the matcher without a
token as long as every string item of every array can always be continued into a string no
earlier item holds: a free string (no ``pattern``, ``format``, ``maxLength``, listed values)
can, by one more character. ``unique_strings_checked`` says whether a schema is of that kind:
it has an array of unique free strings, and every schema that stands for array items
anywhere in it (``items``, ``prefixItems``, ``contains``, ...) either holds no string or
holds free strings only. Where not, the regex narrows as before.

The grammar's matcher and the translator ask the same question of the same schema text, so
they agree: the translator writes plain lists only where the matcher checks them.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from treadle.constrained.schema.json_schema_dialects import to_2020_12
from treadle.constrained.schema.json_schema_parts import static_dynamic_refs

__all__ = ["free_string_items", "unique_strings_checked"]

_DATA = frozenset({"const", "enum", "default", "examples"})  # their values are data, never schemas
_ITEM_ONE = ("items", "additionalItems", "contains", "unevaluatedItems")  # a schema of array items
_ITEM_MANY = ("prefixItems",)  # a list of them
# keywords whose subschemas the translator narrows against each other (a oneOf branch written where
# the others fail, a not's complement, an if's else): item schemas below them may be narrowed
_NARROWING = frozenset({"oneOf", "not", "if", "then", "else", "dependentSchemas"})
# keywords that restrict which strings a schema holds
_STRING_LIMITS = ("pattern", "format", "maxLength", "enum", "const", "not", "if", "then", "else", "oneOf",
                  "$dynamicRef", "$recursiveRef", "contentSchema")
MAX_FREE_MIN_LENGTH = 64  # a free string's minLength (its regex stays unbounded: {n,})
_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})


class _Unknown(Exception):
    """A ref this analysis does not follow: the check stays off."""


def _resolve(root: Any, ref: Any) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise _Unknown(ref)
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise _Unknown(ref)  # an anchor: to_2020_12 writes refs as pointers, so this is left unread
    node = root
    for token in ref[2:].split("/"):
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise _Unknown(ref)
    return node


def _may_be_string(root: Any, schema: Any, seen: frozenset) -> bool:
    """Over-approximation: whether ``schema`` may hold a string."""
    if not isinstance(schema, dict):
        return schema is not False
    t = schema.get("type")
    if isinstance(t, str) and t in _TYPES and t != "string":
        return False
    if isinstance(t, list) and all(isinstance(x, str) and x in _TYPES for x in t) and "string" not in t:
        return False
    for key in ("const",):
        if key in schema and not isinstance(schema[key], str):
            return False
    if isinstance(schema.get("enum"), list) and not any(isinstance(v, str) for v in schema["enum"]):
        return False
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref not in seen and not _may_be_string(root, _resolve(root, ref), seen | {ref}):
            return False
    if isinstance(schema.get("allOf"), list) and any(not _may_be_string(root, s, seen) for s in schema["allOf"]):
        return False
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and not any(_may_be_string(root, s, seen) for s in schema[key]):
            return False
    return True


def _free(root: Any, schema: Any, seen: frozenset) -> bool:
    """Whether every string ``schema`` holds is free: no limit but a small ``minLength``, so that
    any start of one can be continued by a character (through refs, ``allOf`` and ``anyOf``)."""
    if not isinstance(schema, dict) or not _may_be_string(root, schema, seen):
        return True
    if any(key in schema for key in _STRING_LIMITS):
        return False
    n = schema.get("minLength", 0)
    if not isinstance(n, (int, float)) or isinstance(n, bool) or n > MAX_FREE_MIN_LENGTH:
        return False
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref not in seen and not _free(root, _resolve(root, ref), seen | {ref}):
            return False
    for key in ("allOf", "anyOf"):
        subs = schema.get(key, [])
        if not isinstance(subs, list) or not all(_free(root, s, seen) for s in subs):
            return False
    return True


def free_string_items(root: Any, items: Any) -> bool:
    """Whether ``items`` (a normalized schema's item schema) holds strings only, all free: then
    string uniqueness is item uniqueness, and the matcher can always write a new one."""
    try:
        node, hops = items, 0
        while isinstance(node, dict) and "$ref" in node and len(node) == 1 and hops < 16:
            node, hops = _resolve(root, node["$ref"]), hops + 1
        if not isinstance(node, dict):
            return False
        t = node.get("type")
        if t != "string" and t != ["string"]:
            return False
        return _free(root, items, frozenset())
    except (_Unknown, RecursionError):
        return False


def _walk(root: Any, node: Any, narrowed: bool, found: list[bool], followed: set[str]) -> None:
    """Check every schema under ``node`` that stands for array items; ``found[0]`` becomes True
    at an array of unique free strings. Raises ``_Unknown`` where the check cannot be on. The
    whole document is walked once as it stands; below a narrowing keyword, refs are followed
    too (``followed``: those walked so), since what they point to is narrowed there."""
    if isinstance(node, list):
        for x in node:
            _walk(root, x, narrowed, found, followed)
        return
    if not isinstance(node, dict):
        return
    if "$dynamicRef" in node or "$recursiveRef" in node or ("$ref" in node and not (
            isinstance(node["$ref"], str) and node["$ref"].startswith("#"))):
        raise _Unknown("ref")
    if "$ref" in node:
        target = _resolve(root, node["$ref"])  # an unresolvable one: off
        if narrowed and node["$ref"] not in followed:
            followed.add(node["$ref"])
            _walk(root, target, True, found, followed)
    items = [node[k] for k in _ITEM_ONE if k in node]
    items += [x for k in _ITEM_MANY if isinstance(node.get(k), list) for x in node[k]]
    items += [x for x in node["items"]] if isinstance(node.get("items"), list) else []
    for sub in items:
        if isinstance(sub, dict) and _may_be_string(root, sub, frozenset()):
            if narrowed or not _free(root, sub, frozenset()):
                raise _Unknown("items")
    if node.get("uniqueItems") is True and "items" in node and free_string_items(root, node["items"]):
        found[0] = True
    for key, value in node.items():
        if key in _DATA:
            continue
        _walk(root, value, narrowed or key in _NARROWING, found, followed)


def unique_strings_checked(schema: Any) -> bool:
    """Whether a JSON schema (as a grammar spec holds it: a dict, a bool or its JSON text) is
    compiled with unique string items checked by its matcher (see the module docstring)."""
    try:
        if isinstance(schema, str):
            schema = json.loads(schema)
        if not isinstance(schema, dict):
            return False
        root = to_2020_12(static_dynamic_refs(schema))
        found = [False]
        _walk(root, root, False, found, set())
        return found[0]
    except (_Unknown, ValueError, TypeError, RecursionError):
        return False

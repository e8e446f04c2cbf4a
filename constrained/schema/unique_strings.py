"""``uniqueItems`` over free strings (``set[str]``): enforced while decoding, not by the regex.

No regular language holds exactly the arrays of distinct unbounded strings, so the regex alone
could write such an array only narrowed (at most one item, or items of distinct lengths). A
JSON-schema grammar can instead have its matcher check the items as they are written
(constrained/decode/unique_items.py): each checked array of its output keeps the strings it
has had as direct items, and the mask leaves out each token that would close a string item
equal to an earlier one (compared as decoded JSON values, ``"a"`` and ``"\\u0061"`` alike). The regex
then writes the array as a plain list of strings.

The text alone does not say which subschema an array came from, so the matcher tells arrays
apart by their *slot*: the key of the object member the array is the value of (``ROOT`` for
the whole output, ``ITEM`` for an item of another array). ``unique_string_slots`` walks the
schema (refs and combinators keep the slot; ``properties`` name it; ``additionalProperties`` /
``patternProperties`` give ``ANY_KEY``) and gives the slots where a ``uniqueItems`` stands;
where one stands at ``ANY_KEY`` (a map of unique lists, the metaschemas' ``dependencies``), the
arrays under every key are checked. Every array at those slots is checked: the unique ones
exactly, the others (another branch under the same key) written fewer. That never leaves the
matcher without a token as long as every string item at those slots can always be continued
into a string no earlier item holds:
a free string (no ``pattern``, ``format``, ``maxLength``, listed values; ``minLength`` up to
64) can, by one more character. So the check is on (and the regex writes plain lists) only
where an array of unique free strings stands, and every item schema at those slots (or at
``ANY_KEY``, whose keys may spell any name) holds free strings or none, or stands beside a
``uniqueItems`` itself (listed values the regex writes distinct: the check finds nothing to
leave out there), and none below a ``oneOf`` / ``not`` / ``if`` (whose branches the translator
narrows against each other), and every ref is local. Elsewhere the regex narrows as before
(``set[str]`` beside a ``list[Literal[...]]`` under the same key: at most one item).

Whatever array the translator writes as a plain list has a ``uniqueItems`` from some part the
walk reaches at that array's slot (refs, ``allOf`` merges and the other combinators keep the
slot), so it is checked. The grammar's matcher and the translator take the verdict from the
same schema text.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from treadle.constrained.schema.json_schema_dialects import to_2020_12
from treadle.constrained.schema.json_schema_parts import json_type, static_dynamic_refs

__all__ = ["ANY_KEY", "ITEM", "ROOT", "free_string_items", "unique_string_slots", "unique_strings_checked"]

_DATA = frozenset({"const", "enum", "default", "examples"})  # their values are data, never schemas
_ITEM_ONE = ("items", "additionalItems", "contains", "unevaluatedItems")  # a schema of array items
_ITEM_MANY = ("prefixItems",)  # a list of them
# keywords whose subschemas the translator narrows against each other (a oneOf branch written where
# the others fail, a not's complement, an if's else): item schemas below them may be narrowed
_NARROWING = frozenset({"oneOf", "not", "if", "then", "else", "dependentSchemas"})
# keywords that restrict which strings a schema holds
_STRING_LIMITS = ("pattern", "format", "maxLength", "enum", "const", "not", "if", "then", "else",
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


_ALL = frozenset({"null", "boolean", "object", "array", "number", "string"})


def _types(root: Any, schema: Any, seen: frozenset = frozenset()) -> frozenset:
    """Over-approximation: the JSON types ``schema`` may hold (integer as number)."""
    if not isinstance(schema, dict):
        return _ALL if schema is not False else frozenset()
    out = _ALL
    t = schema.get("type")
    names = [t] if isinstance(t, str) else t if isinstance(t, list) else None
    if names is not None and all(isinstance(x, str) and x in _TYPES for x in names):
        out &= frozenset("number" if x == "integer" else x for x in names)
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        out &= frozenset(json_type(v) for v in values)
    if "$ref" in schema and schema["$ref"] not in seen:
        out &= _types(root, _resolve(root, schema["$ref"]), seen | {schema["$ref"]})
    for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        out &= _types(root, sub, seen)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            out &= frozenset().union(*(_types(root, sub, seen) for sub in schema[key]))
    return out


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


def _disjoint(root: Any, branches: list) -> bool:
    """Whether no two of a ``oneOf``'s branches share a type: each is written as it is."""
    types = [_types(root, b) for b in branches]
    return all(not (types[i] & types[j]) for i in range(len(types)) for j in range(i))


def _free(root: Any, schema: Any, seen: frozenset, most: int = MAX_FREE_MIN_LENGTH) -> bool:
    """Whether every string ``schema`` holds is free: no limit but a ``minLength`` up to ``most``,
    so that any start of one can be continued by a character (through refs, ``allOf``, ``anyOf``
    and a ``oneOf`` of disjoint types)."""
    if not isinstance(schema, dict) or not _may_be_string(root, schema, seen):
        return True
    if any(key in schema for key in _STRING_LIMITS) or any(key.startswith("__") for key in schema):
        return False  # (the translator's own keywords, __not_pattern__ ..., in a schema it merged)
    n = schema.get("minLength", 0)
    if not isinstance(n, (int, float)) or isinstance(n, bool) or n > most:
        return False
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref not in seen and not _free(root, _resolve(root, ref), seen | {ref}, most):
            return False
    if "oneOf" in schema and not (isinstance(schema["oneOf"], list) and _disjoint(root, schema["oneOf"])):
        return False
    for key in ("allOf", "anyOf", "oneOf"):
        subs = schema.get(key, [])
        if not isinstance(subs, list) or not all(_free(root, s, seen, most) for s in subs):
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


ROOT, ITEM, ANY_KEY = 0, 1, 2  # slots besides property names: the whole output, an array item, an undeclared key


class _Walk:
    """Where each schema of the document stands: its *slot*, the key of the object member it is
    the value of (``ROOT`` for the output, ``ITEM`` for an array item, ``ANY_KEY`` for a member
    no property declares), through refs and combinators, which keep the slot. Collects the slots
    of ``uniqueItems`` and the item schemas at each slot. Raises ``_Unknown`` where the check
    cannot be on."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.unique: set = set()  # slots where a schema with uniqueItems stands
        self.found = False  # an array of unique free strings
        # (slot, item schema, below a narrowing keyword, beside a uniqueItems)
        self.items: list[tuple[Any, Any, bool, bool]] = []
        self._done: set[tuple[int, Any, bool]] = set()

    def walk(self, node: Any, slot: Any, narrowed: bool) -> None:
        if not isinstance(node, dict) or (id(node), slot, narrowed) in self._done:
            return
        self._done.add((id(node), slot, narrowed))
        if "$dynamicRef" in node or "$recursiveRef" in node:
            raise _Unknown("dynamic ref")
        if "$ref" in node:
            self.walk(_resolve(self.root, node["$ref"]), slot, narrowed)
        if node.get("uniqueItems") is True:
            self.unique.add(slot)
            if "items" in node and free_string_items(self.root, node["items"]):
                self.found = True
        subs = [node[k] for k in _ITEM_ONE if k in node and not isinstance(node[k], list)]
        subs += [x for k in (*_ITEM_MANY, "items") if isinstance(node.get(k), list) for x in node[k]]
        unique = node.get("uniqueItems") is True
        for sub in subs:
            self.items.append((slot, sub, narrowed, unique))
            self.walk(sub, ITEM, narrowed)
        for key in ("allOf", "anyOf"):
            for sub in node.get(key, []) if isinstance(node.get(key), list) else []:
                self.walk(sub, slot, narrowed)
        if isinstance(node.get("oneOf"), list):
            # a branch of types no other branch takes is written as it is (string or list of strings);
            # others may be narrowed against each other
            types = [_types(self.root, sub) for sub in node["oneOf"]]
            for i, sub in enumerate(node["oneOf"]):
                others = frozenset().union(*(t for j, t in enumerate(types) if j != i))
                self.walk(sub, slot, narrowed or bool(types[i] & others))
        for key in ("not", "if", "then", "else"):
            self.walk(node.get(key), slot, True)
        for sub in (node.get("dependentSchemas") or {}).values() if isinstance(node.get("dependentSchemas"), dict) \
                else ():
            self.walk(sub, slot, True)
        if isinstance(node.get("properties"), dict):
            for name, sub in node["properties"].items():
                self.walk(sub, name, narrowed)
        for sub in (node.get("patternProperties") or {}).values() if isinstance(node.get("patternProperties"), dict) \
                else ():
            self.walk(sub, ANY_KEY, narrowed)
        for key in ("additionalProperties", "unevaluatedProperties"):
            self.walk(node.get(key), ANY_KEY, narrowed)


def unique_string_slots(schema: Any) -> frozenset | None:
    """The slots (property names, ``ROOT``, ``ITEM``) whose arrays a JSON schema's matcher
    checks for unique string items, None for no check (see the module docstring): the slots
    where a ``uniqueItems`` stands, when one of them is an array of unique free strings and every
    item schema at those slots holds free strings or none."""
    try:
        if isinstance(schema, str):
            if "uniqueItems" not in schema:
                return None
            schema = json.loads(schema)
        if not isinstance(schema, dict) or "uniqueItems" not in json.dumps(schema):
            return None
        root = to_2020_12(static_dynamic_refs(schema))
        w = _Walk(root)
        w.walk(root, ROOT, False)
        if not w.found:
            return None
        names = any(isinstance(x, str) for x in w.unique)

        def checked(slot: Any) -> bool:  # the arrays the matcher checks (unique_items.feed_items)
            if slot in w.unique:
                return True
            if slot == ANY_KEY:  # an undeclared key may spell a checked name
                return names
            return ANY_KEY in w.unique and slot not in (ROOT, ITEM)  # every key is checked

        # the string-holding item schemas at each slot, as written: a narrowing keyword narrows
        # an item schema against another one at the same place, so where a slot has only one,
        # it is written as it is wherever it stands
        kinds: dict[Any, set[str]] = {}
        for slot, sub, _, _ in w.items:
            if _may_be_string(root, sub, frozenset()):
                kinds.setdefault(slot, set()).add(json.dumps(sub, sort_keys=True))
        for slot, sub, narrowed, unique in w.items:
            if not checked(slot) or not _may_be_string(root, sub, frozenset()):
                continue
            if narrowed and (len(kinds[slot] | kinds.get(ANY_KEY, set())) > 1 or not _free(root, sub, frozenset(), 0)):
                return None  # (a narrowed minLength may be written as the lengths below it)
            # items beside a uniqueItems (outside a narrowing keyword) are written distinct whatever
            # they are (listed values by the regex; free strings by the check): nothing to leave out
            if (narrowed or not unique) and not _free(root, sub, frozenset()):
                return None
        return frozenset(w.unique)
    except (_Unknown, ValueError, TypeError, RecursionError, AttributeError):
        return None


def unique_strings_checked(schema: Any) -> bool:
    """Whether a JSON schema (as a grammar spec holds it: a dict, a bool or its JSON text) is
    compiled with unique string items checked by its matcher (see the module docstring)."""
    return unique_string_slots(schema) is not None

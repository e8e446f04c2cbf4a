"""Keywords that couple parts of a value, rewritten into ones the converter builds.

Each rewrite gives a schema whose every instance is valid under the original (it may admit
fewer: that is how ``if`` / ``else`` and ``not`` stay sound where the exact complement of a
schema has no regex):

- ``dependentRequired`` {a: [b, c]}: "a absent, or b and c present", an ``anyOf`` of
  ``{"properties": {"a": false}}`` and ``{"required": [b, c]}``; ``dependentSchemas`` {a: S}:
  "a absent, or S";
- ``if`` / ``then`` / ``else``: ``anyOf`` of "if and then" and, for each schema of
  ``complement(if)``, "it and else";
- ``not`` S: ``anyOf`` of ``complement(S)``;
  (``not: {pattern: P}``: strings matching none of P, treadle's ``__not_pattern__``, which the
  converter writes as the string's automaton minus P's widest reading);
- ``contains`` C with ``minContains`` m and ``maxContains`` M: the first m items after
  ``prefixItems`` (at least one) also satisfy C, or (m = 1) one item of ``prefixItems`` does, and
  the array has at most M items (so no more than M can match); or (``contains_past_cap``, no
  ``prefixItems``) longer, the m items that satisfy C followed by items that fail it.

``complement(S)`` lists schemas none of whose instances is valid under S: per assertion of S,
one that breaks it (a value of another type, a number past a bound, an object lacking a
required property or holding a listed value outside a property's listed ones...). The union
is a subset of "not S", exact for the simple cases (types, bounds, required) and empty where
nothing breaks S in a way a schema can say.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import interegular

from treadle.constrained.regex import fsm_crawl
from treadle.constrained.schema.json_schema_parts import ALL_TYPES, FAMILIES, UnsupportedSchemaError, schema_types
from treadle.constrained.schema.pattern_prefixes import patterns_apart
from treadle.constrained.regex.regex_ecma import key_pattern_bodies

__all__ = ["Apart", "canonical", "closed_forbids", "complement", "conditional_branches", "contains_as_prefix",
           "dependencies_as_anyof", "repeated"]

# each dependency keeps its exact "absent or present-with" choice up to this many; past it a
# dependency on an optional property makes its dependents required (narrower, still sound)
DEPENDENCY_CHOICES = 4
# contains with prefixItems: the prefix positions tried for the one contained item (each is a
# rewrite of the array written beside the others)
PREFIX_CONTAINS = 8
_COMPLEMENT_DEPTH = 4  # nesting of `not` / properties / refs that complement follows
_BOUNDS = {  # keyword -> (its complement's keyword, type)
    "minimum": ("exclusiveMaximum", "number"), "maximum": ("exclusiveMinimum", "number"),
    "exclusiveMinimum": ("maximum", "number"), "exclusiveMaximum": ("minimum", "number"),
}
_COUNTS = {  # keyword -> (its complement's keyword, type, +-1)
    "minLength": ("maxLength", "string", -1), "maxLength": ("minLength", "string", 1),
    "minItems": ("maxItems", "array", -1), "maxItems": ("minItems", "array", 1),
    "minProperties": ("maxProperties", "object", -1), "maxProperties": ("minProperties", "object", 1),
}


def dependencies_as_anyof(schema: dict, path: str) -> tuple[dict, list]:
    """(``schema`` without dependentRequired / dependentSchemas, the allOf parts that say them)."""
    rest = {k: v for k, v in schema.items() if k not in ("dependentRequired", "dependentSchemas")}
    required = list(rest.get("required", [])) if isinstance(rest.get("required", []), list) else []
    parts: list[dict] = []
    reqs = schema.get("dependentRequired", {})
    subs = schema.get("dependentSchemas", {})
    for key, value in (("dependentRequired", reqs), ("dependentSchemas", subs)):
        if not isinstance(value, dict):
            raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} must be an object")
    for name, names in reqs.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UnsupportedSchemaError(f"json_schema: keyword 'dependentRequired' at {path}.{name} must be a list "
                                         "of property names")
        if not names:
            continue
        if name in required:
            required += [n for n in names if n not in required]
        elif len(parts) < DEPENDENCY_CHOICES:
            parts.append({"anyOf": [{"properties": {name: False}}, {"required": names}]})
        else:
            required += [n for n in names if n not in required]
    for name, sub in subs.items():
        if sub is True or sub == {}:
            continue
        if name in required:
            parts.append(sub if isinstance(sub, dict) else {"not": {}})
        elif len(parts) < DEPENDENCY_CHOICES:
            parts.append({"anyOf": [{"properties": {name: False}}, sub]})
        else:
            parts.append({"properties": {name: False}})  # narrower: the property is left out
    given = rest.get("required", [])  # (draft-03's boolean: a dependency's names replace it)
    if required != (list(given) if isinstance(given, list) else []):
        rest["required"] = required
    return rest, parts


def conditional_branches(schema: dict, resolve: Callable[[str], Any]) -> list[Any] | None:
    """``if`` / ``then`` / ``else`` as the schemas of an anyOf (see the module docstring), or
    None when there is no ``if`` or it is alone (then it never decides validity)."""
    cond = schema.get("if")
    if "if" not in schema or ("then" not in schema and "else" not in schema):
        return None
    then, other = schema.get("then", True), schema.get("else", True)
    out = [{"allOf": [cond, then]}]
    out += [{"allOf": [c, other]} for c in complement(cond, resolve)]
    return out


def complement(schema: Any, resolve: Callable[[str], Any], depth: int = 0) -> list[Any]:
    """Schemas whose instances are all invalid under ``schema`` (see the module docstring)."""
    if schema is True or depth > _COMPLEMENT_DEPTH:
        return []
    if schema is False:
        return [True]
    if not isinstance(schema, dict):
        return []
    out: list[Any] = []
    if "$ref" in schema and isinstance(schema["$ref"], str):
        try:
            out += complement(resolve(schema["$ref"]), resolve, depth + 1)
        except UnsupportedSchemaError:
            pass
    types = _types(schema.get("type"))
    if types is not None:
        others = sorted(ALL_TYPES - types - ({"number"} if "integer" in types else set()))
        if others:
            out.append({"type": others})
    for key, value in schema.items():
        if key in _BOUNDS and isinstance(value, (int, float)) and not isinstance(value, bool):
            other, t = _BOUNDS[key]
            out.append({"type": t, other: value})
        elif key in _COUNTS and isinstance(value, int) and not isinstance(value, bool):
            other, t, step = _COUNTS[key]
            if value + step >= 0:
                out.append({"type": t, other: value + step})
    required = schema.get("required")
    if isinstance(required, list):
        out += [{"type": "object", "properties": {name: False}} for name in required if isinstance(name, str)]
    props = schema.get("properties")
    if isinstance(props, dict):
        for name, sub in props.items():
            broken = complement(sub, resolve, depth + 1)
            if broken:
                value = broken[0] if len(broken) == 1 else {"anyOf": broken}
                out.append({"type": "object", "required": [name], "properties": {name: value}})
    contains = schema.get("contains")
    least = schema.get("minContains", 1)
    if "contains" in schema and isinstance(contains, (dict, bool)) and not (isinstance(least, int) and least <= 0):
        # (minContains 0 is met by every array) arrays none of whose items is valid under it
        out.append({"type": "array", "items": {"not": contains}})
    items = schema.get("items")
    if isinstance(items, (dict, bool)) and items is not True and "prefixItems" not in schema:
        # (beside prefixItems it says only of the later items) arrays with an item invalid under it
        out.append({"type": "array", "contains": {"not": items}})
    if isinstance(schema.get("pattern"), str):  # strings it does not match (json_schema.py writes them)
        out.append({"type": "string", "__not_pattern__": [schema["pattern"]]})
    if "const" in schema or "enum" in schema:
        listed = [schema["const"]] if "const" in schema else schema["enum"]
        if isinstance(listed, list) and all(v is None or isinstance(v, (bool, int, float, str)) for v in listed):
            out.append({"__not_in__": listed})  # any value but these (scalars: json_schema.py subtracts them)
    if "not" in schema:
        out.append(schema["not"])
    for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        out += complement(sub, resolve, depth + 1)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if key == "anyOf" and isinstance(branches, list) and branches:
            each = [complement(b, resolve, depth + 1) for b in branches]
            if all(each):
                out.append({"allOf": [c[0] if len(c) == 1 else {"anyOf": c} for c in each]})
    return out


# the keywords ``complement`` breaks each way they can fail (``minContains`` only as 1, the default)
_EXACT_KEYS = frozenset({"$ref", "type", *_BOUNDS, *_COUNTS, "required", "properties", "contains", "minContains",
                         "items", "pattern", "const", "enum", "not", "allOf", "anyOf"})


def complement_exact(schema: Any, resolve: Callable[[str], Any], annotations: Any, depth: int = 0) -> bool:
    """Whether ``complement(schema)`` lists every way to fail ``schema``: each of its assertions
    (keywords not in ``annotations``) has its breakers there. Only then do rewrites of "not
    schema" (``not``, an ``if``'s ``else`` side) that all have no output prove that no value
    is left: ``{"type": "integer", "not": {"type": "integer", "multipleOf": 3}}`` has values
    (1, 2, 4...), though every schema complement lists is a non-integer."""
    if schema is True or schema is False:
        return True
    if not isinstance(schema, dict) or depth > _COMPLEMENT_DEPTH:
        return False
    if any(key not in _EXACT_KEYS and key not in annotations for key in schema):
        return False
    types = _types(schema.get("type"))
    if types is not None and "integer" in types and "number" not in types:
        return False  # (the numbers that are no integer are not among its breakers)
    numbers = [schema[k] for k in (*_BOUNDS, *_COUNTS) if k in schema]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
        return False
    if "contains" in schema and schema.get("minContains", 1) != 1 and schema.get("minContains") != 0:
        return False
    if "const" in schema or "enum" in schema:
        listed = [schema["const"]] if "const" in schema else schema["enum"]
        if not (isinstance(listed, list) and all(v is None or isinstance(v, (bool, int, float, str)) for v in listed)):
            return False
    subs: list[Any] = []
    if "$ref" in schema:
        try:
            subs.append(resolve(schema["$ref"]))
        except UnsupportedSchemaError:
            return False
    if isinstance(schema.get("properties"), dict):
        subs += list(schema["properties"].values())
    for key in ("allOf", "anyOf"):
        if key in schema:
            if not isinstance(schema[key], list):
                return False
            subs += schema[key]
    return all(complement_exact(sub, resolve, annotations, depth + 1) for sub in subs)


def _types(declared: Any) -> set[str] | None:
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    types = set(names)
    if "number" in types:
        types |= {"integer"}
    return types & (ALL_TYPES | {"integer"})


MAX_CONTAINS = 256  # contains_as_prefix writes minContains items out: at most this many (as minItems)


def contains_as_prefix(schema: dict, path: str) -> tuple[list[dict], str | None]:
    """``contains`` (with ``minContains`` / ``maxContains``) said by ``prefixItems`` and
    ``maxItems``, as rewrites any of which may be written (each a subset of the arrays allowed):
    the first items after the schema's own ``prefixItems`` also satisfy ``contains`` (and
    ``items``); and, where one contained item is needed (``minContains`` 1, the default), each
    item of ``prefixItems`` that may also satisfy it, the array at least that long (``[1, 2]``
    under ``prefixItems: [{const: 1}, {const: 2}], items: false, contains: {const: 2}``, where
    no item after the prefix can be written). With ``maxContains`` the array stops there (however
    many of its items match, no array is longer), so a prefix item past it is not tried.

    Returns the rewrites and, where some way to hold the items was not tried, the refusal to
    raise if none of the rewrites has an output (None: they say every way, and with none the
    schema has no output treadle writes). Raises that refusal at once when there is no rewrite."""
    if "unevaluatedItems" in schema or schema.get("uniqueItems") is True:
        raise UnsupportedSchemaError(f"json_schema: keyword 'contains' at {path} together with "
                                     "unevaluatedItems or uniqueItems is not supported")
    need = schema.get("minContains", 1)
    cap = schema.get("maxContains")
    for key, value in (("minContains", need), ("maxContains", cap)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} must be a non-negative integer")
    if need > MAX_CONTAINS:  # each is written out as an item (a minContains of 10**30 overflowed)
        raise UnsupportedSchemaError(f"json_schema: keyword 'minContains' at {path}: more than {MAX_CONTAINS:,} "
                                     "items are not supported")
    rest = {k: v for k, v in schema.items() if k not in ("contains", "minContains", "maxContains")}
    if cap is not None:
        rest["maxItems"] = min(rest.get("maxItems", cap), cap)
    items = rest.get("items", True)
    prefix = rest.get("prefixItems", [])
    if not isinstance(prefix, list):
        raise UnsupportedSchemaError(f"json_schema: keyword 'prefixItems' at {path} must be a list")
    if need == 0:
        return [rest], None
    out = []
    tried = need == 1 and len(prefix) <= PREFIX_CONTAINS and (cap is None or cap >= len(prefix))
    if need == 1:  # the one contained item among the prefix's
        for i, item in enumerate(prefix[:PREFIX_CONTAINS]):
            if cap is not None and i + 1 > cap:
                break  # (the array stops at maxContains, before this item)
            at = dict(rest, prefixItems=[*prefix[:i], {"allOf": [item, schema["contains"]]}, *prefix[i + 1:]])
            at["minItems"] = max(rest.get("minItems", 0), i + 1)
            out.append(at)
    least = len(prefix) + need  # the items written: the prefix's, then the contained ones
    top = rest.get("maxItems")
    if not (prefix and (items is False or isinstance(top, (int, float)) and not isinstance(top, bool)
                        and least > top)):
        after = dict(rest, prefixItems=list(prefix) + [{"allOf": [items, schema["contains"]]}] * need)
        after["minItems"] = max(rest.get("minItems", 0), least)
        return [*out, after], None
    first = min(len(prefix), PREFIX_CONTAINS, len(prefix) if cap is None else cap)
    refusal = (f"json_schema: keyword 'contains' at {path} together with prefixItems is not supported where no "
               f"item after the prefix can hold it (items false, or maxItems or maxContains below the {len(prefix)} "
               f"prefix items + minContains {need}) and " + (
                   "minContains is above 1" if need != 1 else
                   f"none of the prefix's first {first} items can (the others are not tried)"))
    if not out:
        raise UnsupportedSchemaError(refusal)
    return out, None if tried else refusal


def contains_past_cap(schema: dict) -> tuple[dict | None, bool]:
    """The arrays ``contains_as_prefix`` leaves out, where ``maxContains`` M caps its arrays'
    length and ``maxItems`` allows longer ones: (a rewrite writing them, or None where it cannot
    be said; whether M caps at all). The rewrite: no ``prefixItems`` of the schema's own, the
    ``minContains`` m items that satisfy C first, then items that fail C (``{"not": C}``, which
    the converter writes where it can), so exactly m match (m <= M). GIFTS-like arrays: at most
    one gift among 2 to 4 items was read as no array at all (minItems above the cap)."""
    cap = schema.get("maxContains")
    top = schema.get("maxItems")
    if cap is None or isinstance(top, (int, float)) and not isinstance(top, bool) and top <= cap:
        return None, False
    need = schema.get("minContains", 1)
    if schema.get("prefixItems") or need > cap:  # (prefix items may match C too; m > M has no array)
        return None, True
    rest = {k: v for k, v in schema.items() if k not in ("contains", "minContains", "maxContains")}
    items = rest.get("items", True)
    past = dict(rest, prefixItems=[{"allOf": [items, schema["contains"]]}] * need,
                items={"allOf": [items, {"not": schema["contains"]}]})
    past["minItems"] = max(rest.get("minItems", 0), need + 1)  # (up to need: the capped rewrites')
    return past, True


# ---------------------------------------------------------------- oneOf: branches told apart
def canonical(branch: Any, resolve: Callable[[str], Any], annotations: Any) -> str:
    """A text two schemas share only when they are the same assertions: pure ``$ref``s (nothing
    beside but annotations) followed, the top level's annotations dropped, keys sorted. Equal
    texts are equivalent schemas (different texts may be too: only a proof is missed)."""
    node = branch
    for _ in range(16):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)
                and all(k == "$ref" or k in annotations for k in node)):
            break
        try:
            node = resolve(node["$ref"])
        except UnsupportedSchemaError:
            return json.dumps(branch, sort_keys=True, default=str)
    if isinstance(node, dict):
        node = {k: v for k, v in node.items() if k not in annotations}
        if not node:
            node = True
    return json.dumps(node, sort_keys=True, default=str)


def repeated(branches: list, resolve: Callable[[str], Any], annotations: Any) -> set[int]:
    """The oneOf branches whose schema (``canonical``) stands there more than once: a value valid
    under one is valid under its copy too, so no value of the oneOf is valid under any of them."""
    keys = [canonical(b, resolve, annotations) for b in branches]
    seen: dict[str, int] = {}
    for k in keys:
        seen[k] = seen.get(k, 0) + 1
    return {i for i, k in enumerate(keys) if seen[k] > 1}


_APART_DEPTH = 6  # nesting of property values / branches / refs the proofs follow
_APART_STEPS = 4000  # proofs tried for one pair of branches before it counts as not proven
_LEVELS_MAX = 256  # instance-level subschemas written_keys follows before it gives up
_NEVER = (False, {"not": {}})


class Apart:
    """Proofs that no value a oneOf branch is written as satisfies another branch.

    ``apart(a, b)``: every value the converter writes for ``a`` (a branch merged with the
    oneOf's siblings) is invalid under ``b``. The proofs are of two kinds:

    - by validity (exact, both modes): no value is valid under both, by types, listed values
      (each checked with the validator), disjoint bounds or counts, a key one requires that
      the other forbids (``additionalProperties: false``, a property schema ``false``), or a
      required property whose values are apart again;
    - by what strict mode writes (``written_keys``): an object holds its declared properties
      only, so a key ``b`` requires that ``a`` never declares is never written. Spec mode
      writes extra members, so it gets only the first kind.

    ``breakers(a, b)``: the schemas of ``complement(b)`` that can hold beside ``a`` (and
    "requires a key ``b`` forbids"), those that narrow ``a``'s output least first: a
    property ``b`` requires that ``a``'s writer never writes is free.
    """

    def __init__(self, merger: Any, validator_for: Callable[[Any], Any], strict: bool,
                 steps: int = _APART_STEPS) -> None:
        self.merger = merger
        self.validator_for = validator_for
        self.strict = strict
        self.steps_max = steps  # proofs tried for one pair before it counts as not proven
        self._steps = 0
        self._verdicts: dict[tuple, tuple[bool, Any]] = {}  # (id(node), value's JSON) -> (valid, node)

    def _resolve(self, ref: Any) -> Any:
        try:
            return self.merger.resolve(ref, "$")
        except UnsupportedSchemaError:
            return None

    # ------------------------------------------------ the parts of a schema at one level
    def conjuncts(self, schema: Any) -> list[dict] | None:
        """``schema`` and what every value of it satisfies too at the same level (``$ref``
        targets, ``allOf`` parts), as dicts; None when one of them is ``false`` (no value)."""
        out: list[dict] = []
        todo, seen = [(schema, 0)], 0
        while todo:
            node, depth = todo.pop()
            if node is False:
                return None
            if not isinstance(node, dict) or depth > 16 or seen > _LEVELS_MAX:
                continue
            seen += 1
            out.append(node)
            if isinstance(node.get("$ref"), str):
                target = self._resolve(node["$ref"])
                if target is not None:
                    todo.append((target, depth + 1))
            if isinstance(node.get("allOf"), list):
                todo.extend((part, depth + 1) for part in node["allOf"])
        return out

    def levels(self, schema: Any) -> list[dict] | None:
        """Every subschema that applies to the same value as ``schema`` (through ``$ref``,
        ``allOf`` / ``anyOf`` / ``oneOf``, ``not``, ``if`` / ``then`` / ``else``,
        ``dependentSchemas``); None past ``_LEVELS_MAX`` of them."""
        out: list[dict] = []
        todo, seen_ids = [schema], set()
        while todo:
            node = todo.pop()
            if not isinstance(node, dict) or id(node) in seen_ids:
                continue
            if len(out) >= _LEVELS_MAX:
                return None
            seen_ids.add(id(node))
            out.append(node)
            if isinstance(node.get("$ref"), str):
                target = self._resolve(node["$ref"])
                if target is not None:
                    todo.append(target)
            for key in ("allOf", "anyOf", "oneOf"):
                if isinstance(node.get(key), list):
                    todo.extend(node[key])
            for key in ("not", "if", "then", "else"):
                if key in node:
                    todo.append(node[key])
            if isinstance(node.get("dependentSchemas"), dict):
                todo.extend(node["dependentSchemas"].values())
        return out

    def written_keys(self, schema: Any) -> frozenset | None:
        """The keys strict mode may write in an object of ``schema`` (json_schema_parts.object_regex
        writes the declared properties and required ones only, unless there are none, or
        patternProperties / propertyNames / minProperties ask for others); None when unknown.

        Every key any level of the schema names counts (the rewrites of ``not``, ``if``,
        dependencies and oneOf move properties between levels, never invent names); the
        objects are closed when a level every value passes through declares properties (or
        forbids additional ones), since merges carry it into every branch written."""
        if not self.strict:
            return None
        nodes = self.levels(schema)
        always = self.conjuncts(schema)
        if nodes is None or always is None:
            return None if nodes is None else frozenset()
        keys: set[str] = set()
        for node in nodes:
            if node.get("patternProperties") or node.get("propertyNames", True) not in (True, {}):
                return None
            if node.get("minProperties", 0) or node.get("unevaluatedProperties", True) not in (True, {}):
                return None
            for key in ("const", "enum"):
                listed = None if key not in node else [node[key]] if key == "const" else node[key]
                for value in listed if isinstance(listed, list) else []:
                    if isinstance(value, dict):
                        keys.update(value)
            props = node.get("properties", {})
            keys.update(props if isinstance(props, dict) else ())
            for key in ("required",):
                if isinstance(node.get(key), list):
                    keys.update(k for k in node[key] if isinstance(k, str))
            deps = node.get("dependentRequired", {})
            for name, names in deps.items() if isinstance(deps, dict) else ():
                keys.add(name)
                keys.update(n for n in names if isinstance(n, str)) if isinstance(names, list) else None
        if not any(node.get("properties") or node.get("additionalProperties", True) in _NEVER for node in always):
            return None  # a map of free members may be written
        return frozenset(keys)

    # ------------------------------------------------ proofs
    def apart(self, a: Any, b: Any, writer: bool = True, depth: int = 0) -> bool:
        """Whether every value written for ``a`` is invalid under ``b`` (see the class)."""
        if depth == 0:
            self._steps = 0
        self._steps += 1
        if depth > _APART_DEPTH or self._steps > self.steps_max:
            return False
        a_all, b_all = self.conjuncts(a), self.conjuncts(b)
        if a_all is None or b_all is None:
            return True
        if not b_all:
            return False  # b is true (or not a schema): every value
        for node in b_all:  # b's value satisfies one of these branches: apart from each
            for key in ("anyOf", "oneOf"):
                branches = self._possible(node, key)
                if branches is not None and all(self.apart(a, br, writer, depth + 1) for br in branches):
                    return True
        for node in a_all:  # a's value satisfies one of its branches (and the rest of a): each apart
            for key in ("anyOf", "oneOf"):
                branches = self._possible(node, key)
                if branches is not None:
                    others = [_flat(n) for n in a_all if n is not node]
                    mine = {k: v for k, v in _flat(node).items() if k != key}
                    if all(self.apart({"allOf": [*others, mine, br]}, b, False, depth + 1) for br in branches):
                        return True
        common = set(schema_types(self.merger, a) & schema_types(self.merger, b))
        if not common:
            return True
        if self._listed_apart(a, a_all, b, b_all):
            return True
        for t, low, high in (("number", "minimum", "maximum"), ("string", "minLength", "maxLength"),
                             ("array", "minItems", "maxItems"), ("object", "minProperties", "maxProperties")):
            if t in common and _ranges_apart(_range(a_all, low, high), _range(b_all, low, high)):
                common.discard(t)
        if "string" in common and any(patterns_apart(x.get("pattern"), y.get("pattern")) for x in a_all for y in b_all):
            common.discard("string")  # anchored literal prefixes that differ (pattern_prefixes.py)
        if "object" in common and self._objects_apart(a, a_all, b_all, writer, depth):
            common.discard("object")
        if "array" in common and self._arrays_apart(a_all, b_all, depth):
            common.discard("array")
        return not common

    def _arrays_apart(self, a_all: list[dict], b_all: list[dict], depth: int) -> bool:
        """Arrays of one side hold an item (minItems 1) and no item of one is valid under the
        other's ``items`` (bitbucket's artifacts upload: an array of objects or one of strings).
        Only where neither side has ``prefixItems`` (then ``items`` means every item)."""
        if any("prefixItems" in n for n in a_all + b_all):
            return False
        mins = [max((n["minItems"] for n in side if isinstance(n.get("minItems"), (int, float))
                     and not isinstance(n.get("minItems"), bool)), default=0) for side in (a_all, b_all)]
        if max(mins) < 1:
            return False  # [] may be valid under both
        a_items = [n["items"] for n in a_all if "items" in n]
        b_items = [n["items"] for n in b_all if "items" in n]
        if not a_items or not b_items:
            return False
        return self.apart({"allOf": a_items}, {"allOf": b_items}, False, depth + 1)

    def _keeps_tag(self, a_all: list[dict], c: Any) -> bool:
        """Whether breaker ``c`` (a key ``k`` present with a value ``S``) leaves every value ``a``
        may hold at ``k``: ``a`` lists them (const / enum, argo's ``kind: EventBus`` against
        ``EventSource``) and each is valid under ``S``. Merged, it only makes ``k`` present."""
        name = _tag_free(c)
        if name is None:
            return False
        mine = _value_schemas(a_all, name)
        listed = _listed([n for m in mine for n in self.conjuncts(m) or []]) if mine else None
        if not listed:
            return False
        try:
            own, theirs = self.validator_for({"allOf": mine}), self.validator_for(c["properties"][name])
            kept = [v for v in listed if own.is_valid(v)]
            return bool(kept) and all(theirs.is_valid(v) for v in kept)
        except Exception:  # noqa: BLE001 - a schema the validator cannot read proves nothing
            return False

    def _possible(self, node: dict, key: str) -> list | None:
        """The branches of ``node``'s anyOf / oneOf (``key``) a valid value may satisfy: a oneOf's
        repeated ones (``repeated``) never; None when ``node`` has no such list."""
        branches = node.get(key)
        if not isinstance(branches, list) or not branches:
            return None
        if key == "oneOf":
            gone = repeated(branches, self._resolve_strict, self.merger.annotations)
            branches = [b for i, b in enumerate(branches) if i not in gone]
        return branches

    def _resolve_strict(self, ref: Any) -> Any:
        return self.merger.resolve(ref, "$")

    def _listed_apart(self, a: Any, a_all: list[dict], b: Any, b_all: list[dict]) -> bool:
        """A side's values are listed (const / enum of one of its parts) and none is valid under
        both sides (nor under that side alone: two parts listing different values)."""
        for mine, theirs in ((a_all, b_all), (b_all, a_all)):
            listed = _listed(mine)
            if listed is not None:
                try:
                    kept = [v for v in listed if self._valid_all(mine, v)]
                    if not kept or not any(self._valid_all(theirs, v) for v in kept):
                        return True
                except Exception:  # noqa: BLE001 - a schema the validator cannot read proves nothing
                    pass
        return False

    def _valid_all(self, nodes: list[dict], value: Any) -> bool:
        """Whether ``value`` is valid under each of ``nodes`` (``conjuncts``: their ``$ref`` and
        ``allOf`` are nodes of their own, so each is checked without them, but beside unevaluated*,
        which sees what they evaluate). Each node's verdict on a value is kept (the node too, so
        that its id stays its own): an allOf of if / then rules checks the same parts many times."""
        text = json.dumps(value, sort_keys=True)
        for node in nodes:
            key = (id(node), text)
            seen = self._verdicts.get(key)
            if seen is None:
                own = node if any(k in node for k in ("unevaluatedProperties", "unevaluatedItems")) else _flat(node)
                seen = self._verdicts[key] = (self.validator_for(own).is_valid(value), node)
            if not seen[0]:
                return False
        return True

    def _objects_apart(self, a: Any, a_all: list[dict], b_all: list[dict], writer: bool, depth: int) -> bool:
        a_req, b_req = _required(a_all), _required(b_all)
        for mine, theirs in ((a_all, b_req), (b_all, a_req)):  # a key one requires, the other forbids
            for node in mine:
                forbids = closed_forbids(node)
                if any(forbids(k) for k in theirs):
                    return True
        keys = self.written_keys(a) if writer else None
        levels = self.levels(a) if writer else None
        for k in dict.fromkeys(b_req + a_req):  # a key one side requires: its values told apart
            if k in b_req and keys is not None and k not in keys:
                return True  # never written
            mine = _value_schemas(a_all, k)
            if k in b_req and any(v in _NEVER for v in mine):
                return True  # never present
            theirs = _value_schemas(b_all, k)
            if not mine or not theirs:
                continue
            value: Any = {"allOf": mine}
            if keys is not None and levels is not None:  # what the writer may merge into k's value too
                more = _value_schemas([n for n in levels if not any(n is m for m in a_all)], k)
                if more:
                    value = {"allOf": mine, "anyOf": [True, {"allOf": more}]}
            nested = keys is not None
            if any(self.apart(value, v, nested, depth + 1) for v in theirs):
                return True
        return False

    # ------------------------------------------------ narrowing
    def breakers(self, a: Any, b: Any, resolve: Callable[[str], Any]) -> list[Any]:
        """Schemas whose values are all invalid under ``b`` (or, beside ``a``, are) and that may
        hold beside ``a``, those that leave more of ``a``'s output first; one alone when it leaves
        all of it. ``[False]`` where ``b`` takes every value of ``a`` (``ignores``): none fails it."""
        a_all = self.conjuncts(a) or []
        types = schema_types(self.merger, a)
        if self.ignores(b, types):
            return [False]
        a_req = _required(a_all)
        keys = self.written_keys(a)
        out: list[tuple[int, Any]] = []
        for c in complement(b, resolve):
            if not (schema_types(self.merger, c) & types) or self.apart(c, a, writer=False):
                continue  # no value of a is one of c's: a and c would write nothing
            if isinstance(c, dict) and set(c) <= {"type", "properties"} and isinstance(c.get("properties"), dict) \
                    and len(c["properties"]) == 1 and next(iter(c["properties"].values())) is False:
                name = next(iter(c["properties"]))
                if name in a_req:
                    continue
                if keys is not None and name not in keys:
                    if types == {"object"}:
                        return [c]  # the key is never written: nothing is lost
                    out.append((0, c))
                    continue
                out.append((2, c))  # an optional property left out
            elif self._keeps_tag(a_all, c):
                if types == {"object"}:
                    return [c]  # a's own listed value of a key, made present: all else is kept
                out.append((0, c))
            else:
                out.append((1, c))
        if "array" in types:  # arrays that hold an item, where an item tells them apart
            one = {"type": "array", "minItems": 1}
            if self.apart({"allOf": [a, one]}, b, writer=False):
                out.append((0, one))
        if "object" in types:  # b closed: a key a declares that b forbids, made required
            declared = [k for n in a_all if isinstance(n.get("properties"), dict) for k, v in n["properties"].items()
                        if v not in _NEVER]
            for node in self.conjuncts(b) or []:
                forbids = closed_forbids(node)
                for k in dict.fromkeys(declared):
                    if forbids(k):
                        out.append((2, {"type": "object", "required": [k]}))
                        break
                if _holds_only_forbidden(a_all, node, forbids):  # a member at all: one b forbids
                    out.append((2, {"type": "object", "minProperties": 1}))
        out.sort(key=lambda rc: rc[0])
        return _unique([c for _, c in out])


    def ignores(self, schema: Any, types: frozenset[str], depth: int = 0) -> bool:
        """Whether every value of ``types`` is valid under ``schema``: its keywords are annotations,
        keywords of other types (``{"required": [...]}`` of a list), and ``$ref`` / ``allOf`` /
        ``anyOf`` of such schemas. False where unsure."""
        if schema is True:
            return True
        if not isinstance(schema, dict) or depth > _APART_DEPTH:
            return False
        for key, value in schema.items():
            if key == "$ref":
                ok = self.ignores(self._resolve(value), types, depth + 1)
            elif key in ("allOf", "anyOf"):
                each = [self.ignores(p, types, depth + 1) for p in value] if isinstance(value, list) else [False]
                ok = all(each) if key == "allOf" else any(each)
            else:
                family = next((t for t, keys in FAMILIES.items() if key in keys), None)
                ok = key in self.merger.annotations or family is not None and family not in types
            if not ok:
                return False
        return True


def _tag_free(c: Any) -> str | None:
    """The key of a breaker ``{"type": "object", "required": [k], "properties": {k: S}}``, else None."""
    if not (isinstance(c, dict) and set(c) == {"type", "required", "properties"} and c["type"] == "object"
            and isinstance(c["required"], list) and len(c["required"]) == 1 and isinstance(c["properties"], dict)
            and list(c["properties"]) == c["required"]):
        return None
    return c["required"][0]


def _holds_only_forbidden(a_all: list[dict], b_node: dict, forbids: Callable[[str], bool]) -> bool:
    """Whether every key an object of ``a`` can hold is one that ``b_node`` (closed) forbids:
    ``a`` is closed too (``additionalProperties`` false), each name it declares is forbidden, and
    no key its patterns may match (their widest readings) is a name or pattern key of ``b_node``
    (pyrseas' database "schema x" / "language x" members beside its schema's "table x" ones)."""
    if not isinstance(b_node.get("additionalProperties", True), bool) and b_node.get("additionalProperties") != {"not": {}}:
        return False
    if b_node.get("additionalProperties", True) not in _NEVER:
        return False
    closed = [n for n in a_all if n.get("additionalProperties", True) in _NEVER]
    if not closed:
        return False
    node = closed[0]
    props = node.get("properties", {}) if isinstance(node.get("properties", {}), dict) else {}
    if not all(forbids(k) for k, v in props.items() if v not in _NEVER):
        return False
    mine, theirs = node.get("patternProperties", {}), b_node.get("patternProperties", {})
    if not isinstance(mine, dict) or not isinstance(theirs, dict) or not mine:
        return False
    b_props = b_node.get("properties", {}) if isinstance(b_node.get("properties", {}), dict) else {}
    try:
        allowed = [_key_fsm("(?:" + "|".join(re.escape(k) for k in b_props) + ")")] if b_props else []
        allowed += [_key_fsm(key_pattern_bodies(p)[1]) for p in theirs]
        for p in mine:
            keys = _key_fsm(key_pattern_bodies(p)[1])
            if any(not (keys & other).empty() for other in allowed):
                return False
    except (ValueError, re.error, TypeError):  # a pattern no reading is found for: unknown
        return False
    return True


@fsm_crawl.memo(maxsize=256)  # (charged its work on every call: fsm_crawl.memo)
def _key_fsm(body: str) -> Any:
    return interegular.parse_pattern(body).to_fsm()


def closed_forbids(node: Any) -> Callable[[str], bool]:
    """A test of the keys no object valid under ``node`` can hold: with ``additionalProperties:
    false`` every key outside its ``properties`` and ``patternProperties`` (a pattern Python's re
    cannot read may match anything), and any key whose property schema is ``false``."""
    if not isinstance(node, dict):
        return lambda key: False
    props = node.get("properties", {})
    props = props if isinstance(props, dict) else {}
    patterns = node.get("patternProperties", {})
    patterns = list(patterns) if isinstance(patterns, dict) else None
    extra = node.get("additionalProperties", True)
    closed = extra in _NEVER and patterns is not None

    def forbids(key: str) -> bool:
        if props.get(key, True) in _NEVER:
            return True
        if not closed or key in props:
            return False
        for pattern in patterns or ():
            try:
                if re.search(pattern, key):
                    return False
            except re.error:
                return False
        return True

    return forbids


def _value_schemas(nodes: list[dict], key: str) -> list[Any]:
    """The schemas ``nodes`` give a member ``key``: its property schema, or where a node does not
    declare it (and has no patternProperties, which might take it instead) its additionalProperties."""
    out = []
    for node in nodes:
        props = node.get("properties")
        if isinstance(props, dict) and key in props:
            out.append(props[key])
        elif "additionalProperties" in node and not node.get("patternProperties") \
                and node["additionalProperties"] is not True:
            out.append(node["additionalProperties"])
    return out


def _flat(node: dict) -> dict:
    """``node`` without the ``$ref`` / ``allOf`` that ``Apart.conjuncts`` has followed already."""
    return {k: v for k, v in node.items() if k not in ("$ref", "allOf")}


def _required(nodes: list[dict]) -> list[str]:
    out: dict[str, None] = {}
    for node in nodes:
        if isinstance(node.get("required"), list):
            out.update((k, None) for k in node["required"] if isinstance(k, str))
    return list(out)


def _listed(nodes: list[dict]) -> list | None:
    """The shortest list of values some node lists (const / enum): every value of them is one of
    those. None where no node lists values."""
    lists = [[node["const"]] if "const" in node else node["enum"] for node in nodes
             if "const" in node or isinstance(node.get("enum"), list)]
    return min(lists, key=len) if lists else None


def _range(nodes: list[dict], low: str, high: str) -> tuple:
    """(lower, lower exclusive, upper, upper exclusive) every value of ``nodes`` lies in."""
    lo, lo_x, hi, hi_x = -math.inf, False, math.inf, False
    for node in nodes:
        for key, strict in ((low, False), ("exclusiveMinimum", True) if low == "minimum" else (None, False)):
            v = node.get(key) if key else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (v > lo or (v == lo and strict)):
                lo, lo_x = v, strict
        for key, strict in ((high, False), ("exclusiveMaximum", True) if high == "maximum" else (None, False)):
            v = node.get(key) if key else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (v < hi or (v == hi and strict)):
                hi, hi_x = v, strict
    return lo, lo_x, hi, hi_x


def _ranges_apart(a: tuple, b: tuple) -> bool:
    def below(x: tuple, y: tuple) -> bool:  # every value of x lies below every value of y
        return x[2] < y[0] or (x[2] == y[0] and (x[3] or y[1]))
    return below(a, b) or below(b, a)


def _unique(items: list) -> list:
    out, seen = [], set()
    for item in items:
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out

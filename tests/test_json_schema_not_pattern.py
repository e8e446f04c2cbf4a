"""``not: {pattern: P}`` (issue 31: refused as "treadle cannot write the values it excludes").

A string that matches none of the excluded patterns is written as the string's automaton minus
each pattern's widest reading (every raw string Python's ``re`` or ECMA-262 finds a match in):
a subset of the strings ``not`` allows. The same complement breaks a ``oneOf`` branch whose
pattern overlaps another's. Each case is a real schema of the corpus, trimmed (the comment
names it); every random walk must validate under the schema's own draft, and values the
pattern excludes must not be written.
"""
from __future__ import annotations

import pytest
from test_json_schema_oneof import accepted, checker, refused, walks

from treadle.constrained.schema.json_schema import json_schema_to_regex
from treadle.constrained.schema.json_schema_parts import Unsatisfiable

_SPACE = "\t\n\u000b\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

# check-jsonschema/buildkite.json: checkout.sparse.paths, one path or a list of them; a path has
# no comma or line break and neither starts with '-' or a space nor ends with a space
BUILDKITE_SPARSE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {"checkoutSparsePath": {"type": "string", "pattern": "^[^,\\t\\n\\v\\f\\r]+$", "maxLength": 8,
                                           "not": {"pattern": f"^[-{_SPACE}]|[{_SPACE}]$"}}},
    "type": "object", "additionalProperties": False, "required": ["paths"],
    "properties": {"paths": {"anyOf": [{"$ref": "#/definitions/checkoutSparsePath"},
                                       {"type": "array", "items": {"$ref": "#/definitions/checkoutSparsePath"},
                                        "minItems": 1, "maxItems": 2}]}},
}


def test_buildkite_sparse_paths_neither_start_nor_end_with_a_space() -> None:
    rx, values = walks(BUILDKITE_SPARSE, n=200)
    for paths in ("src/", ["src/", "docs/a b"], "a"):
        assert accepted(rx, BUILDKITE_SPARSE, {"paths": paths}), paths
    for paths in (" src", "src ", "-src", ["docs/", "-x"], "a,b"):
        assert not checker(BUILDKITE_SPARSE).is_valid({"paths": paths}) and refused(rx, {"paths": paths}), paths
    assert any(isinstance(v["paths"], str) for v in values) and any(isinstance(v["paths"], list) for v in values)


# check-jsonschema/circle-ci.json: a workflow job's "when" (a logic object, or a string expression
# that names pipeline values without << >>); dependabot.json: a pull-request branch name template
# (minLength 1 and three patterns it must not match, an allOf of nots)
CIRCLE_WHEN = {"type": "object", "additionalProperties": False, "required": ["when"],
               "properties": {"when": {"oneOf": [
                   {"type": "object", "additionalProperties": False, "required": ["and"],
                    "properties": {"and": {"type": "array", "maxItems": 1, "items": {"type": "boolean"}}}},
                   {"type": "string", "maxLength": 6, "not": {"pattern": "<<.*>>"}}]}}}
DEPENDABOT_TEMPLATE = {
    "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
    "required": ["template"],
    "properties": {"template": {"type": "string", "minLength": 1, "maxLength": 5, "allOf": [
        {"description": "Must not contain spaces, ~, ^, :, ?, *, [ or \\.", "not": {"pattern": "[ ~^:?*\\[\\\\]"}},
        {"description": "Must not contain '..'.", "not": {"pattern": "\\.\\."}},
        {"description": "Must not contain '@{'.", "not": {"pattern": "@\\{"}}]}},
}


def test_circle_ci_when_string_without_pipeline_values() -> None:
    rx, values = walks(CIRCLE_WHEN, n=200)
    for when in ("a == b", "<<x", {"and": [True]}):
        assert accepted(rx, CIRCLE_WHEN, {"when": when}), when
    for when in ("<<x>>", "a<<>>b"):
        assert refused(rx, {"when": when}), when
    assert {type(v["when"]) for v in values} == {str, dict}


def test_dependabot_branch_name_template_excludes_three_patterns() -> None:
    rx, values = walks(DEPENDABOT_TEMPLATE, n=200)
    for name in ("a.b", "dep/x", "@x"):
        assert accepted(rx, DEPENDABOT_TEMPLATE, {"template": name}), name
    for name in ("a b", "a..b", "@{x}", "a~", "a\\\\b", ""):
        assert refused(rx, {"template": name}), name


# check-jsonschema/bitbucket-pipelines.json: a custom pipeline imported inline
# ("repo:ref:pipeline") or from a source ("pipeline@source"); the two patterns overlap
# ("a:b:c@d" matches both), so each branch is written where the other's pattern fails
BITBUCKET_IMPORT = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "import_inline_pipeline": {"additionalProperties": False, "required": ["import"], "type": "object",
                                   "properties": {"import": {"pattern": "^[^:]+:[^:]+:[^:]+$", "type": "string"}}},
        "import_source_pipeline": {"additionalProperties": False, "required": ["import"], "type": "object",
                                   "properties": {"import": {"pattern": "^[^@]+@[^@]+$", "type": "string"}}},
    },
    "type": "object", "additionalProperties": {"oneOf": [{"$ref": "#/definitions/import_inline_pipeline"},
                                                         {"$ref": "#/definitions/import_source_pipeline"}]},
    "properties": {"p": {"oneOf": [{"$ref": "#/definitions/import_inline_pipeline"},
                                   {"$ref": "#/definitions/import_source_pipeline"}]}},
    "required": ["p"],
}


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_bitbucket_import_patterns_overlap_each_written_where_the_other_fails(mode: str) -> None:
    rx, values = walks(BITBUCKET_IMPORT, n=200, mode=mode)
    for imported in ("r:main:p", "p@src"):
        assert accepted(rx, BITBUCKET_IMPORT, {"p": {"import": imported}}), imported
    assert not checker(BITBUCKET_IMPORT).is_valid({"p": {"import": "a:b:c@d"}})
    assert refused(rx, {"p": {"import": "a:b:c@d"}})
    assert {"@" in v["p"]["import"] for v in values} == {True, False}


# check-jsonschema/bitbucket-pipelines.json: a step's artifacts' upload, a list of upload objects
# or a list of names (minItems 1 each): arrays told apart by their items' types
BITBUCKET_UPLOAD = {"type": "object", "additionalProperties": False, "required": ["upload"],
                    "properties": {"upload": {"oneOf": [
                        {"items": {"type": "object", "required": ["name"], "additionalProperties": False,
                                   "properties": {"name": {"type": "string", "maxLength": 3}}},
                         "minItems": 1, "maxItems": 2, "type": "array"},
                        {"items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2,
                         "type": "array"}]}}}


@pytest.mark.parametrize("mode", ["strict", "spec"])
def test_bitbucket_upload_arrays_told_apart_by_their_items(mode: str) -> None:
    rx, values = walks(BITBUCKET_UPLOAD, n=150, mode=mode)
    for upload in ([{"name": "a"}], ["a", "b"]):
        assert accepted(rx, BITBUCKET_UPLOAD, {"upload": upload}), upload
    assert {type(v["upload"][0]) for v in values} == {dict, str}


def test_every_string_excluded_is_unsatisfiable() -> None:
    with pytest.raises(Unsatisfiable, match="keyword 'not' at \\$: no output"):
        json_schema_to_regex({"type": "string", "not": {"pattern": ""}})

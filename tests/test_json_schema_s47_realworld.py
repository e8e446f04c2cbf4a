"""Real-world schemas of session 47 (a sweep of JSON Schema files that packages ship, sources
the earlier sweeps did not cover: cyclonedx-python-lib's CycloneDX BOM schemas 1.2-1.7 with
their SPDX and JSF companions, nbformat's notebook schemas, the JupyterLab / Notebook / Jupyter
Server settings and event schemas, ansible-lint's schemas, great-expectations' expectation and
datasource schemas, altair's Vega-Lite schema, cibuildwheel, scikit-build-core, poetry-core,
validate-pyproject, datamodel-code-generator, openapi-schema-validator): what it found wrong,
each failing before its fix. Compile-level: treadle's regex, walked over single bytes, every
finished walk validated by ``jsonschema`` with its format checker (rfc3987 checks the URIs)."""
from __future__ import annotations

import json

import jsonschema
import pytest
from json_checks import byte_walks

from treadle.constrained.schema.json_schema import json_schema_to_regex


def _valid_walks(schema: dict, *, walks: int = 30, least: int = 10, seed: int = 47, mode: str = "strict",
                 rx: str | None = None) -> list:
    """The values of the finished byte walks of ``schema``'s regex (``rx`` where given), each
    valid under it."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    check = cls(schema, format_checker=cls.FORMAT_CHECKER)
    values = []
    for data in byte_walks(rx or json_schema_to_regex(schema, mode=mode), walks, seed=seed, by_state=True):
        if data is not None:
            value = json.loads(data)
            assert check.is_valid(value), data
            values.append(value)
    assert len(values) >= least, values
    return values


# ------------------------------------------- 1. a URN pattern under an IRI format: satisfiable

# cyclonedx-python-lib, cyclonedx/schema/_res/bom-1.6.SNAPSHOT.schema.json (and 1.5, 1.7):
# definitions bomLinkDocumentType / bomLinkElementType / bomLink, trimmed (title, description)
UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
BOM_LINK = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "bomLinkDocumentType": {"type": "string", "format": "iri-reference",
                                "pattern": f"^urn:cdx:{UUID}/[1-9][0-9]*$"},
        "bomLinkElementType": {"type": "string", "format": "iri-reference",
                               "pattern": f"^urn:cdx:{UUID}/[1-9][0-9]*#.+$"},
        "bomLink": {"anyOf": [{"$ref": "#/definitions/bomLinkDocumentType"},
                              {"$ref": "#/definitions/bomLinkElementType"}]},
    },
    "type": "object",
    "properties": {"ref": {"$ref": "#/definitions/bomLink"}},
    "required": ["ref"],
    "additionalProperties": False,
}


def test_a_urn_pattern_under_a_uri_format_is_written():
    """(before: a 400 "keyword 'pattern' ...: no 'iri-reference' string matches it": the URI
    subset treadle writes has an authority, ``scheme://host``, and a URN has none; in a schema
    where the bomLink is optional, its branches were left out silently.) Now the URIs with no
    authority are tried where the usual subset meets no string of the pattern."""
    rx = json_schema_to_regex(BOM_LINK)
    refs = [v["ref"] for v in _valid_walks(BOM_LINK, rx=rx)]
    assert all(r.startswith("urn:cdx:") for r in refs), refs
    assert any("#" in r for r in refs) and any("#" not in r for r in refs), refs
    # the URN's fixed "urn:cdx:<uuid>/" written once, not in each branch of the rest (7,356
    # chars, which CycloneDX 1.5's many bomLink uses took past the compiler's size cap)
    assert len(rx) < 3000
    element = BOM_LINK["definitions"]["bomLinkElementType"]
    assert json_schema_to_regex({**element, "format": "uri"})  # as an absolute URI too
    with pytest.raises(ValueError, match="no 'uri' string matches it"):  # one no URI matches: still refused
        json_schema_to_regex({"type": "string", "format": "uri", "pattern": "^a b$"})


# ------------------------- 2. a oneOf of a long name list and a pattern: the rest of the pattern

# ansible-lint, ansiblelint/schemas/ansible-lint-config.json: properties.rules (its $defs/rule
# inlined): a key is a rule id, "oneOf" the listed ones or any of the pattern; every listed id
# matches the pattern too, so the keys valid under exactly one branch are the pattern's others
RULE_IDS = """command-instead-of-module command-instead-of-shell deprecated-bare-vars deprecated-local-action
deprecated-module empty-string-compare fqcn fqcn[action-core] fqcn[action] fqcn[canonical] fqcn[keyword] galaxy
galaxy[no-changelog] galaxy[no-runtime] galaxy[tags] galaxy[version-incorrect] galaxy[version-missing]
ignore-errors inline-env-var internal-error jinja jinja[invalid] jinja[spacing] key-order latest literal-compare
load-failure load-failure[not-found] loop-var-prefix loop-var-prefix[missing] loop-var-prefix[wrong]
meta-incorrect meta-no-tags meta-runtime meta-video-links name name[casing] name[play] name[prefix] name[template]
no-changed-when no-handler no-jinja-when no-log-password no-prompting no-relative-paths no-same-owner no-tabs
only-builtins package-latest parser-error partial-become playbook-extension risky-file-permissions risky-octal
risky-shell-pipe role-name run-once run-once[play] run-once[task] sanity sanity[bad-ignore]
sanity[cannot-ignore] schema syntax-check var-naming yaml""".split()
RULES = {
    "$schema": "http://json-schema.org/draft-07/schema",
    "type": "object",
    "title": "Rules specific configuration.",
    "additionalProperties": {"type": "object", "additionalProperties": False,
                             "properties": {"exclude_paths": {"type": "array", "items": {"type": "string"}}}},
    "propertyNames": {"oneOf": [{"type": "string", "enum": RULE_IDS},
                                {"type": "string", "pattern": "^[a-z0-9-\\[\\]]+$"}]},
}


def test_a_oneof_of_listed_names_and_a_pattern_writes_the_patterns_others_in_strict_mode():
    """(before: a 400 "keyword 'not' at $.propertyNames.oneOf[1] is not supported: its automaton
    written back as a regex would exceed 20000 characters": the pattern's names less the 67
    listed ones.) Strict mode writes a subset: the pattern's names longer than every listed one."""
    keys = [k for v in _valid_walks(RULES, walks=20, least=8) for k in v]
    assert keys and not set(keys) & set(RULE_IDS), keys


def test_that_oneof_is_refused_in_spec_mode_never_written_without_its_keys():
    """(before: spec mode took the branch it could not write for one with no value, called the
    oneOf unsatisfiable and wrote the object with no keys, ``{}`` only, silently.) It is a 400
    naming the oneOf and the branch."""
    with pytest.raises(ValueError) as e:
        json_schema_to_regex(RULES, mode="spec")
    msg = str(e.value)
    assert "keyword 'oneOf' at $.propertyNames.oneOf[1]" in msg and "67 values" in msg, msg


# ------------------------------- 3. a oneOf of strings told apart by their patterns' prefixes

# cibuildwheel, cibuildwheel/resources/cibuildwheel.schema.json: properties.build-frontend
# (title, description and default dropped)
FRONTENDS = ["pip", "build", "build[uv]", "uv", "pyodide-build"]
BUILD_FRONTEND = {"oneOf": [
    {"enum": [*FRONTENDS, "default"]},
    {"type": "string", "pattern": "^pip; ?args:"},
    {"type": "string", "pattern": "^build; ?args:"},
    {"type": "string", "pattern": "^build\\[uv\\]; ?args:"},
    {"type": "string", "pattern": "^uv; ?args:"},
    {"type": "string", "pattern": "^pyodide-build; ?args:"},
    {"type": "object", "additionalProperties": False, "required": ["name"],
     "properties": {"name": {"enum": FRONTENDS}, "args": {"type": "array", "items": {"type": "string"}}}},
]}


def test_strings_whose_patterns_start_apart_are_exclusive_in_spec_mode():
    """(before: spec mode, a 400 "keyword 'oneOf' at $ is not supported: branch 1 may overlap an
    earlier branch": each pattern branch was written where each other one fails, 2^5
    combinations past the cap.) A string starting "pip;" starts with no "build;": apart."""
    values = _valid_walks(BUILD_FRONTEND, walks=60, least=30, mode="spec")
    strings = [v for v in values if isinstance(v, str)]
    assert any(";" in v for v in strings) and any(v in FRONTENDS for v in strings), values
    assert any(isinstance(v, dict) for v in values), values


# ------------------------------- 4. the regexes one translation builds, all together, are bounded

def _layered(depth: int) -> dict:
    """Objects of two members of the level below, ``depth`` levels: each level's regex copies
    the one below twice (Vega-Lite's layers of layers of views, in small)."""
    defs = {"l0": {"type": "object", "properties": {f"p{i}": {"enum": ["a", "b"]} for i in range(4)},
                   "required": ["p0"]}}
    for k in range(1, depth + 1):
        defs[f"l{k}"] = {"type": "object", "required": ["q0"],
                         "properties": {f"q{j}": {"$ref": f"#/$defs/l{k - 1}"} for j in range(2)}}
    return {"$defs": defs, "$ref": f"#/$defs/l{depth}"}


def test_a_translation_stops_once_its_regexes_together_pass_the_budget(monkeypatch):
    """(before: no bound on the text all subschemas' regexes build together, only on one
    subschema's: altair's vega-lite-schema.json, its top-level specs, built 800 million chars in
    34 s and ran out of the compile worker's 4 GiB at 45 to 56 s; now a 400 naming the budget at
    about 4 s.) Here with the budget lowered: a schema that builds past it is refused naming it;
    one below it is written."""
    from treadle.constrained.schema import json_schema

    monkeypatch.setattr(json_schema, "MAX_BUILT_CHARS", 100_000, raising=False)
    with pytest.raises(ValueError) as e:
        json_schema_to_regex(_layered(10))  # builds ~540,000 chars for a 108,000-char regex
    assert "regexes together pass 100,000 chars" in str(e.value), str(e.value)
    assert json_schema_to_regex(_layered(6))


# --------------------- 5. a oneOf of required sets: breakers a branch's values never take go

# ansible-lint, ansiblelint/schemas/rulebook.json: $defs.throttle (its three duration patterns
# shortened to one unit)
DURATION = {"type": "string", "pattern": "^\\d+\\s(seconds?|minutes?)$"}
THROTTLE = {
    "type": "object",
    "oneOf": [{"required": ["once_within", "group_by_attributes"]},
              {"required": ["once_after", "group_by_attributes"]},
              {"required": ["accumulate_within", "threshold", "group_by_attributes"]}],
    "properties": {"once_within": DURATION, "once_after": DURATION, "accumulate_within": DURATION,
                   "threshold": {"type": "integer", "minimum": 1},
                   "group_by_attributes": {"type": "array", "items": {"type": "string"}}},
    "additionalProperties": False,
}


def test_a_oneof_of_required_sets_with_a_common_key_is_written_in_spec_mode():
    """(before: spec mode, a 400 "keyword 'oneOf' at $ is not supported: branch 1 may overlap":
    each branch was written where the others fail, one of their complements each, "a key it
    requires absent", 2 x 3 combinations past the cap of 4, though "group_by_attributes absent"
    fails every branch itself.) A way to fail that no value of the branch takes is left out."""
    values = _valid_walks(THROTTLE, walks=40, least=15, mode="spec")
    firsts = {next(iter(v)) for v in values}
    assert len(firsts) >= 2, values

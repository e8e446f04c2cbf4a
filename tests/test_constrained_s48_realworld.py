"""Inputs that users send, swept in session 48 (written from what zod 4, the web's validators,
OpenAI tool callers and llama.cpp grammar authors produce): what treadle got wrong, each case
failing before its fix. Compile-level: treadle's regex walked over single bytes (tests/
json_checks.byte_walks), each finished walk validated by ``jsonschema`` with its format checker."""
from __future__ import annotations

import json
import re

import interegular
import jsonschema
import pytest
from json_checks import byte_walks

from treadle.constrained.regex import regex_text as text
from treadle.constrained.schema.json_schema import json_schema_to_regex


def _valid_walks(schema: dict, *, walks: int = 30, least: int = 10, seed: int = 48) -> list:
    """The values of the finished byte walks of ``schema``'s regex, each valid under it."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    check = cls(schema, format_checker=cls.FORMAT_CHECKER)
    values = []
    for data in byte_walks(json_schema_to_regex(schema), walks, seed=seed, by_state=True):
        if data is not None:
            value = json.loads(data)
            assert check.is_valid(value), data
            values.append(value)
    assert len(values) >= least, values
    return values


# ------------------------------- 1. an address pattern beside format email / hostname: served

# the web's most copied address pattern; zod 4's z.email() (its toJSONSchema writes the pattern
# beside format "email"); ajv-formats' "email" as a pattern; a host name of a letters-only TLD
WEB_EMAIL = r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$"
ZOD4_EMAIL = r"^(?!\.)(?!.*\.\.)([A-Za-z0-9_'+\-\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\-]*\.)+[A-Za-z]{2,}$"
AJV_EMAIL = (r"^[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[a-z0-9](?:[a-z0-9-]{0,61}"
             r"[a-z0-9])?\.)+[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


@pytest.mark.parametrize("fmt,pattern", [
    ("email", WEB_EMAIL), ("idn-email", WEB_EMAIL), ("email", ZOD4_EMAIL), ("email", AJV_EMAIL),
    ("hostname", r"^([a-z0-9]+(-[a-z0-9]+)*\.)+[a-z]{2,}$"),
])
def test_an_address_pattern_beside_its_format_is_served(fmt, pattern):
    """(before: a 400 "keyword 'pattern' ... together with format 'email' is not supported: its
    automaton written back as a regex would exceed 20000 characters": the format's subset counts
    each label's characters, and a pattern whose last label is letters only makes their product
    too long to write.) Now a narrower subset of the format is tried, one ending in a top-level
    domain of letters (then a lowercase one), which lies inside these patterns."""
    schema = {"type": "object", "properties": {"to": {"type": "string", "format": fmt, "pattern": pattern}},
              "required": ["to"], "additionalProperties": False}
    values = [v["to"] for v in _valid_walks(schema)]
    assert all(v.rsplit(".", 1)[1].isalpha() for v in values), values


def test_the_narrower_format_subsets_lie_inside_the_formats():
    for fmt, narrow in text.NARROW_FORMATS.items():
        wide = interegular.parse_pattern(text.FORMATS[fmt]).to_fsm()
        for rx in narrow:
            assert (interegular.parse_pattern(rx).to_fsm() - wide).empty(), (fmt, rx)


# ------------------------- 2. a URI format under a pattern of one scheme: mailto:, urn:, s3://, data:

@pytest.mark.parametrize("fmt,pattern,starts", [
    ("uri", r"^mailto:", "mailto:"),  # (before: 400 "would exceed 20000 characters")
    ("iri", r"^urn:", "urn:"),  # (the same)
    ("uri", r"^s3://[a-z0-9.-]+(/.*)?$", "s3://"),  # (the same: the subset's host has capitals)
    ("uri", r"^data:image/(png|jpeg);base64,", "data:image/"),  # (before: 400 "no 'uri' string matches it")
])
def test_a_uri_format_under_a_pattern_of_one_scheme_is_served(fmt, pattern, starts):
    """A pattern that fixes the scheme: its URIs are written, without an authority for a scheme
    that has none (``mailto:a@b.org``, not ``mailto://host``); where the usual subset's product
    with the pattern is too long to write, narrower URIs of the scheme inside the pattern; a
    ``data:`` URI's ``;base64,`` with the sub-delimiters its path may hold."""
    schema = {"type": "array", "items": {"type": "string", "format": fmt, "pattern": pattern}, "minItems": 1}
    values = [s for v in _valid_walks(schema, walks=20, least=8) for s in v]
    assert all(s.startswith(starts) for s in values), values
    if starts in ("mailto:", "urn:"):
        assert not any(s.startswith(starts + "//") for s in values), values


# ---------------------------------- 3. llama.cpp's token references in a GBNF grammar: named

@pytest.mark.parametrize("grammar,token,where", [
    ('root ::= <think> [^<]* </think> answer\nanswer ::= "yes" | "no"', "<think>", "line 1 col 10"),
    ('root ::= "a"\n  <[151643]>', "<[151643]>", "line 2 col 3"),
    ('root ::= !<[151645]>* "."', "!<[151645]>", "line 1 col 10"),
])
def test_llamacpp_token_references_are_refused_by_name(grammar, token, where):
    """llama.cpp's grammars may name a token of the vocabulary (``<think>``, ``<[id]>``, ``!<[id]>``
    for any other token); treadle constrains text, so the grammar is refused, naming the construct
    where it is (it was "unexpected '<'")."""
    from treadle.constrained.ebnf.ebnf import EbnfError, ebnf_to_regex

    with pytest.raises(EbnfError, match=rf"{where}: llama.cpp's token reference '{re.escape(token)}' is not supported"):
        ebnf_to_regex(grammar)
    with pytest.raises(EbnfError, match=r"unexpected '<'"):  # a bare '<' is still just unexpected
        ebnf_to_regex('root ::= "a" < "b"')


# ------------------- 4. a host name pattern's length lookahead with an optional dot: read as lengths

# zod 4's z.hostname() (toJSONSchema writes it as the pattern, beside format "hostname")
ZOD4_HOSTNAME = (r"^(?=.{1,253}\.?$)[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
                 r"(?:\.[a-zA-Z0-9](?:[-0-9a-zA-Z]{0,61}[0-9a-zA-Z])?)*\.?$")


@pytest.mark.parametrize("extra", [{}, {"format": "hostname"}])
def test_a_length_lookahead_with_an_optional_dot_is_read_as_lengths(extra):
    """(before: a 400 "pattern: its automaton of 2721 states would exceed 400 to write": the
    lookahead ``(?=.{1,253}\\.?$)`` was built as an automaton beside the rest.) Its strings of
    1..253 characters all pass it, so it is read as those lengths, as ``(?=.{1,253}$)`` is."""
    values = _valid_walks({"type": "string", "pattern": ZOD4_HOSTNAME, **extra}, walks=20, least=8)
    assert all(1 <= len(v) <= 253 for v in values), values


# --------------- 5. a scheme pattern beside a URI format under lengths (Pydantic's HttpUrl): served

def test_a_scheme_pattern_beside_a_uri_format_under_lengths_is_served():
    """Pydantic's HttpUrl with ``Field(pattern="^https://")``: format uri, 1..2083 characters.
    (before: a 400 after 3 s, "an automaton the schema needs passes 100,000 states": the
    scheme's URIs were taken whole only with no lengths, so the format's product with the
    pattern and the lengths was built.) Now the scheme's URIs of bounded length (as the
    format's own under a maxLength) are checked inside the pattern and fitted to the lengths."""
    schema = {"type": "string", "format": "uri", "pattern": "^https://", "minLength": 1, "maxLength": 2083}
    values = _valid_walks(schema, walks=20, least=8)
    assert all(v.startswith("https://") and len(v) <= 2083 for v in values), values


# ------------- 6. a domain suffix pattern beside format hostname / email: the suffix after a stem

@pytest.mark.parametrize("fmt,pattern,ends", [
    ("hostname", r"\.com$", ".com"),
    ("hostname", r"^([a-z0-9-]+\.)*example\.com$", "example.com"),
    ("email", r"\.edu$", ".edu"),  # a student address
    ("email", r"(^|\.)example\.com$", ".example.com"),  # an address at a subdomain
])
def test_a_domain_suffix_pattern_beside_its_format_is_served(fmt, pattern, ends):
    """(before: a 400 "... together with format 'hostname' is not supported: its automaton
    written back as a regex would exceed 20000 characters".) The text every string of the
    pattern ends with is written after a stem of the format (labels, an address's local part
    and '@'), where the format's subset and the pattern both hold every such string."""
    values = _valid_walks({"type": "string", "format": fmt, "pattern": pattern}, walks=20, least=8)
    assert all(v.endswith(ends) for v in values), values
